"""
The heartbeat watchdog judging agents that ping (operations.silence, operations.heartbeats): a
pinging node silent for 2 liveness periods is suspect and for 3 failed (its work replaced), while
an agent without pings keeps its heartbeats' periods; and the control plane's own stalls -- a
watchdog round that came late, a slow database, pings late or stopped everywhere at once -- make
no node suspect, while a single node that is truly silent is still suspect within the periods
after the stall's end.
"""

import time
import uuid
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from cloud.health import FailurePolicy, Round, control_plane_stall
from cloud.models import Node
from operations import silence
from operations.heartbeats import watch_heartbeats
from operations.node_api import agents as node_agents
from operations.node_api.liveness import Ping, alive
from provisioning.lifecycle.replacement import NODE_FAILURE
from provisioning.models import AgentState, Reservation
from security.models import Incident
from tests.operations.test_detection import vm_on_host
from tests.provisioning.pipeline import reservation
from tests.provisioning.test_replacement import active_instance
from tests.world import small_fleet

LIVENESS, HEARTBEAT = 2.0, 10.0


@pytest.fixture(autouse=True)
def _settings(settings):
    settings.MERIDIAN_AGENT_INTERVAL = HEARTBEAT
    settings.MERIDIAN_LIVENESS_SECONDS = LIVENESS
    settings.MERIDIAN_WATCHDOG_SECONDS = 1.0
    settings.MERIDIAN_FAILURE_POLICY = {"mass_silence_min_nodes": 2}


@pytest.fixture
def fleet(world):
    """small_fleet(8): bare metal n0000-n0005, shared hosts n0006-n0007; every node's agent pings."""
    Reservation.objects.all().delete()
    return small_fleet(8)


def watched() -> list[Node]:
    return list(Node.objects.filter(state__in=("available", "in_service")).order_by("hostname"))


def begin(nodes, at) -> None:
    """Each node's agent heard: its first heartbeat, then the ping that begins its run."""
    for node in nodes:
        node_agents.heartbeat(node=node, agent_version="1", gpus=[], now=at)
        alive(node=node, ping=Ping(run=f"run-{node.hostname}", seq=1, sent_at=at, start=True),
              nonce=uuid.uuid4().hex, now=at)


def ping(nodes, at, **said) -> None:
    """A ping of each node's agent comes in at ``at`` (``said``: what it says of the pings before)."""
    for node in nodes:
        alive(node=node, ping=Ping(run=f"run-{node.hostname}", seq=int(at.timestamp() * 1000), sent_at=at, **said),
              now=at)


def watch(at) -> dict:
    with time_machine.travel(at, tick=False):
        return watch_heartbeats(now=at)


def state(node) -> str:
    node.refresh_from_db()
    return node.state


def seconds(t0, s):
    return t0 + timedelta(seconds=s)


#
# Judged by the pings
#


def test_a_silent_pinging_node_is_suspect_after_2_liveness_periods_and_failed_after_3(world, fleet, steps):
    pk, host, _ = vm_on_host(world, steps)
    t0 = timezone.now()
    nodes = watched()
    begin(nodes, t0)
    quiet = next(n for n in nodes if n.pool == "bare_metal" and n.pk != host.pk)
    AgentState.objects.filter(node=quiet).update(ping_run="")  # an agent that sends no pings: heartbeats judge it
    others = [n for n in nodes if n.pk not in (host.pk, quiet.pk)]
    reports = []
    for s in range(1, 7):
        ping(others, seconds(t0, s))
        reports.append(watch(seconds(t0, s)))
    assert [r["suspect"] for r in reports] == [0, 0, 0, 1, 0, 0]
    assert [r["failed"] for r in reports] == [0, 0, 0, 0, 0, 1]
    assert {r["stalled"] for r in reports} == {""}
    failure = Incident.objects.get(kind=NODE_FAILURE, reservation_id=pk)
    assert failure.impact_started_at == t0 and failure.time_to_detect_s == pytest.approx(3 * LIVENESS)
    assert failure.evidence["cause"] == "heartbeat_lost"
    platform = Incident.objects.get(kind=NODE_FAILURE, node_id=host.pk, tenant_id__isnull=True)
    assert platform.evidence["signal"] == "liveness ping" and platform.evidence["interval_s"] == LIVENESS
    assert state(quiet) == "available"  # 6 s without a heartbeat is not 2 heartbeat periods
    steps.run()
    assert reservation(pk).state == "active" and active_instance(pk).node_id != host.pk


