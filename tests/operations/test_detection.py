"""
Failure detection (operations.detection) on the real heartbeat path: a node whose agent falls silent
is suspect after 3 periods and replaced once faulty; an application-level XID does nothing, a
fatal one fails the GPU and moves the work; a GPU that recovers after its reset returns to
service. Every detection opens one incident and tells the affected tenant, and no other.
"""

import types
from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from cloud.models import GPU, Node
from cloud.services import node_maintenance_end, node_transition
from cloud.telemetry import Ingested, PortReading
from operations.detection import (
    DRAIN,
    GPU_RESET,
    MASS_SILENCE,
    SUSPECT,
    failure_policy,
    judge_bmc,
    judge_samples,
)
from operations.heartbeats import watch_heartbeats
from operations.node_api.agents import command_answered, heartbeat
from provisioning.agent.agent import Agent
from provisioning.agent.nvml import SimulatedGPU, SimulatedNVML
from provisioning.agents.commands import commands_take
from provisioning.capacity import SELLABLE_HEALTH
from provisioning.lifecycle import tick as ticking
from provisioning.lifecycle.replacement import NODE_FAILURE
from provisioning.models import AgentCommand, AgentState, Allocation, Reservation
from provisioning.services import reservation_release
from security.models import Incident
from tenants.models import Notification
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import reservation
from tests.provisioning.test_replacement import activate, active_instance
from tests.world import small_fleet, vm_offering

PERIOD = 10.0


@pytest.fixture
def fleet(world):
    """small_fleet(8): bare metal n0000-n0005 (n0003 the spare), shared hosts n0006-n0007."""
    Reservation.objects.all().delete()  # the world's own queued work would compete
    return small_fleet(8)


@pytest.fixture(autouse=True)
def _policy(settings):
    settings.MERIDIAN_AGENT_INTERVAL = PERIOD
    settings.MERIDIAN_FAILURE_POLICY = {}
    # Rounds here come at the moments each test names, far apart: not the watchdog's own stall
    # (tests/operations/test_liveness_watch.py tests that).
    settings.MERIDIAN_WATCHDOG_SECONDS = 60.0


def beat(node: Node, at, *, samples=None, ports=None) -> None:
    with time_machine.travel(at, tick=False):
        heartbeat(node=node, agent_version="1", gpus=[], samples=samples, ports=ports, now=at)


def watch(at) -> dict:
    with time_machine.travel(at, tick=False):
        return watch_heartbeats(now=at)


def sample(gpu: GPU, **readings) -> dict:
    return {"uuid": gpu.uuid, "xids": [], **readings}


def vm_on_host(world, steps):
    """An active 1-GPU VM of tenant t1: (reservation id, its host, its GPU)."""
    pk = activate(world, steps, vm_offering(1), gpus=1)
    instance = active_instance(pk)
    return pk, instance.node, GPU.objects.get(pk=instance.devices[0]["gpu_id"])


def told(world, side: str, kind: str) -> int:
    return Notification.objects.filter(tenant=getattr(world, side).tenant, kind=kind).count()


#
# Heartbeats
#


def test_a_silent_node_is_suspect_after_2_periods_then_failed_after_3_and_its_work_replaced(world, fleet, steps):
    pk, host, _ = vm_on_host(world, steps)
    t0 = timezone.now()
    beat(host, t0)
    assert watch(t0 + timedelta(seconds=2 * PERIOD - 0.1))["suspect"] == 0
    assert watch(t0 + timedelta(seconds=2 * PERIOD))["suspect"] == 1
    host.refresh_from_db()
    assert host.state == "suspect"
    suspicion = Incident.objects.get(kind=SUSPECT, tenant_id__isnull=True)
    assert suspicion.impact_started_at == t0 and suspicion.time_to_detect_s == pytest.approx(2 * PERIOD)
    assert Incident.objects.filter(kind=SUSPECT, tenant_id=world.t1.tenant.pk, reservation_id=pk).count() == 1
    assert told(world, "t1", "node.suspect") == 1 and told(world, "t2", "node.suspect") == 0
    watch(t0 + timedelta(seconds=2.5 * PERIOD))  # still suspect: nothing opens twice
    assert Incident.objects.filter(kind=SUSPECT).count() == 2

    assert watch(t0 + timedelta(seconds=3 * PERIOD - 0.1))["failed"] == 0
    assert watch(t0 + timedelta(seconds=3 * PERIOD))["failed"] == 1
    host.refresh_from_db()
    assert host.state == "faulty"
    failure = Incident.objects.get(kind=NODE_FAILURE, reservation_id=pk)
    assert failure.impact_started_at == t0 and failure.time_to_detect_s == pytest.approx(3 * PERIOD)
    assert failure.evidence["cause"] == "heartbeat_lost"
    assert not Incident.objects.filter(kind=SUSPECT, resolved_at__isnull=True).exists()
    steps.run()
    assert reservation(pk).state == "active" and active_instance(pk).node_id != host.pk


