"""
Webhooks: a tenant's admins register an endpoint; what happens to the tenant's reservations and
each notice it is sent is delivered, signed, at least once, retried with backoff until the receiver
answers, logged attempt by attempt, disabled after repeated failure; secrets rotate with overlap;
a tenant never receives another tenant's events; bad endpoints are refused.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from billing.budgets import budgets_check
from tenants.events import emit
from tenants.models import Event, Notification
from tenants.notifications import notify
from tests.webhooks.receiver import Receiver
from tests.world import small_fleet, vm_offering
from webhooks import delivery, signing
from webhooks.catalogue import FAMILIES
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db
URL = "/api/v1/webhooks/"


def code(answer) -> str:
    return answer.json()["errors"][0]["code"]


def register(world, url, types=("*",), persona="t1_admin") -> dict:
    answer = world.client(persona).post(URL, {"url": url, "event_types": list(types)}, format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()


def send_all(now=None) -> None:
    """What the beat's dispatch and sweep and the worker do, in the test's process."""
    delivery.dispatch()
    for pk in delivery.due(now):
        delivery.deliver(pk, now)


def test_a_reservations_states_reach_the_endpoint_signed(world):
    small_fleet(4)
    with Receiver() as receiver:
        endpoint = register(world, receiver.url, ["reservation.state"])
        assert endpoint["secret"].startswith("whsec_")
        made = world.client("t1_member").post("/api/v1/reservations/", {
            "name": "train", "offering": vm_offering().slug, "gpus": 1, "regions": ["us-east-1"],
            "duration_hours": 1}, format="json").json()
        send_all()
        assert len(receiver.received) == 1
        got = receiver.received[0]
        assert got["json"]["type"] == "reservation.state" and got["json"]["data"]["reservation"] == made["id"]
        assert got["json"]["data"]["state"] == "scheduled" and got["json"]["tenant"] == str(world.t1.tenant.pk)
        assert signing.verify(endpoint["secret"], got["headers"]["Meridian-Signature"], got["body"],
                              now=int(time.time()))
        assert not signing.verify("whsec_other", got["headers"]["Meridian-Signature"], got["body"],
                                  now=int(time.time()))
        sent = WebhookDelivery.objects.get()
        assert sent.state == "delivered" and got["headers"]["Meridian-Delivery"] == str(sent.pk)
        assert WebhookAttempt.objects.get().status_code == 200
    listed = world.client("t1_admin").get("/api/v1/webhook-deliveries/").json()["results"]
    assert [d["state"] for d in listed] == ["delivered"] and listed[0]["attempt_log"][0]["status_code"] == 200


def test_a_failing_receiver_is_retried_with_backoff_and_handles_the_event_once(world, settings):
    with Receiver(fail_first=2) as receiver:
        register(world, receiver.url)
        notify(world.t1.tenant, kind="budget.crossed", title="80 % of the budget", body="Spent 800.00 of 1,000.00")
        send_all()
        sent = WebhookDelivery.objects.get()
        assert sent.state == "pending" and sent.attempts == 1 and sent.last_status_code == 500
        waited = sent.next_attempt_at - WebhookAttempt.objects.get().at
        assert timedelta(seconds=settings.MERIDIAN_WEBHOOK_RETRY_SECONDS - 1) <= waited
        send_all(sent.next_attempt_at - timedelta(seconds=1))  # not due yet: nothing sent
        assert len(receiver.received) == 1
        send_all(sent.next_attempt_at)
        sent.refresh_from_db()
        assert sent.attempts == 2 and sent.next_attempt_at - timezone.now() > timedelta(seconds=50)  # doubled
        send_all(sent.next_attempt_at)
        sent.refresh_from_db()
        assert sent.state == "delivered" and sent.attempts == 3
        assert [r["status"] for r in receiver.received] == [500, 500, 200]
        assert receiver.handled == {str(sent.pk)}  # the same delivery id each time: acted on once
        assert WebhookAttempt.objects.filter(delivery=sent).count() == 3


def test_repeated_failure_disables_the_endpoint_and_tells_the_admins(world, settings):
    settings.MERIDIAN_WEBHOOK_MAX_ATTEMPTS, settings.MERIDIAN_WEBHOOK_DISABLE_AFTER = 1, 2
    with Receiver(fail_first=99) as receiver:
        endpoint = register(world, receiver.url)
        for n in range(2):
            notify(world.t1.tenant, kind="operator.message", title=f"message {n}", body="")
            send_all()
    stored = WebhookEndpoint.objects.get(pk=endpoint["id"])
    assert not stored.is_active and "2 deliveries in a row failed" in stored.disabled_reason
    assert Notification.objects.filter(tenant=world.t1.tenant, kind="webhook.disabled").count() == 1
    assert set(WebhookDelivery.objects.values_list("state", flat=True)) == {"failed"}
    with Receiver() as receiver:  # fixed: on again, and a failed delivery sent again from its log
        admin = world.client("t1_admin")
        assert admin.patch(f"{URL}{endpoint['id']}/", {"url": receiver.url, "is_active": True},
                           format="json").status_code == 200
        failed = WebhookDelivery.objects.order_by("created_at").first()
        assert admin.post(f"/api/v1/webhook-deliveries/{failed.pk}/redeliver/").status_code == 202
        send_all()
        failed.refresh_from_db()
        assert failed.state == "delivered"
        # the failed one again, and the notice that the endpoint was disabled, now that it listens again
        assert sorted(r["json"]["type"] for r in receiver.received) == ["operator.message", "webhook.disabled"]


def test_a_rotated_secret_signs_beside_the_new_one_until_the_overlap_ends(world):
    with Receiver() as receiver:
        endpoint = register(world, receiver.url)
        rotated = world.client("t1_admin").post(f"{URL}{endpoint['id']}/rotate-secret/").json()
        assert rotated["secret"] != endpoint["secret"] and rotated["previous_secret_until"]
        assert world.client("t1_admin").post(f"{URL}{endpoint['id']}/ping/").status_code == 202
        send_all()
        got = receiver.received[-1]
        assert got["json"]["type"] == "webhook.ping"
        for secret in (endpoint["secret"], rotated["secret"]):
            assert signing.verify(secret, got["headers"]["Meridian-Signature"], got["body"], now=int(time.time()))
        WebhookEndpoint.objects.filter(pk=endpoint["id"]).update(previous_secret_until=timezone.now())
        world.client("t1_admin").post(f"{URL}{endpoint['id']}/ping/")
        send_all()
        got = receiver.received[-1]
        assert not signing.verify(endpoint["secret"], got["headers"]["Meridian-Signature"], got["body"],
                                  now=int(time.time()))
        assert signing.verify(rotated["secret"], got["headers"]["Meridian-Signature"], got["body"],
                              now=int(time.time()))


def test_a_tenant_never_receives_another_tenants_events_of_any_type(world):
    with Receiver() as theirs, Receiver() as mine:
        register(world, theirs.url, persona="t2_owner")
        register(world, mine.url)
        types = ["reservation.state"] + [f"{family}.something" for family in FAMILIES]
        for event_type in types:
            emit(world.t2.tenant.pk, event_type, {"secret": "t2's"})
            notify(world.t2.tenant, kind=event_type, title="t2 only", body="")
        send_all()
        assert len(theirs.received) == 2 * len(types) and mine.received == []
        assert not WebhookDelivery.objects.filter(tenant=world.t1.tenant).exists()
    assert world.client("t1_admin").get("/api/v1/webhook-deliveries/").json()["results"] == []
    other = WebhookDelivery.objects.filter(tenant=world.t2.tenant).first()
    assert world.client("t1_admin").get(f"/api/v1/webhook-deliveries/{other.pk}/").status_code == 404
    assert world.client("t1_admin").post(f"/api/v1/webhook-deliveries/{other.pk}/redeliver/").status_code == 404


def test_a_change_rolled_back_tells_nobody_and_tenants_without_endpoints_write_no_events(world):
    notify(world.t1.tenant, kind="operator.message", title="nobody listens", body="")
    assert not Event.objects.exists()
    with Receiver() as receiver:
        register(world, receiver.url)
        with pytest.raises(RuntimeError), transaction.atomic():
            notify(world.t1.tenant, kind="operator.message", title="undone", body="")
            raise RuntimeError("the change fails")
        assert not Event.objects.exists()
        budgets_check()  # no budget: nothing to say
        send_all()
        assert receiver.received == []


@pytest.mark.parametrize(("body", "error"), [
    ({"url": "https://10.0.0.5/hooks", "event_types": ["*"]}, "url_not_allowed"),
    ({"url": "https://169.254.169.254/latest/meta-data", "event_types": ["*"]}, "url_not_allowed"),
    ({"url": "https://[fd00::1]/hooks", "event_types": ["*"]}, "url_not_allowed"),
    ({"url": "https://100.64.0.9/hooks", "event_types": ["*"]}, "url_not_allowed"),
    ({"url": "https://user:pw@127.0.0.1/hooks", "event_types": ["*"]}, "url_not_allowed"),
    ({"url": "ftp://127.0.0.1/hooks", "event_types": ["*"]}, "url_not_allowed"),
    ({"url": "not a url", "event_types": ["*"]}, "invalid"),
    ({"url": "http://127.0.0.1:9/hooks", "event_types": []}, "invalid"),
    ({"url": "http://127.0.0.1:9/hooks", "event_types": ["billing.everything"]}, "unknown_event_type"),
    ({"url": "http://127.0.0.1:9/hooks", "event_types": ["reservation.*.x"]}, "unknown_event_type"),
    ({"url": "http://127.0.0.1:9/hooks", "event_types": "reservation.state"}, "not_a_list"),
])
def test_bad_endpoints_are_refused_and_nothing_is_written(world, body, error):
    answer = world.client("t1_admin").post(URL, body, format="json")
    assert answer.status_code == 400 and code(answer) == error, answer.content
    assert not WebhookEndpoint.objects.exists()


def test_in_production_loopback_and_plain_http_are_refused_too(world, settings):
    settings.MERIDIAN_WEBHOOK_ALLOW_LOOPBACK = False
    for url in ("http://127.0.0.1:8080/hooks", "https://127.0.0.1/hooks", "https://localhost/hooks",
                "https://[::1]/hooks"):
        answer = world.client("t1_admin").post(URL, {"url": url, "event_types": ["*"]}, format="json")
        assert answer.status_code == 400 and code(answer) == "url_not_allowed", (url, answer.content)
    assert not WebhookEndpoint.objects.exists()


def test_a_url_that_later_resolves_inside_is_not_delivered_to(world, settings):
    with Receiver() as receiver:
        register(world, receiver.url)
        settings.MERIDIAN_WEBHOOK_ALLOW_LOOPBACK = False  # as if its name now pointed inside
        notify(world.t1.tenant, kind="operator.message", title="m", body="")
        send_all()
        assert receiver.received == []
        assert WebhookAttempt.objects.get().error.startswith("refused:")
