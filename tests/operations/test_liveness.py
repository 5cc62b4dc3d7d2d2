"""
Liveness pings through the signed node API (operations.node_api.liveness): a run begun by a start
ping, each ping counted only above its run's last sequence (a copy or an overtaken ping changes
nothing), a stop that hands the node back to its heartbeats, every bad input a 400 that stores
nothing, and a ping that costs the key check and one statement.
"""

import json
import time

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from cloud.models import Node
from operations.node_api import agents as node_agents
from provisioning.agent.signing import signed_headers
from provisioning.models import AgentState
from tests.provisioning.test_node_agent import API, send, shared_host
from tests.world import small_fleet

RUN = "3f2a9c1d0e4b5a67"


@pytest.fixture
def fleet(world):
    return small_fleet(4)


@pytest.fixture
def agent(fleet):
    """A shared host's key, and its agent heard once (its AgentState exists, as after its first heartbeat)."""
    node = shared_host()
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    node_agents.heartbeat(node=node, agent_version="1", gpus=[])
    return node, credential.key_id, secret


def ping_body(seq: int, **fields) -> dict:
    return {"run": RUN, "seq": seq, "sent_at": time.time(), "rtt_ms": None, "failed": 0, **fields}


def ping(agent, seq: int, **fields):
    node, key_id, secret = agent
    return send(Client(), key_id, secret, "POST", "/alive/", ping_body(seq, **fields))


def state(node) -> AgentState:
    return AgentState.objects.get(node=node)


def code(response) -> str:
    return response.json()["errors"][0]["code"]


def test_a_run_begun_by_a_start_ping_counts_each_newer_ping_once(agent, settings):
    node = agent[0]
    begun = ping(agent, 1, start=True)
    assert begun.status_code == 200 and begun.json() == {"ok": True, "liveness_s": settings.MERIDIAN_LIVENESS_SECONDS}
    first = state(node)
    assert first.ping_run == RUN and first.ping_seq == 1 and first.alive_at is not None
    assert ping(agent, 2, rtt_ms=35, failed=3).status_code == 200
    second = state(node)
    assert (second.ping_seq, second.ping_rtt_ms, second.ping_failed) == (2, 35, 3)
    assert second.alive_at >= first.alive_at and second.ping_sent_at is not None
    assert second.last_seen_at == first.last_seen_at  # the heartbeat's own time is left alone

    body = json.dumps(ping_body(3)).encode()
    headers = signed_headers(agent[1], agent[2], "POST", f"{API}/alive/", body)
    assert send(Client(), None, None, "POST", "/alive/", json.loads(body), headers=headers).status_code == 200
    copy = send(Client(), None, None, "POST", "/alive/", json.loads(body), headers=headers)
    assert copy.status_code == 409 and code(copy) == "ping_refused"
    overtaken = ping(agent, 2)
    assert overtaken.status_code == 409 and code(overtaken) == "ping_refused"
    other_run = ping(agent, 9, run="another-run")
    assert other_run.status_code == 409 and code(other_run) == "ping_refused"
    assert state(node).ping_seq == 3 and state(node).ping_run == RUN


def test_a_copy_of_a_start_ping_is_refused_as_a_replay(agent):
    body = ping_body(1, start=True)
    headers = signed_headers(agent[1], agent[2], "POST", f"{API}/alive/", json.dumps(body).encode())
    assert send(Client(), None, None, "POST", "/alive/", body, headers=headers).status_code == 200
    assert ping(agent, 2).status_code == 200
    replayed = send(Client(), None, None, "POST", "/alive/", body, headers=headers)  # would restart the run at 1
    assert replayed.status_code == 409 and code(replayed) == "replayed"
    assert state(agent[0]).ping_seq == 2


def test_a_stop_ping_ends_the_run_and_a_new_run_begins_with_a_start(agent):
    node = agent[0]
    assert ping(agent, 1, start=True).status_code == 200
    assert ping(agent, 2, stop=True).status_code == 200
    assert state(node).ping_run == ""
    after = ping(agent, 3)
    assert after.status_code == 409 and code(after) == "ping_refused"
    assert ping(agent, 1, start=True, run="next-run").status_code == 200
    assert state(node).ping_run == "next-run" and state(node).ping_seq == 1


def test_a_ping_before_the_agents_first_heartbeat_is_refused_and_stores_nothing(fleet):
    node = shared_host()
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    refused = send(Client(), credential.key_id, secret, "POST", "/alive/", ping_body(1, start=True))
    assert refused.status_code == 409 and code(refused) == "ping_refused"
    assert not AgentState.objects.filter(node=node).exists()