def test_an_agent_heard_again_brings_its_suspect_node_back(world, fleet, steps):
    pk, host, _ = vm_on_host(world, steps)
    t0 = timezone.now()
    beat(host, t0)
    watch(t0 + timedelta(seconds=2.5 * PERIOD))
    beat(host, t0 + timedelta(seconds=2.6 * PERIOD))
    assert watch(t0 + timedelta(seconds=2.7 * PERIOD))["back"] == 1
    host.refresh_from_db()
    assert host.state == "in_service"
    assert not Incident.objects.filter(kind=SUSPECT, resolved_at__isnull=True).exists()
    assert Incident.objects.get(kind=SUSPECT, reservation_id=pk).restored_at is not None
    assert told(world, "t1", "node.back") == 1
    assert reservation(pk).state == "active" and not Incident.objects.filter(kind=NODE_FAILURE).exists()


def test_nodes_without_an_agent_or_back_from_a_tenant_are_not_judged_on_stale_heartbeats(world, fleet):
    node = Node.objects.filter(pool="bare_metal", state="available", is_spare=False).first()
    idle = Node.objects.exclude(pk=node.pk).filter(pool="bare_metal", state="available").first()
    AgentState.objects.create(node=node, last_seen_at=timezone.now() - timedelta(hours=2))
    Node.objects.filter(pk=node.pk).update(state_changed_at=timezone.now())  # just cleaned after a tenant
    report = watch(timezone.now() + timedelta(seconds=PERIOD))
    assert report["suspect"] == 0 and report["failed"] == 0
    idle.refresh_from_db()
    assert idle.state == "available"


#
# XIDs
#


def test_an_application_xid_does_nothing_and_costs_no_query(world, fleet, steps):
    pk, host, gpu = vm_on_host(world, steps)
    t0 = timezone.now()
    beat(host, t0, samples=[sample(gpu)])
    with CaptureQueriesContext(connection) as clean:
        beat(host, t0 + timedelta(seconds=10), samples=[sample(gpu)])
    with CaptureQueriesContext(connection) as xid13:
        beat(host, t0 + timedelta(seconds=20), samples=[sample(gpu, xids=[13, 31, 43])])
    assert len(xid13.captured_queries) == len(clean.captured_queries)
    gpu.refresh_from_db()
    assert gpu.health == "healthy" and gpu.state == "allocated"
    assert not Incident.objects.exists() and not AgentCommand.objects.filter(kind="reset_gpu").exists()
    assert told(world, "t1", "gpu.reset") == 0


def test_a_fatal_xid_fails_the_gpu_and_moves_the_work_on_it(world, fleet, steps):
    pk, host, gpu = vm_on_host(world, steps)
    beat(host, timezone.now(), samples=[sample(gpu, xids=[79])])
    gpu.refresh_from_db()
    host.refresh_from_db()
    assert gpu.health == "failed" and gpu.state == "quarantined"
    assert host.state == "in_service"  # a shared host goes on: only that GPU failed
    failure = Incident.objects.get(kind=NODE_FAILURE, reservation_id=pk)
    assert failure.evidence["cause"] == "xid_79" and failure.gpu_ids == [str(gpu.pk)]
    assert not AgentCommand.objects.filter(kind="reset_gpu").exists()
    steps.run()
    assert reservation(pk).state == "active"
    assert active_instance(pk).devices[0]["gpu_id"] != str(gpu.pk)


