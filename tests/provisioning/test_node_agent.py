"""
The node agent and the node API: a real agent (urllib, signed requests) against a live server,
every refusal of the API (unsigned, unknown key, stale, altered, replayed, another node's GPU or
command), the pipeline's scrub going through the agent, and the telemetry a heartbeat carries
(GPU samples and port states, cloud.telemetry) with its bad inputs.
"""

import json
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from cloud.models import Node
from core.errors import Conflict
from operations.node_api import agents as node_agents
from provisioning.agent.agent import Agent, ControlPlane, ControlPlaneError
from provisioning.agent.attester import SimulatedAttester
from provisioning.agent.nvml import SimulatedGPU, SimulatedNVML
from provisioning.agent.signing import signed_headers
from provisioning.agents import commands as agent_commands
from provisioning.drivers.simulated_devices import attester_identities
from provisioning.models import AgentCommand, AgentNonce, AgentState, Instance, Reservation
from tests.provisioning.pipeline import reservation
from tests.world import small_fleet, vm_offering

API = "/api/agent/v1"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(4)


def shared_host() -> Node:
    return Node.objects.filter(pool="shared").order_by("hostname").first()


def nvml_of(node: Node) -> SimulatedNVML:
    return SimulatedNVML(
        [
            SimulatedGPU(index=i, uuid=u, memory_mib=m)
            for i, u, m in node.gpus.order_by("index").values_list("index", "uuid", "memory_mib")
        ]
    )


def send(client: Client, key_id, secret, method, path, payload=None, *, now=None, headers=None):
    body = b"" if payload is None else json.dumps(payload).encode()
    signed = headers or signed_headers(key_id, secret, method, f"{API}{path}", body, now=now)
    return client.generic(method, f"{API}{path}", body, content_type="application/json", headers=signed)


def agent_turn(node: Node) -> None:
    """One turn of the node's simulated agent, in process: a heartbeat, then an answer to every command it pulls."""
    agent = Agent(None, nvml_of(node), attester=SimulatedAttester(attester_identities(node)), hostname=node.hostname)
    node_agents.heartbeat(node=node, agent_version="1", gpus=agent.nvml.inventory())
    for command in agent_commands.commands_take(node=node):
        result = agent.execute({"id": command.pk, "kind": command.kind, "payload": command.payload})
        node_agents.command_answered(node=node, command_id=command.pk, ok=result["ok"], result=result)


def heartbeat_body(node):
    return {"agent_version": "1", "gpus": nvml_of(node).inventory()}


@pytest.mark.django_db(transaction=True)
def test_a_real_agent_heartbeats_pulls_a_scrub_and_answers(world, fleet, live_server):
    node = shared_host()
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    nvml = nvml_of(node)
    nvml.gpus[2].used.add((0, 1024))
    agent = Agent(ControlPlane(live_server.url, credential.key_id, secret), nvml)
    assert agent.run_once() == 0
    state = AgentState.objects.get(node=node)
    assert [g["uuid"] for g in state.gpus] == list(node.gpus.order_by("index").values_list("uuid", flat=True))
    command = agent_commands.command_enqueue(
        node_id=node.pk,
        kind="scrub",
        reference="op-1",
        payload={"devices": [{"index": 2, "mem_lo": 0, "mem_hi": 81920}]},
    )
    assert agent.run_once() == 1
    command.refresh_from_db()
    assert command.state == "done" and command.result["ok"] is True
    assert not nvml.gpus[2].used
    wrong = Agent(ControlPlane(live_server.url, credential.key_id, "not-the-secret"), nvml)
    with pytest.raises(ControlPlaneError, match="401"):
        wrong.run_once()


def test_unsigned_unknown_and_stale_requests_are_refused(world, fleet):
    client, node = Client(), shared_host()
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    unsigned = client.post(f"{API}/heartbeat/", heartbeat_body(node), content_type="application/json")
    assert unsigned.status_code == 401 and unsigned.json()["errors"][0]["code"] == "node_auth_required"
    unknown = send(client, "nk_nobody", secret, "POST", "/heartbeat/", heartbeat_body(node))
    assert unknown.status_code == 401 and unknown.json()["errors"][0]["code"] == "node_key_invalid"
    stale = send(client, credential.key_id, secret, "POST", "/heartbeat/", heartbeat_body(node), now=time.time() - 600)
    assert stale.status_code == 401 and stale.json()["errors"][0]["code"] == "stale"
    assert not AgentState.objects.exists()


