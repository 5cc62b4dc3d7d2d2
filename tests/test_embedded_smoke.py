"""
The embedded-mode smoke test: the README's run command on a fresh data folder, as a user would.

Starts ``make run``, waits for the banner, signs in as a demo user through the login form,
calls the API with the session and with a new token, stops with SIGINT (Ctrl-C), and checks
that every process it started has exited.
"""

import http.cookiejar
import json
import os
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from config.demo import DEMO_PASSWORD

REPO = Path(__file__).resolve().parent.parent
# Settings of the test run that must not reach the embedded run.
NOT_INHERITED = {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE", "MERIDIAN_DATA_DIR", "REDIS_URL",
                 "MERIDIAN_ENCRYPTION_KEYS", "MERIDIAN_SECURE_TRANSPORT", "DJANGO_ALLOWED_HOSTS", "MAKEFLAGS",
                 "MAKELEVEL", "MFLAGS", "PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST"}

pytestmark = [pytest.mark.smoke, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(root: int) -> set[int]:
    """Every live process below ``root``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int, marker: bytes = b"") -> bool:
    """
    The process runs (not a zombie) and, with ``marker``, has it in its environment: still one of
    this test's, not another process that got a pid it saw (pids are reused, and a busy suite wraps
    a pid_max of 32768 within minutes; a parallel test's worker must not be killed here).
    """
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        environ = Path(f"/proc/{pid}/environ").read_bytes() if marker else b""
    except OSError:
        return False
    return state != "Z" and marker in environ


def test_run_command_serves_console_and_api_and_stops_cleanly(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    env["MERIDIAN_DATA_DIR"] = str(tmp_path / "data")
    ours = f"MERIDIAN_DATA_DIR={env['MERIDIAN_DATA_DIR']}".encode()  # in every process make run starts
    log_path = tmp_path / "run.log"
    with open(log_path, "w") as log:
        run = subprocess.Popen(["make", "run", f"PORT={port}"], cwd=REPO, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    started = set()
    try:
        deadline = time.monotonic() + 300
        while "Meridian is running" not in log_path.read_text():
            assert run.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "no banner in time:\n" + log_path.read_text()[-3000:]
            time.sleep(0.5)
        started = descendants(run.pid)
        assert len(started) >= 4, "make, the supervisor, web, worker and beat should be running"
        base = f"http://127.0.0.1:{port}"
        assert "alice@acme.example" in log_path.read_text()

        jar = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        browser.open(f"{base}/login/").read()
        csrf = next(c.value for c in jar if c.name == "csrftoken")
        form = urllib.parse.urlencode({"username": "alice@acme.example", "password": DEMO_PASSWORD,
                                       "csrfmiddlewaretoken": csrf}).encode()
        home = browser.open(urllib.request.Request(f"{base}/login/", data=form, headers={"Referer": f"{base}/login/"}))
        assert b"Acme AI" in home.read()

        me = json.load(browser.open(f"{base}/api/v1/me/"))
        assert me["email"] == "alice@acme.example"
        assert me["acting_as"]["role"] == "owner"

        csrf = next(c.value for c in jar if c.name == "csrftoken")
        created = browser.open(urllib.request.Request(
            f"{base}/api/v1/api-tokens/", data=json.dumps({"name": "smoke", "scope": "read"}).encode(),
            headers={"Content-Type": "application/json", "X-CSRFToken": csrf, "Referer": f"{base}/"},
        ))
        token = json.load(created)["token"]
        offerings = json.load(urllib.request.urlopen(urllib.request.Request(
            f"{base}/api/v1/offerings/", headers={"Authorization": f"Bearer {token}"})))
        assert offerings["count"] > 0
        # every kind of the demo fleet is for sale somewhere (bare metal and VMs are counted apart)
        assert {o["kind"] for o in offerings["results"] if o["availability"]} >= {"bare_metal", "vm"}

        # A reservation through the API: placed at once on the embedded default (the fast path)...
        write_token = json.load(browser.open(urllib.request.Request(
            f"{base}/api/v1/api-tokens/", data=json.dumps({"name": "smoke-rw", "scope": "read_write"}).encode(),
            headers={"Content-Type": "application/json", "X-CSRFToken": csrf, "Referer": f"{base}/"},
        )))["token"]

        def api(path, payload=None):
            request = urllib.request.Request(
                f"{base}/api/v1/{path}", data=None if payload is None else json.dumps(payload).encode(),
                headers={"Authorization": f"Bearer {write_token}", "Content-Type": "application/json"})
            return json.load(urllib.request.urlopen(request))

        now = api("reservations/", {"name": "smoke", "offering": "vm-h100x1", "gpus": 1, "regions": ["us-east-1"],
                                    "duration_hours": 1})
        assert now["state"] == "scheduled", now
        # ...and an advance reservation, placed by the scheduler loop within a few cycles.
        tomorrow = (datetime.now(UTC) + timedelta(days=1)).isoformat()
        later = api("reservations/", {"name": "later", "offering": "bm-h100x8", "nodes": 2, "regions": ["us-east-1"],
                                      "duration_hours": 1, "start": tomorrow})
        assert later["state"] in ("queued", "scheduled"), later
        deadline = time.monotonic() + 30
        while api(f"reservations/{later['id']}/")["state"] != "scheduled":
            assert time.monotonic() < deadline, "the scheduler did not place the advance reservation"
            time.sleep(0.5)
        # The worker provisions the first one, step by step, to an instance the tenant can reach.
        # Two minutes: on a loaded two-core CI host the simulated agents can fall silent long
        # enough for the watchdog to hold their nodes suspect for a while (it took over 60 s once).
        deadline = time.monotonic() + 120
        while (state := api(f"reservations/{now['id']}/")["state"]) != "active":
            assert state in ("scheduled", "provisioning"), state
            assert time.monotonic() < deadline, "the worker did not provision the reservation"
            time.sleep(0.5)
        instance = api(f"instances/?reservation={now['id']}")["results"][0]
        assert instance["state"] == "active" and instance["address"] and instance["ssh_user"]
        operation = api(f"operations/?reservation={now['id']}&kind=provision")["results"][0]
        # verify waits (a run per look) until the node's agent answers the attestation challenge.
        assert operation["state"] == "succeeded" and list(dict.fromkeys(s["name"] for s in operation["steps"])) == [
            "define_domain", "start_domain", "join_network", "verify", "hand_over"]
        assert [s["state"] for s in operation["steps"] if s["name"] == "verify"][-1] == "succeeded"
        receipts = api(f"reservations/{now['id']}/receipts/")["results"]
        assert len(receipts) == 1 and receipts[0]["receipt"].count(".") == 2  # signed before the hand-over
        # Released, it is cleaned: the GPU scrub goes through the node's (simulated) agent.
        api(f"reservations/{now['id']}/release/", {})
        deadline = time.monotonic() + 90
        while (state := api(f"reservations/{now['id']}/")["state"]) != "released":
            assert state == "releasing", state
            assert time.monotonic() < deadline, "the release did not finish (is the node agent answering?)"
            time.sleep(0.5)
    except Exception:
        # Shown with the failure: the last lines but the web server's access log (the agents' requests
        # flood it), then whether the supervisor saw a process end.
        lines = [line for line in log_path.read_text().splitlines() if '"GET /' not in line and '"POST /' not in line]
        print("make run's output, last lines but the access log:\n" + "\n".join(lines[-120:]))
        print("processes running:", {pid: alive(pid, ours) for pid in started})
        raise
    finally:
        os.killpg(run.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        try:
            run.wait(timeout=90)
        finally:
            left = [pid for pid in started | descendants(run.pid) if alive(pid, ours)]
            for pid in left:
                os.kill(pid, signal.SIGKILL)
    assert not left, f"processes still running after Ctrl-C: {left}\n" + log_path.read_text()[-3000:]
    assert "Meridian stopped." in log_path.read_text()