def test_a_fatal_xid_on_a_bare_metal_server_fails_the_server(world, fleet):
    node = Node.objects.filter(pool="bare_metal", state="available", is_spare=False).first()
    gpu = node.gpus.first()
    beat(node, timezone.now(), samples=[sample(gpu, xids=[79])])
    node.refresh_from_db()
    assert node.state == "faulty"
    assert Incident.objects.filter(kind=NODE_FAILURE, node_id=node.pk, tenant_id__isnull=True).count() == 1


def reset_and_answer(host: Node, *, ok: bool, detail: str = "") -> AgentCommand:
    [command] = [c for c in commands_take(node=host) if c.kind == "reset_gpu"]
    return command_answered(node=host, command_id=command.pk, ok=ok, result={"ok": ok, "detail": detail})


def test_a_gpu_reset_after_xid_48_returns_to_service_once_a_sample_is_clean(world, fleet, steps):
    pk, host, gpu = vm_on_host(world, steps)
    t0 = timezone.now()
    beat(host, t0, samples=[sample(gpu, xids=[48])])
    gpu.refresh_from_db()
    assert gpu.health == "failed" and gpu.state == "allocated"  # the tenant's still; never sold meanwhile
    platform = Incident.objects.get(kind=GPU_RESET, tenant_id__isnull=True)
    assert platform.gpu_ids == [str(gpu.pk)] and platform.evidence["cause"] == "xid_48"
    tenant = Incident.objects.get(kind=GPU_RESET, tenant_id=world.t1.tenant.pk)
    assert tenant.reservation_id == reservation(pk).pk
    assert told(world, "t1", "gpu.reset") == 1 and told(world, "t2", "gpu.reset") == 0
    command = AgentCommand.objects.get(kind="reset_gpu", node=host)
    assert command.payload["index"] == gpu.index

    beat(host, t0 + timedelta(seconds=10), samples=[sample(gpu, xids=[48])])  # before the reset: nothing twice
    assert Incident.objects.filter(kind=GPU_RESET).count() == 2
    assert AgentCommand.objects.filter(kind="reset_gpu").count() == 1
    reset_and_answer(host, ok=True)
    assert watch(t0 + timedelta(seconds=15))["gpus_back"] == 0  # no sample since the reset yet
    beat(host, t0 + timedelta(seconds=20), samples=[sample(gpu, temperature_c=40)])
    assert watch(t0 + timedelta(seconds=21))["gpus_back"] == 1
    gpu.refresh_from_db()
    assert gpu.health == "healthy" and gpu.state == "allocated"
    assert not Incident.objects.filter(kind=GPU_RESET, resolved_at__isnull=True).exists()
    assert Incident.objects.get(pk=tenant.pk).restored_at is not None
    assert told(world, "t1", "gpu.back") == 1
    assert reservation(pk).state == "active" and active_instance(pk).devices[0]["gpu_id"] == str(gpu.pk)


def test_an_idle_gpu_is_held_during_its_reset_and_sold_again_after(world, fleet):
    host = Node.objects.filter(pool="shared").first()
    gpu = host.gpus.order_by("index").first()
    t0 = timezone.now()
    beat(host, t0, samples=[sample(gpu, xids=[94])])
    gpu.refresh_from_db()
    assert (gpu.state, gpu.health) == ("quarantined", "failed")
    assert not Incident.objects.filter(tenant_id__isnull=False).exists()  # nobody's work was on it
    reset_and_answer(host, ok=True)
    beat(host, t0 + timedelta(seconds=10), samples=[sample(gpu)])
    watch(t0 + timedelta(seconds=11))
    gpu.refresh_from_db()
    assert (gpu.state, gpu.health) == ("available", "healthy")