def test_an_altered_or_replayed_request_is_refused(world, fleet):
    client, node = Client(), shared_host()
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    body = heartbeat_body(node)
    headers = signed_headers(credential.key_id, secret, "POST", f"{API}/heartbeat/", json.dumps(body).encode())
    altered = dict(body, agent_version="2")
    refused = send(client, None, None, "POST", "/heartbeat/", altered, headers=headers)
    assert refused.status_code == 401 and refused.json()["errors"][0]["code"] == "signature_invalid"
    assert send(client, None, None, "POST", "/heartbeat/", body, headers=headers).status_code == 200
    replayed = send(client, None, None, "POST", "/heartbeat/", body, headers=headers)
    assert replayed.status_code == 409 and replayed.json()["errors"][0]["code"] == "replayed"
    assert AgentNonce.objects.filter(node=node).count() == 1  # spent by the good request, not the altered one


def test_a_node_speaks_only_for_its_own_gpus_and_commands(world, fleet):
    client = Client()
    node, other = (
        Node.objects.filter(pool="shared").order_by("hostname")[:2]
        if Node.objects.filter(pool="shared").count() > 1
        else (shared_host(), Node.objects.exclude(pk=shared_host().pk).first())
    )
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    body = heartbeat_body(node)
    body["gpus"].append({"index": 9, "uuid": other.gpus.first().uuid})
    foreign = send(client, credential.key_id, secret, "POST", "/heartbeat/", body)
    assert foreign.status_code == 403 and foreign.json()["errors"][0]["code"] == "foreign_gpu"
    assert not AgentState.objects.exists()
    theirs = agent_commands.command_enqueue(node_id=other.pk, kind="inventory", reference="x", payload={})
    answer = send(client, credential.key_id, secret, "POST", f"/commands/{theirs.pk}/result/", {"ok": True})
    assert answer.status_code == 404
    assert AgentCommand.objects.get(pk=theirs.pk).state == "pending"
    pulled = send(client, credential.key_id, secret, "GET", "/commands/")
    assert pulled.json() == {"commands": []}
    bad = send(client, credential.key_id, secret, "POST", "/heartbeat/", {"gpus": "all of them"})
    assert bad.status_code == 400


def test_release_scrubs_through_the_agent_and_waits_for_its_answer(world, fleet, steps, settings):
    settings.MERIDIAN_DRIVERS = {"default": {"host": "agent"}}
    response = world.client("t1_member").post(
        "/api/v1/reservations/",
        {"name": "vm", "offering": vm_offering(1).slug, "gpus": 1, "regions": ["us-east-1"], "duration_hours": 1},
        format="json",
    )
    pk = response.json()["id"]
    node_agents.heartbeat(node=shared_host(), agent_version="1", gpus=nvml_of(shared_host()).inventory())
    waiting = steps.run(limit=12, settle=False)
    assert ("provision", "verify", "waiting") in waiting  # the agent must answer the attestation challenge
    instance = Instance.objects.get(reservation_id=pk)
    agent_turn(instance.node)
    steps.run()
    assert reservation(pk).state == "active"
    assert AgentCommand.objects.get(node=instance.node, kind="attest").state == "done"
    world.client("t1_member").post(f"/api/v1/reservations/{pk}/release/")
    waiting = steps.run(limit=12, settle=False)
    assert ("release", "scrub", "waiting") in waiting and reservation(pk).state == "releasing"
    command = AgentCommand.objects.get(node=instance.node, kind="scrub")
    assert command.payload["devices"][0]["index"] == instance.devices[0]["index"]
    with pytest.raises(Conflict):  # an answer to a command the agent never pulled is refused
        node_agents.command_answered(node=instance.node, command_id=command.pk, ok=True, result={"ok": True})
    assert [c.pk for c in agent_commands.commands_take(node=instance.node)] == [command.pk]
    node_agents.command_answered(node=instance.node, command_id=command.pk, ok=True, result={"ok": True})
    steps.run(limit=12, settle=False)  # the scrubbed GPU is attested again before it is sold again
    agent_turn(instance.node)
    steps.run()
    assert reservation(pk).state == "released"
    assert AgentCommand.objects.filter(kind="scrub").count() == 1  # asked once, however often it looked
    assert AgentCommand.objects.filter(kind="attest", state="done").count() == 2


def test_a_silent_agent_fails_the_step_that_needs_it(world, fleet, steps, settings):
    settings.MERIDIAN_DRIVERS = {"default": {"host": "agent"}}
    response = world.client("t1_member").post(
        "/api/v1/reservations/",
        {"name": "vm", "offering": vm_offering(1).slug, "gpus": 1, "regions": ["us-east-1"], "duration_hours": 1},
        format="json",
    )
    pk = response.json()["id"]
    steps.run()
    # Nobody answered the attestation challenge: the node is not handed over, the reservation is placed again.
    assert reservation(pk).state in ("queued", "scheduled")
    node = Instance.objects.get(reservation_id=pk).node
    # (It waited MERIDIAN_STEP_WAITS looks for the agent first: late is not failed, never heard at all is.)
    assert Node.objects.get(pk=node.pk).state == "faulty"
    assert "has not been heard yet" in Node.objects.get(pk=node.pk).state_reason


