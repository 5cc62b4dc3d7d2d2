"""
A Celery worker in a thread of the test process, on kombu's in-memory broker (as tests/browser does):
what a request queues on commit crosses a real message -- headers and all -- to a real worker,
which runs it against the test database. Tests using it need ``django_db(transaction=True)``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from celery.contrib.testing.worker import start_worker
from celery.signals import setup_logging, task_postrun
from django.db import connections

from config.celery import app
from tests.celery_app import app_on_broker


@contextmanager
def worker_thread() -> Iterator[object]:
    queue = f"meridian-config-{uuid.uuid4().hex[:12]}"

    def leave_logging_alone(**_):
        """Celery then keeps its hands off the test run's logging."""

    def close_connections(**_):
        if threading.current_thread() is not threading.main_thread():
            connections.close_all()  # none left open for the flush after the test

    setup_logging.connect(leave_logging_alone, weak=False)
    task_postrun.connect(close_connections, weak=False)
    try:
        with app_on_broker(broker_url="memory://", queue=queue, transport_options={"polling_interval": 0.05}) \
                as connection:
            try:
                with pytest.MonkeyPatch.context() as patch:
                    patch.setenv("CELERY_SKIP_CHECKS", "1")  # Django's checks ran when the suite started
                    with start_worker(app, pool="solo", concurrency=1, perform_ping_check=False,
                                      shutdown_timeout=30, queues=[queue], hostname=f"{queue}@localhost") as worker:
                        yield worker
            finally:
                connection.default_channel.queue_delete(queue)
    finally:
        setup_logging.disconnect(leave_logging_alone)
        task_postrun.disconnect(close_connections)


def wait_for(condition, timeout: float = 20.0):
    """``condition()``'s first truthy answer, polled until ``timeout`` (then an AssertionError)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = condition()
        if answer:
            return answer
        time.sleep(0.05)
    raise AssertionError(f"Not so after {timeout} s: {condition.__doc__ or condition}")


def volume_created_by_a_request(world, monkeypatch, request_id: str):
    """A volume created through the API with ``request_id``; its driver's create logs "Creating <ref>."."""
    from cloud.models import Region
    from storage.catalogue import default_storage_classes
    from storage.drivers.simulated import SimulatedStorage
    from storage.models import Volume
    from tests.world import small_fleet

    small_fleet(4)
    default_storage_classes(Region.objects.get(slug="us-east-1"))
    create = SimulatedStorage.create

    def create_and_say(self, **kwargs):
        logging.getLogger("meridian.test.driver").info("Creating %s.", kwargs["ref"])
        return create(self, **kwargs)

    monkeypatch.setattr(SimulatedStorage, "create", create_and_say)
    response = world.client("t1_member").post(
        "/api/v1/volumes/", {"name": "ckpt", "storage_class": "us-east-1-shared-fs", "size_gib": 500},
        format="json", HTTP_X_REQUEST_ID=request_id)
    assert response.status_code == 201, response.content
    return Volume.objects.get(pk=response.json()["id"])
