"""The health probe asks the replica itself: a 2xx on its port and path is healthy; anything else is not."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import SimpleNamespace

import pytest

from inference.probes import healthy


class Replica(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 -- the standard library's name
        self.send_response(200 if self.path == "/healthz" else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def port():
    server = HTTPServer(("127.0.0.1", 0), Replica)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def instance(state="active", node_state="available", ip="127.0.0.1"):
    return SimpleNamespace(state=state, private_ip=ip, node=SimpleNamespace(state=node_state))


def test_the_http_probe_asks_the_replica(settings, port):
    settings.MERIDIAN_ENDPOINT_PROBE = "http"
    assert healthy(instance(), port=port, path="/healthz")
    assert not healthy(instance(), port=port, path="/broken")  # a 503
    assert not healthy(instance(), port=1, path="/healthz")  # nothing listens
    assert not healthy(instance(node_state="suspect"), port=port, path="/healthz")  # never on an unsound node
    assert not healthy(instance(state="provisioning"), port=port, path="/healthz")


def test_the_simulated_probe_takes_an_active_instance_on_a_sound_node(settings):
    settings.MERIDIAN_ENDPOINT_PROBE = "simulated"
    assert healthy(instance(), port=8000, path="/healthz")
    assert not healthy(instance(node_state="faulty"), port=8000, path="/healthz")