def test_spent_nonces_are_forgotten_once_their_requests_would_be_stale(world, fleet):
    from datetime import timedelta

    from django.utils import timezone

    from operations.tasks import agent_nonce_prune

    node = shared_host()
    AgentNonce.objects.create(node=node, nonce="old", seen_at=timezone.now() - timedelta(minutes=10))
    AgentNonce.objects.create(node=node, nonce="fresh", seen_at=timezone.now())
    assert agent_nonce_prune() == 1
    assert list(AgentNonce.objects.values_list("nonce", flat=True)) == ["fresh"]


def test_the_agent_runs_from_its_command_line_without_django(tmp_path):
    """``python -m provisioning.agent`` imports nothing of Django (it is installed alone on hosts)."""
    import subprocess
    import sys

    secret = tmp_path / "node.key"
    secret.write_text("s3cret")
    code = (
        "import sys, provisioning.agent.__main__ as m; "
        "assert not any(name.startswith('django') for name in sys.modules), 'django imported'; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "provisioning.agent", "--help"], capture_output=True, text=True, timeout=60
    )
    assert usage.returncode == 0 and "--key-id" in usage.stdout


def test_a_heartbeat_without_gpus_says_which_field_is_missing(world, fleet):
    client, node = Client(), shared_host()
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    response = send(client, credential.key_id, secret, "POST", "/heartbeat/", {"agent_version": "1"})
    assert response.status_code == 400
    error = response.json()["errors"][0]
    assert error["code"] == "required" and "gpus" in error["detail"]


def test_violations_are_reported_only_for_the_nodes_own_gpus_and_in_shape(world, fleet):
    client, node = Client(), shared_host()
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    bad = send(client, credential.key_id, secret, "POST", "/violations/", {"violations": "all of them"})
    assert bad.status_code == 400
    missing = send(client, credential.key_id, secret, "POST", "/violations/", {"violations": [{"index": 0}]})
    assert missing.status_code == 400
    foreign = send(
        client,
        credential.key_id,
        secret,
        "POST",
        "/violations/",
        {"violations": [{"index": 99, "kind": "foreign_process", "action": "kill_process", "detail": "x"}]},
    )
    assert foreign.status_code == 403
    good = send(
        client,
        credential.key_id,
        secret,
        "POST",
        "/violations/",
        {
            "violations": [
                {"index": 0, "kind": "foreign_process", "action": "kill_process", "detail": "pid 9", "pids": [9]}
            ]
        },
    )
    assert good.status_code == 200 and good.json() == {"recorded": 1}
    answer = send(client, credential.key_id, secret, "POST", "/heartbeat/", heartbeat_body(node))
    assert [p["index"] for p in answer.json()["policy"]] == list(range(node.gpus.count()))


#
# Telemetry: samples and port states on the heartbeat (cloud.telemetry)
#


class InProcessControlPlane:
    """The agent's ControlPlane, signing each request the same way, over Django's test client."""

    def __init__(self, key_id: str, secret: str):
        self.client, self.key_id, self.secret = Client(), key_id, secret

    def call(self, method: str, path: str, payload: dict | None = None) -> dict:
        response = send(self.client, self.key_id, self.secret, method, path, payload)
        if response.status_code >= 400:
            raise ControlPlaneError(f"{method} {path}: {response.status_code} {response.content[:300]!r}")
        return response.json()


def telemetry_agent(node: Node):
    from provisioning.agent.ports import SimulatedPorts

    credential, secret = node_agents.credential_issue(actor=None, node=node)
    ports = SimulatedPorts(list(node.ib_ports.order_by("index").values_list("guid", flat=True)))
    return Agent(InProcessControlPlane(credential.key_id, secret), nvml_of(node), ports=ports), ports


