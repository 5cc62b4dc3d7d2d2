"""
Chunked request bodies (``Transfer-Encoding: chunked``, no Content-Length) through gunicorn, as
`make run` and production serve Meridian: read whole under the same size limit as any body.
"""

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from provisioning.models import VPC

REPO = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def database_url_of_tests() -> str:
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.fixture
def gunicorn(tmp_path):
    """gunicorn serving config.wsgi on the test database; yields its port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "DATABASE_URL": database_url_of_tests(), "DJANGO_SETTINGS_MODULE": "tests.settings",
           "MERIDIAN_DATA_DIR": str(tmp_path)}
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "config.wsgi:application", "--bind", f"127.0.0.1:{port}", "--workers", "1",
         "--threads", "2", "--log-level", "warning"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.stdout.read()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "gunicorn did not listen within 60 s"
                time.sleep(0.2)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)


def post_chunked(port: int, path: str, chunks, token: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=iter(chunks), encode_chunked=True, headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json",
            "Transfer-Encoding": "chunked"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def test_a_chunked_create_is_read_whole_and_one_over_the_limit_is_refused(world, gunicorn, settings):
    region = world.t1.objects[VPC].fabric.region.slug  # the world's own VPC makes its region
    body = json.dumps({"name": "chunked", "region": region, "cidr": "10.30.0.0/24", "mtu": 4096,
                       "service_level": 0}).encode()
    status, answer = post_chunked(gunicorn, "/api/v1/vpcs/", [body[:10], body[10:30], body[30:]],
                                  world.tokens["t1_member"])
    assert status == 201, answer
    assert VPC.objects.filter(tenant=world.t1.tenant, name="chunked").exists()

    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    padded = json.dumps({"name": "big", "region": region, "cidr": "10.40.0.0/24", "pad": "x" * limit}).encode()
    status, answer = post_chunked(gunicorn, "/api/v1/vpcs/",
                                  [padded[i:i + 65_536] for i in range(0, len(padded), 65_536)],
                                  world.tokens["t1_member"])
    assert status == 413, answer
    assert answer["errors"][0]["code"] == "request_too_large"
    assert str(limit) in answer["errors"][0]["detail"]
    assert not VPC.objects.filter(name="big").exists()
