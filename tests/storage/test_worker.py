"""A volume's steps run by a real Celery worker on RabbitMQ against the test database: made, then deleted."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
from celery import Celery

from cloud.models import Region
from storage.catalogue import default_storage_classes
from storage.drivers.simulated import SimulatedStorage
from storage.models import Volume
from storage.services import volume_create, volume_delete
from tests.test_celery_worker import BROKER, REPO, database_url_of_tests

pytestmark = pytest.mark.slow


def wait_for(volume_id, state: str, worker) -> Volume:
    deadline = time.monotonic() + 60
    while (volume := Volume.objects.get(pk=volume_id)).state != state:
        assert worker.poll() is None, worker.stdout.read()
        assert time.monotonic() < deadline, f"the worker did not bring the volume to {state} in 60 s"
        time.sleep(0.2)
    return volume


@pytest.mark.django_db(transaction=True)
def test_a_worker_makes_and_removes_a_volume_on_its_backend(world):
    region, _ = Region.objects.get_or_create(slug="us-east-1", defaults={"name": "US East"})
    shared = next(c for c in default_storage_classes(region) if c.kind == "shared_fs")
    actor = world.principal("t1_member")
    volume = volume_create(actor=actor, storage_class=shared, name="ckpt", size_gib=200)
    queue = f"meridian-test-{uuid.uuid4().hex[:12]}"
    env = {**os.environ, "DATABASE_URL": database_url_of_tests(), "CELERY_BROKER_URL": BROKER,
           "MERIDIAN_CELERY_QUEUE": queue}
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "--queues", queue, "--concurrency", "1",
         "--without-mingle", "--without-gossip", "--without-heartbeat", "--loglevel", "WARNING",
         "--hostname", f"{queue}@%h"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        producer = Celery(broker=BROKER, set_as_current=False)
        producer.send_task("storage.volume_converge", args=[str(volume.pk)], queue=queue)
        wait_for(volume.pk, "available", worker)
        assert SimulatedStorage.state(volume.backend_ref)["size_gib"] == 200
        volume_delete(actor=actor, volume=volume)
        producer.send_task("storage.volume_converge", args=[str(volume.pk)], queue=queue)
        gone = wait_for(volume.pk, "deleted", worker)
        assert gone.wrapped_key == "" and SimulatedStorage.state(volume.backend_ref) == {}
    finally:
        worker.terminate()
        worker.wait(timeout=30)
