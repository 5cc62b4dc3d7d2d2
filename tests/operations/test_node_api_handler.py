"""
The node API's own WSGI handler (operations.node_api.handler): a signed heartbeat through the project's WSGI
application takes the short chain and is answered as through the full one; nothing but the node
API can be reached through that handler; every other path still takes the full chain.
"""

import io
import json
import sys

import pytest

from cloud.models import Node
from operations.node_api import agents as node_agents
from operations.node_api.handler import NodeAPIHandler
from provisioning.agent.signing import signed_headers
from tests.world import small_fleet

HEARTBEAT = "/api/agent/v1/heartbeat/"


@pytest.fixture
def application():
    from config.wsgi import application

    return application


def call(application, path: str, body: bytes = b"", method: str = "GET", headers: dict | None = None):
    environ = {
        "REQUEST_METHOD": method, "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "",
        "SERVER_NAME": "testserver", "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "testserver", "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr, "wsgi.url_scheme": "http", "wsgi.version": (1, 0),
        "wsgi.multithread": True, "wsgi.multiprocess": True, "wsgi.run_once": False,
        **{"HTTP_" + name.upper().replace("-", "_"): value for name, value in (headers or {}).items()},
    }
    status, sent = [], []
    response = application(environ, lambda line, response_headers: (status.append(line), sent.append(response_headers)))
    try:
        content = b"".join(response)
    finally:
        response.close()
    return int(status[0].split()[0]), dict(sent[0]), content


def signed_heartbeat(node: Node):
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    inventory = [{"index": g.index, "uuid": g.uuid, "healthy": True} for g in node.gpus.order_by("index")]
    body = json.dumps({"agent_version": "1", "gpus": inventory}).encode()
    return body, signed_headers(credential.key_id, secret, "POST", HEARTBEAT, body)


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_takes_the_short_chain_and_is_answered_in_full(world, application):
    small_fleet(4)
    node = Node.objects.filter(pool="shared").order_by("hostname").first()
    body, headers = signed_heartbeat(node)
    status, sent, content = call(application, HEARTBEAT, body, "POST", headers)
    assert status == 200, content[:300]
    answer = json.loads(content)
    assert answer["ok"] is True and len(answer["policy"]) == node.gpus.count()
    assert "X-Request-ID" in sent and sent["X-Content-Type-Options"] == "nosniff"  # request id, security headers
    assert "Content-Security-Policy" not in sent and "Set-Cookie" not in sent  # no browser middleware ran
    again = call(application, HEARTBEAT, body, "POST", headers)  # the same request again: a replay
    assert again[0] == 409 and json.loads(again[2])["errors"][0]["code"] == "replayed"


@pytest.mark.django_db(transaction=True)  # a WSGI request closes the test's connection when it starts
def test_only_the_node_api_is_reached_through_its_handler(world, application):
    for path in ("/api/agent/v1/nothing/", "/api/agent/../api/v1/reservations/", "/api/agent/../health/"):
        status, sent, content = call(application, path)
        assert status == 404, (path, content[:200])
        assert json.loads(content)["errors"][0]["code"] == "not_found"
    too_big = b"{" + b" " * (2 * 1024 * 1024) + b"}"
    status, _, content = call(application, HEARTBEAT, too_big, "POST")
    assert status == 413 and json.loads(content)["errors"][0]["code"] == "request_too_large"


@pytest.mark.django_db(transaction=True)
def test_every_other_path_takes_the_full_chain(world, application):
    status, sent, _ = call(application, "/login/")
    assert status == 200 and "Content-Security-Policy" in sent  # the browser middleware ran
    assert NodeAPIHandler.urlconf == "operations.node_api.urls"


@pytest.mark.django_db(transaction=True)
def test_detection_that_tells_a_tenant_works_through_the_node_api_handler(world, application, steps):
    """
    XID 48 on a GPU a tenant's VM holds: failure detection, inside the heartbeat, asks the agent
    for a reset and tells the tenant with a link to the reservation -- reversed against the
    project's URLs, not the node API's own URLconf.
    """
    from provisioning.agent.agent import Agent
    from provisioning.models import AgentCommand
    from tenants.models import Notification
    from tests.provisioning.test_node_agent import live_vm, nvml_of

    small_fleet(4)
    instance = live_vm(world, steps)
    node, index = instance.node, instance.devices[0]["index"]
    credential, secret = node_agents.credential_issue(actor=None, node=node)
    nvml = nvml_of(node)
    nvml.inject_xid(index, 48)
    body = json.dumps(Agent(None, nvml, hostname=node.hostname).heartbeat()).encode()
    before = set(Notification.objects.values_list("pk", flat=True))
    status, _, content = call(application, HEARTBEAT, body, "POST",
                              signed_headers(credential.key_id, secret, "POST", HEARTBEAT, body))
    assert status == 200, content[:300]
    assert json.loads(content)["commands_waiting"] is True
    assert AgentCommand.objects.filter(node=node, kind="reset_gpu").count() == 1
    [told] = Notification.objects.exclude(pk__in=before)  # the one this heartbeat's detection sent
    assert told.tenant_id == instance.tenant_id and told.link == f"/reservations/{instance.reservation_id}/"


@pytest.mark.django_db(transaction=True)
def test_a_host_not_allowed_is_refused_by_the_node_api_handler(world, application):
    status, _, _ = call(application, HEARTBEAT, b"{}", "POST", {"Host": "attacker.example"})
    assert status == 400