def test_an_agents_heartbeat_carries_samples_and_ports_through_the_signed_api(world, fleet, settings):
    from cloud.models import GPUSample, GPUTelemetry, HCAPortStatus

    settings.MERIDIAN_AGENT_INTERVAL = 7.0
    node = shared_host()
    agent, ports = telemetry_agent(node)
    nvml = agent.nvml
    nvml.set_utilization(0, 80)
    nvml.inject_xid(1, 79)
    nvml.raise_ecc(2, uncorrected=2, corrected=5)
    nvml.overheat(3, 95)
    nvml.gpus[4].processes.append({"pid": 77, "used_memory_mib": 2048})
    down = node.ib_ports.order_by("index").first().guid
    ports.port_down(down)

    assert agent.run_once() == 0
    assert agent.interval == 7.0  # the period comes from the control plane's answer
    latest = {t.gpu.index: t for t in GPUTelemetry.objects.filter(node=node).select_related("gpu")}
    assert len(latest) == node.gpus.count() and GPUSample.objects.filter(gpu__node=node).count() == len(latest)
    assert (latest[0].utilization_pct, latest[0].temperature_c, latest[0].power_w) == (80, 61, 574.0)
    assert (latest[1].xids, latest[2].ecc_uncorrected, latest[2].ecc_corrected) == ([79], 2, 5)
    assert latest[3].temperature_c == 95
    assert (latest[4].processes, latest[4].memory_used_mib) == (1, 2048)
    assert latest[5].memory_total_mib == node.gpus.get(index=5).memory_mib
    links = dict(HCAPortStatus.objects.filter(port__node=node).values_list("port__guid", "link"))
    assert links.pop(down) == "down" and set(links.values()) == {"up"}
    healthy = {g["index"]: g["healthy"] for g in AgentState.objects.get(node=node).gpus}
    assert healthy[2] is False and healthy[0] is True  # an uncorrected ECC error shows in the inventory too

    agent.run_once()
    assert GPUTelemetry.objects.get(gpu__node=node, gpu__index=1).xids == []  # an XID is reported once
    assert GPUSample.objects.filter(gpu__node=node).count() == 2 * len(latest)


def test_xids_of_a_heartbeat_that_did_not_get_through_go_with_the_next(world, fleet):
    from cloud.models import GPUTelemetry

    node = shared_host()
    agent, _ = telemetry_agent(node)
    working = agent.control_plane

    class Down:
        def call(self, method, path, payload=None):
            raise ControlPlaneError("connection refused")

    agent.control_plane = Down()
    agent.nvml.inject_xid(0, 48)
    with pytest.raises(ControlPlaneError):
        agent.run_once()
    agent.control_plane = working
    agent.run_once()
    assert GPUTelemetry.objects.get(gpu__node=node, gpu__index=0).xids == [48]


def test_a_silent_agent_sends_no_heartbeat(world, fleet):
    agent, _ = telemetry_agent(shared_host())
    agent.silent = True
    assert agent.run_once() == 0
    assert not AgentState.objects.exists()


def test_an_agent_that_sends_only_its_inventory_is_still_heard(world, fleet):
    from cloud.models import GPUSample

    client, node = Client(), shared_host()
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    response = send(client, credential.key_id, secret, "POST", "/heartbeat/", heartbeat_body(node))
    assert response.status_code == 200 and response.json()["interval_s"] > 0
    assert AgentState.objects.filter(node=node).exists() and not GPUSample.objects.exists()


TELEMETRY_REFUSED = [
    (lambda body, other: body["samples"][0].update(memory_used_mib=10**6, memory_total_mib=81920), 400, "out_of_range"),
    (lambda body, other: body["samples"][0].update(utilization_pct=-3), 400, "out_of_range"),
    (lambda body, other: body["samples"][0].update(temperature_c=201), 400, "out_of_range"),
    (lambda body, other: body["samples"].append({"uuid": other.gpus.first().uuid}), 400, "too_many"),
    (lambda body, other: body["samples"].__setitem__(0, {"uuid": other.gpus.first().uuid}), 403, "foreign_gpu"),
]


@pytest.mark.parametrize(("change", "status", "code"), TELEMETRY_REFUSED)
def test_bad_telemetry_on_a_heartbeat_is_refused_but_the_node_is_still_alive(world, fleet, change, status, code):
    """
    ENGINEERING.md §7: each is a clean 4xx naming the problem, and none of the telemetry is stored
    (no raw sample, no latest, no port state). The heartbeat's liveness (AgentState) is recorded
    all the same: the agent did call, signed, with its own inventory. Refusing that too made the
    watchdog (suspect after 2 missed periods, faulty after 3) fail a node whose only fault was a
    bad reading, and move every tenant off it.
    """
    from cloud.models import GPUSample, GPUTelemetry, HCAPortStatus

    client, node = Client(), shared_host()
    other = Node.objects.exclude(pk=node.pk).order_by("hostname").first()
    agent, _ = telemetry_agent(node)
    node_agents.heartbeat(node=node, agent_version="0", gpus=heartbeat_body(node)["gpus"])
    AgentState.objects.filter(node=node).update(last_seen_at=timezone.now() - timedelta(minutes=5))
    before = AgentState.objects.get(node=node).last_seen_at
    body = agent.heartbeat()
    change(body, other)
    response = send(client, agent.control_plane.key_id, agent.control_plane.secret, "POST", "/heartbeat/", body)
    assert response.status_code == status, response.content[:300]
    error = response.json()["errors"][0]
    assert error["code"] == code and error["detail"]
    state = AgentState.objects.get(node=node)
    assert state.last_seen_at > before and state.agent_version == body["agent_version"]
    assert (GPUSample.objects.count(), GPUTelemetry.objects.count(), HCAPortStatus.objects.count()) == (0, 0, 0)


