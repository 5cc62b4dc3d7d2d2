"""
The agent's liveness pings (provisioning.agent.liveness) on a fake clock and a fake control
plane: none until the control plane says how often, then one every period on a fixed schedule
whatever each answer took, the run begun by a start ping (again after a refusal), unanswered pings
counted and said with the next one, missed slots skipped rather than sent at once, a stop when
the agent goes away; and through the real node API, a heartbeat's answer starting the pings.
"""

import pytest

from provisioning.agent.agent import Agent, ControlPlaneError
from provisioning.agent.liveness import Pinger
from provisioning.agent.nvml import SimulatedGPU, SimulatedNVML

WALL0 = 1_800_000_000.0


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def wall(self) -> float:
        return WALL0 + self.t


class FakeControlPlane:
    """Records each call; a ping's answer takes ``rtt`` of the fake clock, or fails as ``failing`` says."""

    def __init__(self, clock: Clock, rtt: float = 0.05):
        self.clock, self.rtt, self.calls, self.failing = clock, rtt, [], []
        self.heartbeat_answer = {"ok": True, "interval_s": 10.0, "liveness_s": 2.0, "commands_waiting": False}

    def call(self, method, path, payload=None, timeout=None):
        self.calls.append((path, dict(payload or {}), timeout, self.clock.t))
        if path == "/heartbeat/":
            return self.heartbeat_answer
        self.clock.t += self.rtt
        if self.failing:
            status = self.failing.pop(0)
            raise ControlPlaneError(f"POST {path}: {status or 'timed out'}", status)
        return {"ok": True, "liveness_s": 2.0}

    def pings(self) -> list[dict]:
        return [payload for path, payload, _, _ in self.calls if path == "/alive/"]


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def plane(clock):
    return FakeControlPlane(clock)


def pinger(plane, clock, **kwargs) -> Pinger:
    return Pinger(plane, clock=clock, wall=clock.wall, run="run-a", **kwargs)


def run_for(p: Pinger, clock: Clock, seconds: float, step: float = 0.1) -> None:
    end = clock.t + seconds
    while clock.t < end - 1e-9:
        p.tick()
        clock.t = round(clock.t + step, 6)


def test_no_ping_until_the_control_plane_says_how_often(plane, clock):
    p = pinger(plane, clock)
    run_for(p, clock, 5)
    assert plane.calls == []
    p.period_take(2.0)
    assert p.tick() is True
    first = plane.pings()[0]
    assert first["start"] is True and first["seq"] == 1 and first["run"] == "run-a"
    assert first["sent_at"] == pytest.approx(WALL0 + 5.0) and first["failed"] == 0 and first["rtt_ms"] is None


def test_pings_keep_a_fixed_rate_whatever_each_answer_took(plane, clock):
    plane.rtt = 0.3
    p = pinger(plane, clock)
    p.period_take(2.0)
    run_for(p, clock, 10.05)
    sent = [at for path, _, _, at in plane.calls if path == "/alive/"]
    assert sent == pytest.approx([0.0, 2.0, 4.0, 6.0, 8.0, 10.0])  # not 0, 2.3, 4.6 ...
    bodies = plane.pings()
    assert [b["seq"] for b in bodies] == [1, 2, 3, 4, 5, 6]
    assert "start" not in bodies[1] and bodies[1]["rtt_ms"] == 300
    assert all(timeout == 2.0 for path, _, timeout, _ in plane.calls)  # a ping waits at most a period


def test_unanswered_pings_are_counted_and_said_with_the_next(plane, clock):
    p = pinger(plane, clock)
    p.period_take(2.0)
    assert p.tick() is True
    plane.failing = [None, 503]
    run_for(p, clock, 6.05)
    bodies = plane.pings()
    assert [b["failed"] for b in bodies] == [0, 0, 1, 2]
    assert bodies[3]["rtt_ms"] == 50  # the last answered ping's round trip
    run_for(p, clock, 2.0)
    assert plane.pings()[-1]["failed"] == 0


