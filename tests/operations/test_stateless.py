"""
Web and worker processes keep no state of their own: two of each against one database and one
broker serve one user as one. A session signed in on one web process is signed in on the other;
an idempotent create sent to one and replayed to the other is one reservation; tasks sent to the
queue are shared by both workers and each runs once.
"""

from __future__ import annotations

import re
import time
import uuid

import pytest
import requests
from celery import Celery

from provisioning.models import Reservation
from tests.processes import BROKER, free_port, processes
from tests.world import small_fleet, vm_offering

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
PASSWORD = "stateless-test-password-7"


def gunicorn(port: int) -> tuple[str, ...]:
    return ("-m", "gunicorn", "config.wsgi:application", "--bind", f"127.0.0.1:{port}", "--workers", "1",
            "--threads", "2", "--log-level", "warning")


def worker(name: str, queue: str) -> tuple[str, ...]:
    return ("-m", "celery", "-A", "config", "worker", "--queues", queue, "--concurrency", "1",
            "--prefetch-multiplier", "1", "--without-mingle", "--without-gossip", "--loglevel", "INFO",
            "--hostname", f"{name}@%h")


def wait_ready(base: str, process) -> None:
    deadline = time.monotonic() + 90
    while True:
        assert process.popen.poll() is None, f"{process.name} exited:\n{process.output()}"
        try:
            answer = requests.get(f"{base}/health/ready", timeout=15)
            if answer.status_code == 200:
                return
        except requests.RequestException:  # not listening yet, or busy starting
            pass
        assert time.monotonic() < deadline, f"{base} not ready in 90 s:\n{process.output()}"
        time.sleep(0.3)


def test_two_web_and_two_worker_processes_serve_as_one(world):
    small_fleet(4)
    user = world.users["t1_member"]
    user.set_password(PASSWORD)
    user.save()
    with processes() as start:
        ports = free_port(), free_port()
        webs = [start(f"web-{i}", *gunicorn(port)) for i, port in enumerate(ports)]
        workers = [start(f"worker-{i}", *worker(f"w{i}", start.queue)) for i in range(2)]
        a, b = (f"http://127.0.0.1:{port}" for port in ports)
        for base, process in zip((a, b), webs, strict=True):
            wait_ready(base, process)
        for process in workers:
            process.wait_for("ready.", timeout=90)

        # A session signed in through one web process is signed in on the other.
        browser = requests.Session()
        form = browser.get(f"{a}/login/", timeout=10)
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
        signed_in = browser.post(f"{a}/login/", data={"username": user.email, "password": PASSWORD,
                                                      "csrfmiddlewaretoken": csrf},
                                 headers={"Referer": f"{a}/login/"}, timeout=10, allow_redirects=False)
        assert signed_in.status_code == 302, signed_in.text[:500]
        page = browser.get(f"{b}/", timeout=10)
        assert page.status_code == 200 and "/login/" not in page.url and user.email in page.text

        # One idempotent create, sent to one and replayed to the other, is one reservation.
        token = {"Authorization": f"Bearer {world.tokens['t1_member']}", "Idempotency-Key": str(uuid.uuid4())}
        body = {"name": "twice", "offering": vm_offering().slug, "gpus": 1, "regions": ["us-east-1"],
                "duration_hours": 1}
        first = requests.post(f"{a}/api/v1/reservations/", json=body, headers=token, timeout=30)
        again = requests.post(f"{b}/api/v1/reservations/", json=body, headers=token, timeout=30)
        assert first.status_code == 201, first.text
        assert again.status_code in (200, 201) and again.json()["id"] == first.json()["id"]
        assert Reservation.objects.filter(name="twice").count() == 1
        seen = requests.get(f"{b}/api/v1/reservations/{first.json()['id']}/", headers=token, timeout=10)
        assert seen.status_code == 200

        # Tasks on the shared queue: both workers take some, each runs once.
        producer = Celery(broker=BROKER, set_as_current=False)
        sent = [producer.send_task("tenants.invitation_expire", queue=start.queue).id for _ in range(12)]
        deadline = time.monotonic() + 60

        def ran(process) -> set[str]:
            return {task_id for task_id in sent
                    if any(task_id in line and "succeeded" in line for _, line in list(process.lines))}

        while sum(len(ran(process)) for process in workers) < len(sent):
            assert time.monotonic() < deadline, "\n".join(process.output() for process in workers)
            time.sleep(0.2)
        by_worker = [ran(process) for process in workers]
        assert by_worker[0].isdisjoint(by_worker[1])
        assert all(by_worker), f"one worker ran every task: {[len(s) for s in by_worker]}"