def test_a_failed_reset_escalates_to_faulty(world, fleet, steps):
    pk, host, gpu = vm_on_host(world, steps)
    beat(host, timezone.now(), samples=[sample(gpu, xids=[48])])
    reset_and_answer(host, ok=False, detail="GPU 0: still unhealthy after the reset")
    gpu.refresh_from_db()
    assert (gpu.state, gpu.health) == ("quarantined", "failed")
    assert Incident.objects.get(kind=GPU_RESET, tenant_id__isnull=True).resolved_at is not None
    assert Incident.objects.get(kind=NODE_FAILURE, reservation_id=pk).evidence["cause"] == "reset_failed"
    steps.run()
    assert active_instance(pk).devices[0]["gpu_id"] != str(gpu.pk)


def test_a_gpu_failing_again_after_its_reset_escalates(world, fleet, steps):
    pk, host, gpu = vm_on_host(world, steps)
    t0 = timezone.now()
    beat(host, t0, samples=[sample(gpu, xids=[48])])
    reset_and_answer(host, ok=True)
    beat(host, t0 + timedelta(seconds=10), samples=[sample(gpu, xids=[62])])
    assert Incident.objects.get(kind=NODE_FAILURE, reservation_id=pk).evidence["cause"] == "failed_after_reset"


def test_repeated_xids_escalate_to_faulty(world, fleet, steps, settings):
    settings.MERIDIAN_FAILURE_POLICY = {"reset_failed_action": "reset_gpu"}  # only the repeat may escalate
    pk, host, gpu = vm_on_host(world, steps)
    t0 = timezone.now()
    for i in range(2):
        beat(host, t0 + timedelta(seconds=10 * i), samples=[sample(gpu, xids=[48, 13])])
    assert not Incident.objects.filter(kind=NODE_FAILURE).exists()
    beat(host, t0 + timedelta(seconds=20), samples=[sample(gpu, xids=[48])])
    failure = Incident.objects.get(kind=NODE_FAILURE, tenant_id__isnull=True)
    assert failure.evidence["cause"] == "repeated_xids" and failure.evidence["findings"][0]["xids"] == 3


def test_new_uncorrectable_ecc_errors_reset_the_gpu(world, fleet, steps):
    pk, host, gpu = vm_on_host(world, steps)
    t0 = timezone.now()
    beat(host, t0, samples=[sample(gpu, ecc_uncorrected=0)])
    beat(host, t0 + timedelta(seconds=10), samples=[sample(gpu, ecc_uncorrected=0)])
    assert not Incident.objects.exists()
    beat(host, t0 + timedelta(seconds=20), samples=[sample(gpu, ecc_uncorrected=2)])
    assert Incident.objects.get(kind=GPU_RESET, tenant_id__isnull=True).evidence["cause"] == "uncorrectable_ecc"


#
# Drains: heat, links
#


def test_an_overheating_gpu_drains_its_host_and_the_work_runs_on(world, fleet, steps):
    pk, host, gpu = vm_on_host(world, steps)
    t0 = timezone.now()
    for i in range(2):
        beat(host, t0 + timedelta(seconds=10 * i), samples=[sample(gpu, temperature_c=97)])
    host.refresh_from_db()
    assert host.health == "failed" and host.state == "in_service"  # no longer sold; the tenant's VM runs on
    assert Incident.objects.filter(kind=DRAIN, tenant_id__isnull=True).count() == 1
    assert Incident.objects.filter(kind=DRAIN, reservation_id=pk).count() == 1
    # The tenant is told, but its work runs on: its incident names no GPU, so the SLA counts no outage.
    tenant_one = Incident.objects.get(kind=DRAIN, reservation_id=pk)
    assert tenant_one.gpu_ids == [] and tenant_one.gpus_affected == 0
    assert told(world, "t1", "node.drained") == 1 and told(world, "t2", "node.drained") == 0
    assert reservation(pk).state == "active"