def test_a_heartbeat_counts_as_heard_for_an_agent_that_pings(world, fleet):
    t0 = timezone.now()
    nodes = watched()
    begin(nodes, t0)
    node, others = nodes[0], nodes[1:]
    node_agents.heartbeat(node=node, agent_version="1", gpus=[], now=seconds(t0, 3))
    for s in range(1, 8):
        ping(others, seconds(t0, s))
        report = watch(seconds(t0, s))
        assert report["suspect"] == (1 if s == 7 else 0), s  # two periods from the heartbeat at 3 s


def test_an_agent_that_stopped_in_order_is_judged_by_its_heartbeats_again(world, fleet):
    t0 = timezone.now()
    nodes = watched()
    begin(nodes, t0)
    leaving, others = nodes[0], nodes[1:]
    alive(node=leaving, ping=Ping(run=f"run-{leaving.hostname}", seq=2, sent_at=t0, stop=True),
          nonce=uuid.uuid4().hex, now=t0)
    for s in range(1, 21):
        ping(others, seconds(t0, s))
        report = watch(seconds(t0, s))
        assert report["suspect"] == (1 if s == 20 else 0), s  # restarting: two heartbeat periods, not two pings
    assert state(leaving) == "suspect"


#
# The control plane's own stalls
#


def test_a_stalled_watchdog_round_makes_no_node_suspect_and_silence_counts_from_its_end(world, fleet):
    t0 = timezone.now()
    nodes = watched()
    begin(nodes, t0)
    dead, alive_ = nodes[0], nodes[1:]
    ping(nodes, seconds(t0, 1))
    assert watch(seconds(t0, 1))["stalled"] == ""
    # Nothing ran for 9 s (beat, the workers, the web tier: nobody heard, nobody judged); the
    # round after it finds every node 9 s quiet -- and its own clock jumped.
    late = watch(seconds(t0, 10))
    assert late["stalled"] == "watchdog_late" and late["suspect"] == 0 and late["failed"] == 0
    stall = Incident.objects.get(kind=silence.STALL)
    assert stall.resolved_at is None and stall.impact_started_at == seconds(t0, 1)
    assert stall.evidence["reason"] == "watchdog_late" and stall.evidence["gap_s"] == pytest.approx(9.0)
    assert set(Node.objects.filter(pk__in=[n.pk for n in nodes]).values_list("state", flat=True)) <= {
        "available", "in_service"}
    reports = {}
    for s in range(11, 18):
        ping(alive_, seconds(t0, s))
        reports[s] = watch(seconds(t0, s))
    stall.refresh_from_db()
    assert reports[11]["stalled"] == "" and stall.resolved_at == seconds(t0, 11)
    # The truly silent node: suspect two periods after the stall's end, failed after three.
    assert [reports[s]["suspect"] for s in range(11, 18)] == [0, 0, 0, 0, 1, 0, 0]
    assert [reports[s]["failed"] for s in range(11, 18)] == [0, 0, 0, 0, 0, 0, 1]
    assert state(dead) == "faulty"
    assert all(state(n) in ("available", "in_service") for n in alive_)


def test_a_slow_database_makes_no_node_suspect(world, fleet, monkeypatch):
    t0 = timezone.now()
    nodes = watched()
    begin(nodes, t0)
    dead, alive_ = nodes[0], nodes[1:]
    for s in (1, 2, 3):
        ping(nodes, seconds(t0, s))
        watch(seconds(t0, s))
    # The database stalls from 3.5 s to 6.5 s: no ping is stored meanwhile, and the round of 4 s
    # waits 2.5 s for its first statement.
    readings = iter([100.0, 102.5])
    monkeypatch.setattr(silence, "monotonic", lambda: next(readings))
    slow = watch(seconds(t0, 4))
    monkeypatch.setattr(silence, "monotonic", time.monotonic)
    assert slow["stalled"] == "database_slow" and slow["suspect"] == 0
    assert Incident.objects.get(kind=silence.STALL).evidence["database_s"] == pytest.approx(2.5)
    reports = {s: watch(seconds(t0, s)) for s in (5, 6)}  # the pings held up meanwhile are not in yet
    for s in range(7, 14):
        ping(alive_, seconds(t0, s))
        reports[s] = watch(seconds(t0, s))
    assert reports[6]["stalled"] == "pings_stopped"  # every agent 3 s quiet at once: still the control plane
    assert all(r["suspect"] == 0 for s, r in reports.items() if s < 11)
    assert reports[11]["suspect"] == 1 and reports[13]["failed"] == 1  # 2 and 3 periods after the stall's end (7 s)
    assert state(dead) == "faulty" and all(state(n) in ("available", "in_service") for n in alive_)


