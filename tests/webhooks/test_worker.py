"""Webhooks sent by a real Celery worker on RabbitMQ: an event fanned out, delivered signed, once."""

from __future__ import annotations

import time

import pytest

from tenants.notifications import notify
from tests.test_celery_worker import worker_on_rabbitmq
from tests.webhooks.receiver import Receiver
from webhooks import services, signing
from webhooks.models import WebhookDelivery

pytestmark = pytest.mark.slow


@pytest.mark.django_db(transaction=True)
def test_a_worker_dispatches_and_delivers_an_event_once(world):
    with Receiver() as receiver:
        endpoint, secret = services.endpoint_create(actor=world.principal("t1_admin"), url=receiver.url,
                                                    event_types=["budget.*"])
        notify(world.t1.tenant, kind="budget.crossed", title="80 % of the budget", body="")
        with worker_on_rabbitmq() as (worker, send):
            send("webhooks.dispatch")
            deadline = time.monotonic() + 60
            while not receiver.received:
                assert worker.poll() is None, worker.stdout.read()
                assert time.monotonic() < deadline, "the worker did not deliver the event in 60 s"
                time.sleep(0.2)
            send("webhooks.dispatch")  # nothing new: nothing sent twice
            send("webhooks.sweep")
            time.sleep(2)
    got = receiver.received
    assert len(got) == 1 and got[0]["json"]["type"] == "budget.crossed"
    assert signing.verify(secret, got[0]["headers"]["Meridian-Signature"], got[0]["body"], now=int(time.time()))
    assert WebhookDelivery.objects.get(endpoint=endpoint).state == "delivered"