def test_a_refused_ping_begins_the_run_again(plane, clock):
    p = pinger(plane, clock)
    p.period_take(2.0)
    p.tick()
    plane.failing = [409]  # the control plane does not count it (it forgot the run, or the row is new)
    run_for(p, clock, 6.1)
    bodies = plane.pings()
    assert [b.get("start", False) for b in bodies] == [True, False, True, False]


def test_a_schedule_that_fell_behind_skips_the_missed_slots(plane, clock):
    p = pinger(plane, clock)
    p.period_take(2.0)
    p.tick()
    clock.t += 9.0  # the process was suspended
    woke = clock.t
    assert p.tick() is True and p.tick() is None
    assert p.due_at == pytest.approx(woke + 2.0)
    assert len(plane.pings()) == 2


def test_leaving_ends_a_begun_run_with_a_stop(plane, clock):
    p = pinger(plane, clock)
    p.leave()
    assert plane.calls == []  # no run to end
    p.period_take(2.0)
    p.tick()
    p.leave()
    last = plane.pings()[-1]
    assert last["stop"] is True and "start" not in last


def test_a_period_of_0_or_nonsense_stops_the_pings(plane, clock):
    p = pinger(plane, clock)
    p.period_take(2.0)
    p.tick()
    for said in (0, None, "2", True, -1):
        p.period_take(said)
        assert p.period == 0.0
    run_for(p, clock, 5)
    assert len(plane.pings()) == 1
    p.period_take(0.01)
    assert p.period == 0.2  # never faster than five a second


def nvml() -> SimulatedNVML:
    return SimulatedNVML([SimulatedGPU(index=i, uuid=f"GPU-{i}", memory_mib=81920) for i in range(2)])


def test_the_agent_takes_the_period_from_its_heartbeats_answer_and_a_silent_agent_does_not_ping(plane, clock):
    agent = Agent(plane, nvml())
    agent.pinger = pinger(plane, clock, paused=lambda: agent.silent)
    agent.run_once()
    assert agent.pinger.period == 2.0
    assert agent.pinger.tick() is True
    agent.silent = True
    run_for(agent.pinger, clock, 6)
    assert len(plane.pings()) == 1
    plane.heartbeat_answer = {**plane.heartbeat_answer, "liveness_s": 0}
    agent.silent = False
    agent.run_once()
    assert agent.pinger.period == 0.0
    older = {k: v for k, v in plane.heartbeat_answer.items() if k != "liveness_s"}
    plane.heartbeat_answer = older  # a control plane without pings
    agent.run_once()
    assert agent.pinger.period == 0.0


def test_an_agent_without_a_control_plane_has_no_pinger():
    assert Agent(None, nvml()).pinger is None


class SignedClient:
    """The agent's ControlPlane over Django's test client: the real node API, signed the same way."""

    def __init__(self, key_id: str, secret: str):
        self.key_id, self.secret = key_id, secret

    def call(self, method, path, payload=None, timeout=None):
        from django.test import Client

        from tests.provisioning.test_node_agent import send

        response = send(Client(), self.key_id, self.secret, method, path, payload)
        if response.status_code >= 400:
            raise ControlPlaneError(f"{method} {path}: {response.status_code}", response.status_code)
        return response.json()


def test_a_real_agent_pings_the_node_api_once_its_heartbeat_answered(world):
    from operations.node_api import agents as node_agents
    from provisioning.models import AgentState
    from tests.provisioning.test_node_agent import nvml_of, shared_host
    from tests.world import small_fleet

    small_fleet(4)
    node = shared_host()
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    agent = Agent(SignedClient(credential.key_id, secret), nvml_of(node))
    agent.run_once()
    pings = agent.pinger
    assert pings.period == 2.0 and pings.tick() is True
    state = AgentState.objects.get(node=node)
    assert state.ping_run == pings.run_id and state.ping_seq == 1 and state.alive_at is not None
    assert pings.ping() is True and AgentState.objects.get(node=node).ping_rtt_ms is not None
    AgentState.objects.filter(node=node).update(ping_run="")  # the run is not known any more
    assert pings.ping() is False and pings.started is False and pings.failed == 1
    assert pings.ping() is True  # begun again
    assert AgentState.objects.get(node=node).ping_run == pings.run_id
    pings.leave()
    assert AgentState.objects.get(node=node).ping_run == ""
