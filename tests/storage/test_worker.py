"""A volume's steps run by a real Celery worker on RabbitMQ against the test database: made, then deleted."""

from __future__ import annotations

import time

import pytest

from cloud.models import Region
from storage.catalogue import default_storage_classes
from storage.drivers.simulated import SimulatedStorage
from storage.models import Volume
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