def test_unsigned_altered_or_stale_pings_are_refused(agent):
    node, key_id, secret = agent
    unsigned = Client().post(f"{API}/alive/", ping_body(1, start=True), content_type="application/json")
    assert unsigned.status_code == 401 and code(unsigned) == "node_auth_required"
    wrong = send(Client(), key_id, "not-the-secret", "POST", "/alive/", ping_body(1, start=True))
    assert wrong.status_code == 401 and code(wrong) == "signature_invalid"
    body = ping_body(1, start=True)
    headers = signed_headers(key_id, secret, "POST", f"{API}/alive/", json.dumps(body).encode())
    altered = send(Client(), None, None, "POST", "/alive/", {**body, "seq": 99}, headers=headers)
    assert altered.status_code == 401 and code(altered) == "signature_invalid"
    stale = send(Client(), key_id, secret, "POST", "/alive/", ping_body(1, start=True), now=time.time() - 600)
    assert stale.status_code == 401 and code(stale) == "stale"
    assert state(node).ping_run == "" and state(node).alive_at is None


def test_a_key_pings_for_its_own_node_only(fleet):
    nodes = list(Node.objects.order_by("hostname")[:2])
    keys = [node_agents.credential_issue(actor=None, node=node) for node in nodes]
    for node in nodes:
        node_agents.heartbeat(node=node, agent_version="1", gpus=[])
    credential, secret = keys[0]
    assert send(Client(), credential.key_id, secret, "POST", "/alive/", ping_body(1, start=True)).status_code == 200
    assert AgentState.objects.get(node=nodes[0]).ping_run == RUN
    other = AgentState.objects.get(node=nodes[1])
    assert other.ping_run == "" and other.alive_at is None


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"run": None}, "required"),
        ({"seq": None}, "required"),
        ({"sent_at": None}, "required"),
        ({"run": ""}, "invalid"),
        ({"run": "x" * 33}, "invalid"),
        ({"run": "not/a/run"}, "invalid"),
        ({"run": 7}, "invalid"),
        ({"seq": 0}, "invalid"),
        ({"seq": "1"}, "invalid"),
        ({"seq": True}, "invalid"),
        ({"seq": 1.5}, "invalid"),
        ({"seq": 2**62 + 1}, "invalid"),
        ({"sent_at": "now"}, "invalid"),
        ({"sent_at": 12.0}, "invalid"),
        ({"sent_at": float("nan")}, "invalid"),
        ({"rtt_ms": -1}, "invalid"),
        ({"rtt_ms": "fast"}, "invalid"),
        ({"failed": -1}, "invalid"),
        ({"failed": None}, "invalid"),
        ({"start": "yes"}, "invalid"),
        ({"start": True, "stop": True}, "invalid"),
    ],
)
def test_a_malformed_ping_is_a_400_that_stores_nothing(agent, change, expected):
    node, key_id, secret = agent
    body = {**ping_body(1, start=True), **change}
    body = {k: v for k, v in body.items() if not (v is None and k in ("run", "seq", "sent_at"))}
    response = send(Client(), key_id, secret, "POST", "/alive/", body)
    assert response.status_code == 400 and code(response) == expected, response.content
    assert state(node).ping_run == "" and state(node).alive_at is None


@pytest.mark.parametrize("body", [[1, 2], "ping", 7])
def test_a_ping_that_is_not_a_json_object_is_a_400(agent, body):
    response = send(Client(), agent[1], agent[2], "POST", "/alive/", body)
    assert response.status_code == 400 and code(response) == "invalid"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one statement is PostgreSQL's")
def test_a_ping_is_the_key_check_and_one_statement(agent):
    """The key with its node is one read; the ping one write -- a start spends its nonce in that write too."""
    with CaptureQueriesContext(connection) as queries:
        assert ping(agent, 1, start=True).status_code == 200
    assert len(queries) == 2, [q["sql"][:120] for q in queries]
    with CaptureQueriesContext(connection) as queries:
        assert ping(agent, 2).status_code == 200
    assert len(queries) == 2, [q["sql"][:120] for q in queries]
    assert queries[1]["sql"].lstrip().startswith("WITH alive AS (UPDATE")


def test_the_heartbeats_answer_says_how_often_to_ping(agent, settings):
    node, key_id, secret = agent
    body = {"agent_version": "1", "gpus": []}
    assert send(Client(), key_id, secret, "POST", "/heartbeat/", body).json()["liveness_s"] == 2.0
    settings.MERIDIAN_LIVENESS_SECONDS = 0
    assert send(Client(), key_id, secret, "POST", "/heartbeat/", body).json()["liveness_s"] == 0


@pytest.mark.django_db(transaction=True)
def test_a_ping_outside_a_transaction_commits_on_its_own(world):
    """The node API runs in autocommit: a ping is its own transaction (committed without waiting for the WAL flush)."""
    small_fleet(4)
    node = shared_host()
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    node_agents.heartbeat(node=node, agent_version="1", gpus=[])
    agent = (node, credential.key_id, secret)
    assert ping(agent, 1, start=True).status_code == 200
    assert ping(agent, 2).status_code == 200
    assert ping(agent, 2).status_code == 409
    assert ping(agent, 3, stop=True).status_code == 200
    assert state(node).ping_run == "" and state(node).ping_seq == 3
