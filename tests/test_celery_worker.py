"""
A real Celery worker on RabbitMQ runs a task against the test database.

The worker gets a queue of its own (so parallel test processes never take each other's tasks)
and the test database's URL; the task is sent by a separate producer, as the web process would.
"""

import os
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from django.db import connection
from django.utils import timezone
from kombu import Connection

from tenants.choices import TenantRole
from tenants.models import Invitation

REPO = Path(__file__).resolve().parent.parent
BROKER = os.environ.get("MERIDIAN_TEST_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")

pytestmark = pytest.mark.slow


def database_url_of_tests() -> str:
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@contextmanager
def worker_on_rabbitmq(**settings: str):
    """
    A real worker process (one pool process) on a RabbitMQ queue of its own, against the test
    database, with ``settings`` as environment variables; yields it and ``send(task_name, *args)``,
    which publishes as the web process would. The worker (in a process group of its own, so a test
    can kill it whole) is stopped and its queue deleted afterwards.
    """
    queue = f"meridian-test-{uuid.uuid4().hex[:12]}"
    env = {**os.environ, "DATABASE_URL": database_url_of_tests(), "CELERY_BROKER_URL": BROKER,
           "MERIDIAN_CELERY_QUEUE": queue, **settings}
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "--queues", queue, "--concurrency", "1",
         "--without-mingle", "--without-gossip", "--without-heartbeat", "--loglevel", "WARNING",
         "--hostname", f"{queue}@%h"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    producer = Celery(broker=BROKER, set_as_current=False)  # the project's tasks keep their own app
    try:
        yield worker, lambda name, *args: producer.send_task(name, args=list(args), queue=queue)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        with Connection(BROKER) as conn:
            conn.default_channel.queue_delete(queue)


@pytest.mark.django_db(transaction=True)
def test_worker_on_rabbitmq_runs_the_invitation_expiry_task(world):
    """The beat task sent through RabbitMQ is run by a worker and deletes long-expired invitations."""
    stale = Invitation.objects.create(
        tenant=world.t1.tenant, role=TenantRole.MEMBER, digest=uuid.uuid4().hex,
        expires_at=timezone.now() - timedelta(days=3),
    )
    fresh = world.t1.objects[Invitation]
    with worker_on_rabbitmq() as (worker, send):
        send("tenants.invitation_expire")
        deadline = time.monotonic() + 60
        while Invitation.objects.filter(pk=stale.pk).exists():
            assert worker.poll() is None, worker.stdout.read()
            assert time.monotonic() < deadline, "the worker did not run the task in 60 s"
            time.sleep(0.2)
        assert Invitation.objects.filter(pk=fresh.pk).exists()