def test_an_nvlink_down_drains_its_host_and_the_work_runs_on(world, fleet, steps):
    pk, host, gpu = vm_on_host(world, steps)
    beat(host, timezone.now(), samples=[sample(gpu, nvlink_up=17, nvlink_total=18)])
    host.refresh_from_db()
    assert host.health == "failed" and host.state == "in_service"  # not sold again; the VM runs on
    incident = Incident.objects.get(kind=DRAIN, tenant_id__isnull=True)
    assert "1 of 18 NVLink links down" in incident.summary
    assert reservation(pk).state == "active"


def test_a_drained_host_goes_to_the_operators_hold_once_its_work_has_ended(world, fleet, steps):
    pk, host, gpu = vm_on_host(world, steps)
    beat(host, timezone.now(), samples=[sample(gpu, temperature_c=97)])
    assert watch(timezone.now())["held"] == 0  # the tenant's VM still runs there
    Allocation.objects.filter(reservation_id=pk).update(ends_at=timezone.now())
    assert watch(timezone.now() + timedelta(seconds=1))["held"] == 1
    host.refresh_from_db()
    assert host.state == "maintenance" and host.previous_state == "in_service"
    assert not Incident.objects.filter(kind=DRAIN, resolved_at__isnull=True).exists()


def test_an_idle_node_with_a_link_down_goes_to_the_operators_hold(world, fleet):
    host = Node.objects.filter(pool="shared").first()
    guid = host.ib_ports.first().guid
    beat(host, timezone.now(), ports=[{"guid": guid, "link": "up"}])
    assert not Incident.objects.exists()
    beat(host, timezone.now(), ports=[{"guid": guid, "link": "down"}])
    host.refresh_from_db()
    assert host.state == "maintenance"
    drain = Incident.objects.get(kind=DRAIN)
    assert drain.evidence["cause"] == "port_down" and drain.evidence["port"] == guid


def test_a_link_staying_down_on_a_held_node_opens_nothing_again_and_the_node_is_sold_after_the_hold(world, fleet):
    host = Node.objects.filter(pool="shared").first()
    guid = host.ib_ports.first().guid
    t0 = timezone.now()
    beat(host, t0, ports=[{"guid": guid, "link": "up"}])
    beat(host, t0 + timedelta(seconds=PERIOD), ports=[{"guid": guid, "link": "down"}])
    host.refresh_from_db()
    assert host.state == "maintenance" and host.health == "healthy"
    for i in range(2, 5):  # the link stays down while the operator holds it
        beat(host, t0 + timedelta(seconds=i * PERIOD), ports=[{"guid": guid, "link": "down"}])
    host.refresh_from_db()
    assert host.state == "maintenance" and host.health == "healthy"  # as the drain left it
    assert Incident.objects.filter(kind=DRAIN).count() == 1
    node_maintenance_end(actor=None, node=host)
    host.refresh_from_db()
    assert host.state == "in_service" and host.health in SELLABLE_HEALTH  # a shared host sold again


def test_a_flapping_link_is_found_even_while_it_is_up(world, fleet, settings):
    settings.MERIDIAN_FAILURE_POLICY = {"port_flaps": 3, "port_down_action": "faulty"}
    host = Node.objects.filter(pool="bare_metal", state="available", is_spare=False).first()
    port = host.ib_ports.first()
    flapping = Ingested(gpus=[], ports=[PortReading(port_id=port.pk, guid=port.guid, link="up", previous="down",
                                                    changes_in_window=3)])
    judge_samples(node=host, ingested=flapping, now=timezone.now())
    host.refresh_from_db()
    assert host.state == "faulty"
    failure = Incident.objects.get(kind=NODE_FAILURE, tenant_id__isnull=True)
    assert failure.evidence["cause"] == "port_flapping" and failure.evidence["changes"] == 3


#
# Out of band, the policy, the agent
#


def test_a_critical_bmc_under_a_tenants_server_fails_it_and_replaces_it(world, fleet, steps):
    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    server = active_instance(pk).node
    finding = judge_bmc(node=server, reading={"health": "critical", "temperatures": []}, power="on", ports=[],
                        now=timezone.now())
    assert finding.cause == "bmc_critical"
    server.refresh_from_db()
    assert server.state == "faulty"
    assert told(world, "t1", "reservation.hardware_failed") == 1
    steps.run()
    assert reservation(pk).state == "active" and active_instance(pk).node_id != server.pk


