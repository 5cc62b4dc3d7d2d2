"""The meter run by a real Celery worker on RabbitMQ against the test database, twice: every second once."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.meter import hour_floor
from billing.models import MeterState, UsageRecord
from billing.reconcile import reconcile
from tests.billing.test_meter import ran
from tests.test_celery_worker import worker_on_rabbitmq

pytestmark = pytest.mark.slow


@pytest.mark.django_db(transaction=True)
def test_a_worker_meters_the_closed_windows_and_a_second_run_adds_nothing(world):
    now = hour_floor(timezone.now())
    ran(world, start=now - timedelta(hours=5, minutes=20), end=now - timedelta(minutes=1))
    with worker_on_rabbitmq() as (worker, send):
        send("billing.meter")
        deadline = time.monotonic() + 60
        while not MeterState.objects.filter(metered_until=now).exists():
            assert worker.poll() is None, worker.stdout.read()
            assert time.monotonic() < deadline, "the worker did not meter the closed windows in 60 s"
            time.sleep(0.2)
        written = UsageRecord.objects.count()
        send("billing.meter")
        time.sleep(2)
    assert written == 12 and UsageRecord.objects.count() == written
    assert reconcile(now - timedelta(days=1), now) == []