def test_many_agents_saying_their_pings_go_unanswered_hold_judgement(world, fleet):
    t0 = timezone.now()
    nodes = watched()
    begin(nodes, t0)
    dead, rest = nodes[0], nodes[1:]
    through, lost = rest[: len(rest) // 2 + 1], rest[len(rest) // 2 + 1:]
    for s in (1, 2, 3):
        ping(nodes, seconds(t0, s))
        watch(seconds(t0, s))
    # The web tier is overloaded: half the agents' pings time out, and those that get through say
    # their earlier ones went unanswered.
    reports = {}
    for s in range(4, 10):
        ping(through, seconds(t0, s), failed=2, rtt_ms=1800)
        reports[s] = watch(seconds(t0, s))
    assert {reports[s]["stalled"] for s in range(4, 10)} == {"pings_late"}
    assert all(r["suspect"] == 0 and r["failed"] == 0 for r in reports.values())
    # Answered promptly again: once their pings say so, judgement resumes, silence counted from then.
    for s in range(10, 20):
        ping(rest, seconds(t0, s), rtt_ms=20)
        reports[s] = watch(seconds(t0, s))
    ended = Incident.objects.get(kind=silence.STALL).resolved_at
    assert ended is not None and lost
    suspected = [s for s in range(10, 20) if reports[s]["suspect"]]
    assert suspected == [int((ended - t0).total_seconds()) + 4] and reports[suspected[0]]["suspect"] == 1
    assert state(dead) == "faulty" and all(state(n) in ("available", "in_service") for n in rest)


def test_every_agent_quiet_at_once_holds_judgement_for_at_most_stall_max_s(world, fleet, settings):
    settings.MERIDIAN_FAILURE_POLICY = {"mass_silence_min_nodes": 2, "stall_max_s": 10}
    t0 = timezone.now()
    nodes = watched()
    begin(nodes, t0)
    reports = {s: watch(seconds(t0, s)) for s in range(1, 20)}
    assert reports[2]["stalled"] == "" and reports[3]["stalled"] == "pings_stopped"  # a period and the slack
    assert all(r["suspect"] == 0 for s, r in reports.items() if s < 17)
    # Held from 3 s for 10 s; then judged, silence counted from 13 s: suspect at 17 s, and the
    # region's mass silence keeps every one of them from being failed.
    assert reports[17]["suspect"] == len(nodes) and reports[17]["failed"] == 0 and reports[17]["regions_held"] == 1
    assert reports[19]["failed"] == 0
    assert Incident.objects.get(kind=silence.STALL).resolved_at is None


def test_the_stall_rules():
    policy = FailurePolicy(mass_silence_min_nodes=5)
    on_time = Round(gap_s=1.0, schedule_s=1.0, database_s=0.01, pinging=1000)
    assert control_plane_stall(on_time, policy) is None
    assert control_plane_stall(Round(gap_s=None, schedule_s=1.0, database_s=0.01), policy) is None  # the first round
    assert control_plane_stall(Round(gap_s=2.0, schedule_s=1.0, database_s=0.01), policy) is None
    assert control_plane_stall(Round(gap_s=2.1, schedule_s=1.0, database_s=0.01), policy) == "watchdog_late"
    assert control_plane_stall(Round(gap_s=1.0, schedule_s=1.0, database_s=1.2), policy) == "database_slow"
    # A rack of 40 nodes losing power is 40 silent nodes, and the others' pings stay prompt.
    assert control_plane_stall(Round(gap_s=1.0, schedule_s=1.0, database_s=0.01, pinging=1000, late=40), policy) \
        is None
    assert control_plane_stall(Round(gap_s=1.0, schedule_s=1.0, database_s=0.01, pinging=1000, late=900), policy) \
        == "pings_stopped"
    assert control_plane_stall(Round(gap_s=1.0, schedule_s=1.0, database_s=0.01, pinging=1000, distressed=150),
                               policy) is None
    assert control_plane_stall(Round(gap_s=1.0, schedule_s=1.0, database_s=0.01, pinging=1000, distressed=201),
                               policy) == "pings_late"
    assert control_plane_stall(Round(gap_s=1.0, schedule_s=1.0, database_s=0.01, pinging=4, distressed=4),
                               policy) is None  # too few to tell
    with pytest.raises(ValueError):
        FailurePolicy(stall_share=0.5)
    with pytest.raises(ValueError):
        FailurePolicy(liveness_interval_s=0)
    assert FailurePolicy.from_mapping({}, liveness_interval_s=0).liveness_interval_s is None