def test_a_tenants_server_read_as_off_is_drained_not_failed(world, fleet, steps):
    """Its own ``poweroff`` reads the same as a lost server: no longer sold, but nothing moves or is failed."""
    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    server = active_instance(pk).node
    finding = judge_bmc(node=server, reading={"health": "ok", "temperatures": []}, power="off", ports=[],
                        now=timezone.now())
    assert finding.cause == "power_lost"
    server.refresh_from_db()
    assert server.state == "allocated" and server.health == "failed"
    assert not Incident.objects.filter(kind=NODE_FAILURE).exists()
    assert reservation(pk).state == "active" and active_instance(pk).node_id == server.pk


def test_a_redfish_server_powering_off_or_on_is_not_read_as_off(monkeypatch):
    import sushy

    from provisioning.drivers.redfish import RedfishPower

    def read(state):
        monkeypatch.setattr(RedfishPower, "_call", lambda self, target, what, act: act(
            types.SimpleNamespace(power_state=state)))
        return RedfishPower().power_state(None)

    assert read(sushy.PowerState.POWERING_OFF) == read(sushy.PowerState.POWERING_ON) == "on"
    assert read(sushy.PowerState.ON) == "on" and read(sushy.PowerState.OFF) == "off"


def test_a_reservation_released_while_it_waits_for_a_replacement_has_its_incidents_resolved(world, fleet, steps,
                                                                                           settings):
    settings.MERIDIAN_REPLACEMENT_FROM_POOL = False
    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    server = active_instance(pk).node
    node_transition(actor=None, node=Node.objects.get(hostname="us-east-1-ib-a-n0003"), target="maintenance")
    judge_bmc(node=server, reading={"health": "critical", "temperatures": []}, power="on", ports=[],
              now=timezone.now())
    assert reservation(pk).state == "provisioning"  # waiting for capacity
    waiting = Incident.objects.get(kind=NODE_FAILURE, reservation_id=pk)
    assert waiting.resolved_at is None
    reservation_release(actor=None, reservation=Reservation.objects.get(pk=pk))
    ticking.tick()
    waiting.refresh_from_db()
    assert waiting.resolved_at is not None and waiting.restored_at is None
    assert reservation(pk).state not in ("active", "provisioning")


def test_a_dead_link_under_a_tenants_server_drains_it_and_the_server_runs_on(world, fleet, steps):
    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    server = active_instance(pk).node
    port = server.ib_ports.first()
    went_down = PortReading(port_id=port.pk, guid=port.guid, link="down", previous="up", changes_in_window=1)
    # One poll reading it down may be the tenant rebooting: nothing yet.
    assert judge_bmc(node=server, reading={"health": "ok", "temperatures": []}, power="on", ports=[went_down],
                     now=timezone.now()) is None
    server.refresh_from_db()
    assert server.health != "failed" and not Incident.objects.filter(kind=DRAIN).exists()
    still_down = PortReading(port_id=port.pk, guid=port.guid, link="down", previous="down", changes_in_window=1)
    for _ in range(2):
        finding = judge_bmc(node=server, reading={"health": "ok", "temperatures": []}, power="on", ports=[still_down],
                            now=timezone.now())
    assert finding.cause == "port_down"
    server.refresh_from_db()
    assert server.state == "allocated" and server.health == "failed"
    assert Incident.objects.filter(kind=DRAIN, tenant_id=world.t1.tenant.pk).count() == 1
    assert reservation(pk).state == "active"


def test_a_shared_host_failing_its_idle_attestation_has_its_tenants_work_replaced(world, fleet, steps, settings):
    from provisioning.lifecycle.tick import tick
    from provisioning.lifecycle.validate import node_attest

    pk, host, _ = vm_on_host(world, steps)
    settings.MERIDIAN_SIMULATION = {**settings.MERIDIAN_SIMULATION, "attestation": {host.hostname: "bad_measurement"}}
    node_attest(host)
    steps.run()
    host.refresh_from_db()
    assert host.state == "quarantined"
    assert Incident.objects.filter(kind=NODE_FAILURE, reservation_id=pk).count() == 1
    assert told(world, "t1", "reservation.hardware_failed") == 1
    tick()
    steps.run()
    assert reservation(pk).state == "active" and active_instance(pk).node_id != host.pk


