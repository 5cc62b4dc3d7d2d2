"""
A real Celery worker on RabbitMQ against the test database: a volume's steps (made, then deleted),
and a checkpoint's move that survives its worker killed midway.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from cloud.models import Region
from storage.catalogue import default_storage_classes
from storage.checkpoints import tier_pass
from storage.drivers.simulated import SimulatedStorage
from storage.models import Checkpoint, CheckpointPolicy, Volume
from storage.services import volume_create, volume_delete
from tests.test_celery_worker import worker_on_rabbitmq

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
    with worker_on_rabbitmq() as (worker, send):
        send("storage.volume_converge", str(volume.pk))
        wait_for(volume.pk, "available", worker)
        assert SimulatedStorage.state(volume.backend_ref)["size_gib"] == 200
        volume_delete(actor=actor, volume=volume)
        send("storage.volume_converge", str(volume.pk))
        gone = wait_for(volume.pk, "deleted", worker)
        assert gone.wrapped_key == "" and SimulatedStorage.state(volume.backend_ref) == {}


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_move_loses_nothing_and_the_next_finishes_it(world):
    """A checkpoint of 24 chunks moves a chunk per run; the worker is killed (its whole process group) midway."""
    region, _ = Region.objects.get_or_create(slug="us-east-1", defaults={"name": "US East"})
    classes = {c.kind: c for c in default_storage_classes(region)}
    actor = world.principal("t1_member")
    fs = volume_create(actor=actor, storage_class=classes["shared_fs"], name="ckpt", size_gib=200)
    cold = volume_create(actor=actor, storage_class=classes["object"], name="archive", size_gib=200)
    driver, mib = SimulatedStorage(), 1024 * 1024
    for volume in (fs, cold):
        driver.create(ref=volume.backend_ref, kind=volume.storage_class.kind, size_gib=200)
    Volume.objects.filter(pk__in=[fs.pk, cold.pk]).update(state="available")
    CheckpointPolicy.objects.create(tenant=world.t1.tenant, volume=fs, cold_volume=cold, keep_hot=0)
    for index in range(24):
        driver.write_chunk(ref=fs.backend_ref, key="checkpoints/step-1/model.pt", index=index, chunk=mib,
                           data=b"x" * mib)
    tier_pass(now=timezone.now() + timedelta(days=2))
    checkpoint = Checkpoint.objects.get()
    slow = {"MERIDIAN_STORAGE_CHUNK_MIB": "1", "MERIDIAN_STORAGE_MOVE_SLICE_SECONDS": "0"}
    with worker_on_rabbitmq(**slow) as (worker, send):
        send("storage.checkpoint_move", str(checkpoint.pk))
        deadline = time.monotonic() + 60
        while Checkpoint.objects.get(pk=checkpoint.pk).moved_bytes < 6 * mib:
            assert worker.poll() is None, worker.stdout.read()
            assert time.monotonic() < deadline, "the worker did not move 6 chunks in 60 s"
            time.sleep(0.05)
        os.killpg(os.getpgid(worker.pid), signal.SIGKILL)
        worker.wait(timeout=10)
    midway = Checkpoint.objects.get(pk=checkpoint.pk)
    assert midway.state == "demoting" and 6 * mib <= midway.moved_bytes < 24 * mib
    with worker_on_rabbitmq(**slow) as (worker, send):
        send("storage.checkpoint_move", str(checkpoint.pk))  # what the reconcile sends for a stalled move
        deadline = time.monotonic() + 90
        while (done := Checkpoint.objects.get(pk=checkpoint.pk)).state != "cold":
            assert worker.poll() is None, worker.stdout.read()
            assert time.monotonic() < deadline, "the next worker did not finish the move in 90 s"
            time.sleep(0.1)
    assert done.moved_bytes == 24 * mib  # no chunk counted twice
    assert sum(f.size for f in driver.files(ref=cold.backend_ref, prefix="").values()) == 24 * mib
    assert driver.files(ref=fs.backend_ref, prefix="checkpoints/") == {}
