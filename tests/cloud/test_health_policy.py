"""The failure-detection policy: pure, configurable, and gentle with application-level XIDs."""

from datetime import UTC, datetime, timedelta

import pytest

from cloud.health import Action, FailurePolicy, counted_xids, evaluate_gpu, evaluate_port, heartbeat_state, strongest

POLICY = FailurePolicy()
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("seconds, state", [(0, "ok"), (19.9, "ok"), (20, "suspect"), (29.9, "suspect"),
                                            (30, "faulty")])
def test_missed_heartbeats_make_a_node_suspect_then_faulty(seconds, state):
    assert heartbeat_state(T0, T0 + timedelta(seconds=seconds), POLICY) == state


def test_a_node_never_seen_is_not_judged_by_heartbeats():
    assert heartbeat_state(None, T0, POLICY) == "ok"


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_level_xids_take_nothing_out(xid):
    assert evaluate_gpu(sample={"xids": [xid]}, previous=None, recent_xids=0, policy=POLICY) == []


@pytest.mark.parametrize("xid, action", [(48, Action.RESET_GPU), (94, Action.RESET_GPU), (74, Action.DRAIN_NODE),
                                         (79, Action.FAULTY), (64, Action.FAULTY), (999, Action.RESET_GPU)])
def test_hardware_xids_map_to_their_action(xid, action):
    finding = strongest(evaluate_gpu(sample={"xids": [xid]}, previous=None, recent_xids=0, policy=POLICY))
    assert finding.action == action and finding.cause == f"xid_{xid}"


def test_repeated_xids_escalate_but_ignored_ones_never_count():
    assert strongest(evaluate_gpu(sample={"xids": [48]}, previous=None, recent_xids=2, policy=POLICY)).cause == \
        "repeated_xids"
    assert evaluate_gpu(sample={"xids": [13, 13, 13]}, previous=None, recent_xids=5, policy=POLICY) == []


def test_new_uncorrectable_ecc_errors_and_heat_are_findings():
    causes = {f.cause for f in evaluate_gpu(sample={"ecc_uncorrected": 3, "temperature_c": 95},
                                            previous={"ecc_uncorrected": 1}, recent_xids=0, policy=POLICY)}
    assert causes == {"uncorrectable_ecc", "over_temperature"}
    assert evaluate_gpu(sample={"ecc_uncorrected": 3, "temperature_c": 60}, previous={"ecc_uncorrected": 3},
                        recent_xids=0, policy=POLICY) == []


def test_nvlink_links_down_are_a_finding_and_a_gpu_without_nvlink_is_not():
    [finding] = evaluate_gpu(sample={"nvlink_up": 16, "nvlink_total": 18}, previous=None, recent_xids=0,
                             policy=POLICY)
    assert (finding.cause, finding.action, finding.summary) == ("nvlink_down", Action.DRAIN_NODE,
                                                                "2 of 18 NVLink links down")
    for links in ({"nvlink_up": 18, "nvlink_total": 18}, {"nvlink_up": None, "nvlink_total": None}, {}):
        assert evaluate_gpu(sample=links, previous=None, recent_xids=0, policy=POLICY) == []
    policy = FailurePolicy.from_mapping({"nvlink_down_action": "faulty"})
    assert evaluate_gpu(sample={"nvlink_up": 0, "nvlink_total": 18}, previous=None, recent_xids=0,
                        policy=policy)[0].action == Action.FAULTY


def test_ports_down_or_flapping():
    assert evaluate_port(link="up", changes_in_window=0, policy=POLICY) is None
    assert evaluate_port(link="down", changes_in_window=1, policy=POLICY).cause == "port_down"
    assert evaluate_port(link="up", changes_in_window=4, policy=POLICY).cause == "port_flapping"


def test_the_policy_is_configuration():
    policy = FailurePolicy.from_mapping({"xid_actions": {"13": "faulty", "79": "ignore"}, "suspect_after_misses": 2,
                                         "max_temperature_c": 80}, heartbeat_interval_s=5)
    assert policy.xid_actions[13] == Action.FAULTY and policy.xid_actions[79] == Action.IGNORE
    assert heartbeat_state(T0, T0 + timedelta(seconds=10), policy) == "suspect"
    with pytest.raises(ValueError, match="unknown failure policy keys: colour"):
        FailurePolicy.from_mapping({"colour": "red"})
    with pytest.raises(ValueError, match="unknown action"):
        FailurePolicy.from_mapping({"xid_actions": {"48": "panic"}})
    with pytest.raises(ValueError, match="suspect_after_misses"):
        FailurePolicy(suspect_after_misses=5, faulty_after_misses=2)


def test_only_xids_the_policy_does_not_ignore_count_towards_repeats():
    assert counted_xids([13, 31, 48, 79, 999], POLICY) == 3
    assert counted_xids(None, POLICY) == 0


def test_escalations_are_configuration_too():
    policy = FailurePolicy.from_mapping({"reset_failed_action": "drain_node", "bmc_critical_action": "drain_node",
                                         "power_lost_action": "ignore"})
    assert policy.reset_failed_action == Action.DRAIN_NODE and policy.bmc_critical_action == Action.DRAIN_NODE
    assert policy.power_lost_action == Action.IGNORE
    assert POLICY.reset_failed_action == Action.FAULTY
    # A server read as off may be the tenant's own poweroff: drained (not sold again), never failed.
    assert POLICY.power_lost_action == Action.DRAIN_NODE