@pytest.mark.parametrize(
    ("change", "status", "code"),
    [
        (lambda body, other: body.update(samples="all of them"), 400, "invalid"),
        (lambda body, other: body.update(gpus=[{"uuid": other.gpus.first().uuid}]), 403, "foreign_gpu"),
        (lambda body, other: body.update(gpus=[{"uuid": "GPU-x"}] * 100), 400, "too_many"),
        (lambda body, other: body.update(gpus=[{"uuid": "GPU-x"}] * 100_000), 413, "request_too_large"),
    ],
)
def test_a_malformed_heartbeat_or_a_foreign_inventory_stores_nothing(world, fleet, change, status, code):
    """
    A body of the wrong shape, or an inventory that is not the node's, is not a heartbeat of this
    node's agent as it should be: a clean 4xx, and nothing is recorded, not even liveness (the
    AgentState would carry that inventory). Only refused *telemetry* keeps the liveness (above).
    """
    from cloud.models import GPUSample, GPUTelemetry, HCAPortStatus

    client, node = Client(), shared_host()
    other = Node.objects.exclude(pk=node.pk).order_by("hostname").first()
    agent, _ = telemetry_agent(node)
    body = agent.heartbeat()
    change(body, other)
    response = send(client, agent.control_plane.key_id, agent.control_plane.secret, "POST", "/heartbeat/", body)
    assert response.status_code == status, response.content[:300]
    error = response.json()["errors"][0]
    assert error["code"] == code and error["detail"]
    assert not AgentState.objects.exists()
    assert (GPUSample.objects.count(), GPUTelemetry.objects.count(), HCAPortStatus.objects.count()) == (0, 0, 0)


def test_a_heartbeat_with_unknown_ports_is_heard_and_its_own_telemetry_stored(world, fleet):
    """
    SR-IOV virtual functions (or a newly fitted HCA, or another node's GUID) among the ports: those
    GUIDs are skipped, the rest is stored and the heartbeat answered 200. Refusing them (403
    foreign_port) refused every heartbeat of such a host, and the watchdog failed it.
    """
    from cloud.models import GPUSample, HCAPortStatus

    client, node = Client(), shared_host()
    other = Node.objects.exclude(pk=node.pk).order_by("hostname").first()
    agent, _ = telemetry_agent(node)
    body = agent.heartbeat()
    body["ports"] += [
        {"guid": "0x00000000000000ab", "link": "up"},
        {"guid": other.ib_ports.first().guid, "link": "down"},
    ]
    response = send(client, agent.control_plane.key_id, agent.control_plane.secret, "POST", "/heartbeat/", body)
    assert response.status_code == 200, response.content[:300]
    assert AgentState.objects.filter(node=node).exists()
    assert GPUSample.objects.filter(gpu__node=node).count() == node.gpus.count()
    assert set(HCAPortStatus.objects.values_list("port__node", flat=True)) == {node.pk}
    assert HCAPortStatus.objects.count() == node.ib_ports.count()


#
# The isolation policy on the heartbeat: sent again only when it changed
#


def live_vm(world, steps) -> Instance:
    """A tenant's VM, active on a shared host: the host's policy names it."""
    from tests.provisioning.pipeline import SSH_KEY

    response = world.client("t1_member").post(
        "/api/v1/reservations/",
        {
            "name": "vm",
            "offering": vm_offering(1).slug,
            "gpus": 1,
            "regions": ["us-east-1"],
            "duration_hours": 1,
            "ssh_public_key": SSH_KEY,
        },
        format="json",
    )
    steps.run()
    return Instance.objects.get(reservation_id=response.json()["id"], state="active")