def test_work_on_a_gpu_quarantined_for_isolation_is_moved(world, fleet, steps):
    from operations.node_api.agents import violations_report

    pk, host, gpu = vm_on_host(world, steps)
    violations_report(node=host, violations=[{"index": gpu.index, "kind": "wrong_mig_layout",
                                              "action": "quarantine_gpu", "detail": "MIG off"}])
    assert Incident.objects.get(kind=NODE_FAILURE, reservation_id=pk).evidence["cause"] == "isolation"
    steps.run()
    assert reservation(pk).state == "active" and active_instance(pk).devices[0]["gpu_id"] != str(gpu.pk)


def test_the_policy_comes_from_settings_and_refuses_unknown_keys(settings):
    settings.MERIDIAN_FAILURE_POLICY = {"xid_actions": {"13": "faulty"}, "faulty_after_misses": 4}
    policy = failure_policy()
    assert policy.heartbeat_interval_s == PERIOD and policy.faulty_after_misses == 4
    assert policy.xid_actions[13].name == "FAULTY"
    settings.MERIDIAN_FAILURE_POLICY = {"suspect_after": 3}
    with pytest.raises(ValueError, match="unknown failure policy keys"):
        failure_policy()


def test_the_agent_resets_a_gpu_and_says_whether_it_came_back():
    nvml = SimulatedNVML([SimulatedGPU(index=0, uuid="GPU-a", memory_mib=1024, used={(0, 512)})])
    agent = Agent(control_plane=None, nvml=nvml)
    assert agent.execute({"id": "1", "kind": "reset_gpu", "payload": {"index": 0}}) == {"ok": True, "detail": ""}
    assert nvml.gpus[0].used == set()
    nvml.raise_ecc(0)
    answer = agent.execute({"id": "2", "kind": "reset_gpu", "payload": {"index": 0}})
    assert answer["ok"] is False and "unhealthy" in answer["detail"]


#
# A region silent en masse
#


def agents_on_all(fleet_nodes, at) -> list[Node]:
    """Every sellable node of the fleet heard at ``at`` (an agent each)."""
    nodes = [n for n in fleet_nodes if not n.is_spare and n.state in ("available", "in_service")]
    for node in nodes:
        beat(node, at)
    return nodes