def test_a_policy_the_agent_holds_is_not_sent_again_until_it_changes(world, fleet, steps):
    instance = live_vm(world, steps)
    node, index = instance.node, instance.devices[0]["index"]
    client = Client()
    credential, secret = node_agents.credential_issue(actor=None, node=node)

    first = send(client, credential.key_id, secret, "POST", "/heartbeat/", heartbeat_body(node)).json()
    held = first["policy_version"]
    assert first["policy"][index]["owners"] == {instance.name: None}
    again = send(
        client, credential.key_id, secret, "POST", "/heartbeat/", {**heartbeat_body(node), "policy_version": held}
    ).json()
    assert "policy" not in again and again["policy_version"] == held
    assert again["ok"] is True and again["interval_s"] > 0

    # The runtime names the VM's processes by another id: the policy changed, and comes back.
    Instance.objects.filter(pk=instance.pk).update(runtime_uid="0f6c1b9e-2d4a-4c8e-9b1a-3e5d7f9a1c2b")
    renamed = send(
        client, credential.key_id, secret, "POST", "/heartbeat/", {**heartbeat_body(node), "policy_version": held}
    ).json()
    assert renamed["policy_version"] != held
    assert renamed["policy"][index]["aliases"] == {"0f6c1b9e-2d4a-4c8e-9b1a-3e5d7f9a1c2b": instance.name}

    # The tenant releases the VM: its GPU has no owner in the very next answer (no cache to expire).
    world.client("t1_member").post(f"/api/v1/reservations/{instance.reservation_id}/release/")
    steps.run()
    assert Instance.objects.get(pk=instance.pk).state == "released"
    released = send(
        client,
        credential.key_id,
        secret,
        "POST",
        "/heartbeat/",
        {**heartbeat_body(node), "policy_version": renamed["policy_version"]},
    ).json()
    assert released["policy_version"] not in (held, renamed["policy_version"])
    assert released["policy"][index]["owners"] == {} and released["policy"][index]["aliases"] == {}
    assert released["policy"] == node_agents.node_policy(node=node)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the heartbeat's one read is PostgreSQL's")
def test_a_signed_heartbeat_is_two_statements_and_its_one_read_is_the_separate_reads(world, fleet, steps):
    """
    The key, its node, what is stored of the node and its desired state are one read; the nonce
    spent, the liveness and the telemetry are one write: two statements whatever the GPUs.
    """
    from django.test.utils import CaptureQueriesContext

    from cloud import telemetry

    instance = live_vm(world, steps)  # a policy with an owner in it
    node = instance.node
    agent, _ = telemetry_agent(node)
    agent.nvml.set_utilization(0, 55)
    assert agent.run_once() == 0  # the first turn: the whole policy
    key_id = node.agent_credential.key_id
    secret, same, read = node_agents._credential(key_id, turn=True)
    assert same == node and read.known == telemetry.node_known(node) and read.desired == node_agents._desired(node)
    assert read.known.gpus[0][3] is not None  # the sample just stored is in it
    with CaptureQueriesContext(connection) as queries:
        assert agent.run_once() == 0
    assert len(queries) == 2, [q["sql"][:120] for q in queries]
    assert agent.policy[instance.devices[0]["index"]]["owners"] == {instance.name: None}


def test_a_reset_its_own_heartbeat_asked_for_is_in_that_heartbeats_answer(world, fleet):
    """
    XID 48 on a sample makes failure detection enqueue a GPU reset: the answer to that very
    heartbeat says commands wait (the desired state is read again when detection acted), so the
    agent runs the reset in the same turn instead of one period later.
    """
    node = shared_host()
    agent, _ = telemetry_agent(node)
    assert agent.run_once() == 0  # a clean turn first: no command
    agent.nvml.inject_xid(3, 48)
    assert agent.run_once() == 1  # the reset pulled and run in the turn that reported the XID
    assert AgentCommand.objects.filter(node=node, kind="reset_gpu", state="done").count() == 1


def test_an_agent_that_sends_no_policy_version_gets_the_whole_policy_every_time(world, fleet):
    client, node = Client(), shared_host()
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    answers = [
        send(client, credential.key_id, secret, "POST", "/heartbeat/", heartbeat_body(node)).json() for _ in range(2)
    ]
    for answer in answers:
        assert [p["index"] for p in answer["policy"]] == list(range(node.gpus.count()))
    assert answers[0]["policy_version"] == answers[1]["policy_version"]
    # A version that is not the current one (a stale or made-up one) gets the whole policy too.
    other = send(
        client,
        credential.key_id,
        secret,
        "POST",
        "/heartbeat/",
        {**heartbeat_body(node), "policy_version": "not-a-version"},
    ).json()
    assert other["policy"] == answers[0]["policy"]
    bad = send(client, credential.key_id, secret, "POST", "/heartbeat/", {**heartbeat_body(node), "policy_version": 7})
    assert bad.status_code == 400 and "policy_version" in bad.json()["errors"][0]["detail"]


def test_the_agent_enforces_the_policy_it_holds_when_the_answer_leaves_it_out(world, fleet, steps):
    from provisioning.agent.agent import simulated_host
    from security.models import Incident

    instance = live_vm(world, steps)
    node, index = instance.node, instance.devices[0]["index"]
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    answers = []

    class Recording(InProcessControlPlane):
        def call(self, method, path, payload=None):
            answer = super().call(method, path, payload)
            if path == "/heartbeat/":
                answers.append(answer)
            return answer

    nvml = nvml_of(node)
    owner, kill = simulated_host(nvml)
    agent = Agent(Recording(credential.key_id, secret), nvml, process_owner=owner, kill=kill)
    agent.run_once()
    assert "policy" in answers[0] and agent.policy_version == answers[0]["policy_version"]
    nvml.gpus[index].processes = [
        {"pid": 100, "used_memory_mib": 1000, "owner": instance.name},
        {"pid": 666, "used_memory_mib": 1000, "owner": "r000000000000-0"},
    ]
    agent.run_once()
    assert "policy" not in answers[1]  # unchanged: not sent again ...
    assert [p["pid"] for p in nvml.gpus[index].processes] == [100]  # ... and still enforced
    assert Incident.objects.filter(kind="isolation_foreign_process", node_id=node.pk).count() == 1


def test_a_control_plane_without_policy_versions_still_drives_the_agent():
    """An older control plane answers the policy every time and no version: the agent takes each."""
    agent = Agent(None, SimulatedNVML([SimulatedGPU(index=0, uuid="GPU-0", memory_mib=81920)]))
    agent.policy_take({"ok": True, "policy": [{"index": 0, "owners": {"vm-a": None}}]})
    assert agent.policy == [{"index": 0, "owners": {"vm-a": None}}] and agent.policy_version is None
    assert "policy_version" not in agent.heartbeat()
    agent.policy_take({"ok": True, "policy_version": "v2", "policy": []})
    assert agent.policy == [] and agent.heartbeat()["policy_version"] == "v2"
    # A version it does not hold, without the policy: keep enforcing the held one, ask for it whole next.
    agent.policy_take({"ok": True, "policy_version": "v3"})
    assert agent.policy == [] and "policy_version" not in agent.heartbeat()


#
# Authentication stays strict on the cheaper path
#


def test_a_revoked_key_is_refused(world, fleet):
    client, node = Client(), shared_host()
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    assert send(client, credential.key_id, secret, "POST", "/heartbeat/", heartbeat_body(node)).status_code == 200
    type(credential).objects.filter(pk=credential.pk).update(revoked_at=timezone.now())
    refused = send(client, credential.key_id, secret, "POST", "/heartbeat/", heartbeat_body(node))
    assert refused.status_code == 401 and refused.json()["errors"][0]["code"] == "node_key_invalid"


def test_a_replayed_request_is_refused_even_when_its_telemetry_was(world, fleet):
    """The nonce is spent by the signed request, whatever its handler then answered."""
    client, node = Client(), shared_host()
    agent, _ = telemetry_agent(node)
    body = agent.heartbeat()
    body["samples"][0]["utilization_pct"] = -1
    encoded = json.dumps(body).encode()
    headers = signed_headers(
        agent.control_plane.key_id, agent.control_plane.secret, "POST", f"{API}/heartbeat/", encoded
    )
    assert send(client, None, None, "POST", "/heartbeat/", body, headers=headers).status_code == 400
    replayed = send(client, None, None, "POST", "/heartbeat/", body, headers=headers)
    assert replayed.status_code == 409 and replayed.json()["errors"][0]["code"] == "replayed"


def test_a_replayed_heartbeat_stores_nothing(world, fleet):
    """The nonce is spent in the statement that stores the liveness: a replay writes no liveness, no sample."""
    from cloud.models import GPUSample

    client, node = Client(), shared_host()
    agent, _ = telemetry_agent(node)
    body = agent.heartbeat()
    encoded = json.dumps(body).encode()
    headers = signed_headers(
        agent.control_plane.key_id, agent.control_plane.secret, "POST", f"{API}/heartbeat/", encoded
    )
    assert send(client, None, None, "POST", "/heartbeat/", body, headers=headers).status_code == 200
    seen = AgentState.objects.get(node=node).last_seen_at
    samples = GPUSample.objects.filter(gpu__node=node).count()
    assert samples == node.gpus.count()
    replayed = send(client, None, None, "POST", "/heartbeat/", body, headers=headers)
    assert replayed.status_code == 409 and replayed.json()["errors"][0]["code"] == "replayed"
    assert AgentState.objects.get(node=node).last_seen_at == seen
    assert GPUSample.objects.filter(gpu__node=node).count() == samples
    assert AgentNonce.objects.filter(node=node).count() == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one write of a heartbeat is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_whose_gpu_went_away_since_its_read_still_keeps_the_node_alive(world, fleet):
    """
    The liveness, the nonce and the telemetry are one write: when the telemetry no longer fits (a
    GPU removed between the read and the write), the node's liveness is stored alone and the
    error raised, as when the liveness was written first.
    """
    from django.db import IntegrityError

    from cloud.models import GPU

    node = shared_host()
    agent, _ = telemetry_agent(node)
    body = agent.heartbeat()
    encoded = json.dumps(body).encode()
    path = f"{API}/heartbeat/"
    headers = signed_headers(agent.control_plane.key_id, agent.control_plane.secret, "POST", path, encoded)
    signed, read = node_agents.authenticate(method="POST", path=path, headers=headers, body=encoded, turn=True)
    GPU.objects.filter(node=node, index=0).delete()
    with pytest.raises(IntegrityError):
        node_agents.agent_turn(node=signed, agent_version="2", gpus=body["gpus"], samples=body["samples"],
                               ports=body["ports"], read=read)
    assert AgentState.objects.get(node=node).agent_version == "2"
    assert AgentNonce.objects.filter(node=node).count() == 1  # spent: the same request again is a replay