def test_a_region_going_silent_at_once_is_held_suspect_not_failed_and_released_when_heard(world, fleet, steps,
                                                                                          settings):
    settings.MERIDIAN_FAILURE_POLICY = {"mass_silence_share": 0.5, "mass_silence_min_nodes": 2}
    pk, host, _ = vm_on_host(world, steps)
    t0 = timezone.now()
    nodes = agents_on_all(Node.objects.all(), t0)
    assert len(nodes) >= 5 and host in nodes
    report = watch(t0 + timedelta(seconds=3.5 * PERIOD))  # all silent past the failure point: a network fault
    assert report["failed"] == 0 and report["suspect"] == len(nodes) and report["regions_held"] == 1
    assert set(Node.objects.filter(pk__in=[n.pk for n in nodes]).values_list("state", flat=True)) == {"suspect"}
    held = Incident.objects.get(kind=MASS_SILENCE, resolved_at__isnull=True)
    assert held.evidence["silent"] == len(nodes) and held.evidence["region"] == "us-east-1"
    assert held.impact_started_at == t0
    watch(t0 + timedelta(seconds=5 * PERIOD))  # still silent: nothing failed, nothing opened twice
    assert not Node.objects.filter(state="faulty").exists() and Incident.objects.filter(kind=MASS_SILENCE).count() == 1
    assert reservation(pk).state == "active" and not Incident.objects.filter(kind=NODE_FAILURE).exists()

    # The network comes back in pieces: with fewer than half silent the region stays held until
    # under a quarter (no cliff where all the rest fail at once) ...
    quiet = [n for n in nodes if n.pk != host.pk][:1]
    first = [host, *[n for n in nodes if n.pk != host.pk and n not in quiet][:len(nodes) // 2]]
    assert 0.25 < (len(nodes) - len(first)) / len(nodes) < 0.5  # silent: under the share, over half of it
    heard_at = t0 + timedelta(seconds=6 * PERIOD)
    for node in first:
        beat(node, heard_at)
    report = watch(heard_at + timedelta(seconds=0.1))
    assert report["regions_held"] == 1 and report["failed"] == 0 and report["back"] == len(first)
    # ... and once released, those still silent get the usual three periods from the release.
    for node in nodes:
        if node not in quiet:
            beat(node, heard_at + timedelta(seconds=PERIOD))
    release = heard_at + timedelta(seconds=PERIOD + 0.1)
    report = watch(release)
    assert report["regions_held"] == 0 and report["failed"] == 0
    assert Incident.objects.get(kind=MASS_SILENCE).resolved_at == release
    for node in nodes:
        if node not in quiet:
            beat(node, release + timedelta(seconds=2.5 * PERIOD))
    report = watch(release + timedelta(seconds=3 * PERIOD))
    assert report["regions_held"] == 0 and report["failed"] == len(quiet)
    assert set(Node.objects.filter(pk__in=[n.pk for n in quiet]).values_list("state", flat=True)) == {"faulty"}
    host.refresh_from_db()
    assert host.state == "in_service" and reservation(pk).state == "active"


def test_nodes_just_back_from_a_tenant_do_not_count_as_silent(world, fleet, settings):
    settings.MERIDIAN_FAILURE_POLICY = {"mass_silence_share": 0.5, "mass_silence_min_nodes": 2}
    t0 = timezone.now()
    nodes = agents_on_all(Node.objects.all(), t0)
    later = t0 + timedelta(seconds=3.5 * PERIOD)
    dead, returned, alive = nodes[0], nodes[1:4], nodes[4:]
    # Cleaned after a tenant: available again with a heartbeat from before the tenant had them.
    Node.objects.filter(pk__in=[n.pk for n in returned]).update(state_changed_at=later - timedelta(seconds=1))
    for node in alive:
        beat(node, later - timedelta(seconds=1))
    report = watch(later)
    assert report["regions_held"] == 0 and report["failed"] == 1
    assert not Incident.objects.filter(kind=MASS_SILENCE).exists()
    dead.refresh_from_db()
    assert dead.state == "faulty"


def test_a_few_silent_nodes_in_a_large_region_are_failed_as_usual(world, fleet, steps, settings):
    settings.MERIDIAN_FAILURE_POLICY = {"mass_silence_share": 0.5, "mass_silence_min_nodes": 1}
    t0 = timezone.now()
    nodes = agents_on_all(Node.objects.all(), t0)
    for node in nodes[1:]:
        beat(node, t0 + timedelta(seconds=3 * PERIOD))
    report = watch(t0 + timedelta(seconds=3.5 * PERIOD))  # one of several: under the share
    assert report["regions_held"] == 0 and report["failed"] == 1
    assert not Incident.objects.filter(kind=MASS_SILENCE).exists()


def test_the_mass_silence_policy_is_checked():
    from cloud.health import FailurePolicy, mass_silence

    with pytest.raises(ValueError):
        FailurePolicy(mass_silence_share=0)
    with pytest.raises(ValueError):
        FailurePolicy(mass_silence_min_nodes=0)
    policy = FailurePolicy(mass_silence_share=0.5, mass_silence_min_nodes=5)
    assert not mass_silence(4, 4, policy)  # too few to tell a network from four failures
    assert not mass_silence(5, 10, policy) and mass_silence(6, 10, policy)
    assert mass_silence(5, 10, policy, held=True) and not mass_silence(5, 20, policy, held=True)
    with pytest.raises(ValueError):
        FailurePolicy(mass_silence_share=1)  # silent can never exceed watched: the guard would be off