def test_a_stale_request_is_refused_before_its_nonce_is_spent(world, fleet):
    client, node = Client(), shared_host()
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    stale = send(client, credential.key_id, secret, "POST", "/heartbeat/", heartbeat_body(node), now=time.time() + 3600)
    assert stale.status_code == 401 and stale.json()["errors"][0]["code"] == "stale"
    assert not AgentNonce.objects.exists() and not AgentState.objects.exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the threads share a server's test database only")
@pytest.mark.django_db(transaction=True)
def test_copies_of_a_request_arriving_at_once_are_heard_once(world, fleet):
    """Replay protection holds under concurrency: the nonce's unique row admits one copy."""
    import threading

    node = shared_host()
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    body = json.dumps(heartbeat_body(node)).encode()
    headers = signed_headers(credential.key_id, secret, "POST", f"{API}/heartbeat/", body)
    start, codes = threading.Barrier(4), []

    def post():
        try:
            start.wait(timeout=30)
            codes.append(
                Client()
                .generic("POST", f"{API}/heartbeat/", body, content_type="application/json", headers=headers)
                .status_code
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=post) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(codes) == [200, 409, 409, 409]
    assert AgentNonce.objects.filter(node=node).count() == 1


def test_the_agent_asks_for_commands_only_when_the_heartbeat_says_some_wait(world, fleet):
    node = shared_host()
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    calls = []

    class Counting(InProcessControlPlane):
        def call(self, method, path, payload=None):
            calls.append((method, path))
            return super().call(method, path, payload)

    agent = Agent(Counting(credential.key_id, secret), nvml_of(node))
    assert agent.run_once() == 0
    assert calls == [("POST", "/heartbeat/")]  # nothing waits: one request this turn
    command = agent_commands.command_enqueue(node_id=node.pk, kind="inventory", reference="op-9", payload={})
    calls.clear()
    assert agent.run_once() == 1
    assert calls == [("POST", "/heartbeat/"), ("GET", "/commands/"), ("POST", f"/commands/{command.pk}/result/")]
    assert AgentCommand.objects.get(pk=command.pk).state == "done"
    # A command sent but never answered (the answer was lost) still counts as waiting: it is sent again.
    lost = agent_commands.command_enqueue(node_id=node.pk, kind="inventory", reference="op-10", payload={})
    AgentCommand.objects.filter(pk=lost.pk).update(state="sent")
    client = Client()
    answer = send(client, credential.key_id, secret, "POST", "/heartbeat/", heartbeat_body(node)).json()
    assert answer["commands_waiting"] is True


class _Misbehaving(BaseHTTPRequestHandler):
    """A control plane that answers badly: a body cut short, an HTML page, a JSON list."""

    def log_message(self, format, *args):  # noqa: A002 -- the stdlib's signature
        pass

    def do_POST(self):  # noqa: N802 -- the stdlib's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = {"/api/agent/v1/cut/": b'{"ok": tr', "/api/agent/v1/html/": b"<html>Bad gateway</html>",
                "/api/agent/v1/list/": b"[1, 2]"}[self.path]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body) + (100 if self.path.endswith("cut/") else 0)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True


@pytest.mark.parametrize("path", ["/cut/", "/html/", "/list/"])
def test_a_bad_answer_is_a_control_plane_error_not_a_crash(path):
    """The agent loop survives what a control plane under load or a proxy may send back."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Misbehaving)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        control_plane = ControlPlane(f"http://127.0.0.1:{server.server_address[1]}", "nk_test", "secret", timeout=5)
        with pytest.raises(ControlPlaneError):
            control_plane.call("POST", path, {"ping": True})
    finally:
        server.shutdown()
        server.server_close()
