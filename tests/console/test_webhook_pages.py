"""The console's webhooks page: admins add an endpoint (secret shown once), ping, rotate, turn off and on, remove."""

import pytest

from webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db
URL = "http://127.0.0.1:9/hooks"


def test_an_admin_manages_endpoints_on_the_webhooks_page(console, world):
    client = console("t1_admin")
    page = client.get("/webhooks/").content.decode()
    assert "No endpoint yet" in page and 'href="/webhooks/" aria-current="page"' in page
    made = client.post("/webhooks/new/", {"url": URL, "event_types": "reservation.*, budget.*",
                                          "description": "CI"}).content.decode()
    endpoint = WebhookEndpoint.objects.get()
    assert "Copy the signing secret now" in made and endpoint.secret in made
    assert endpoint.event_types == ["budget.*", "reservation.*"]
    assert endpoint.secret not in client.get("/webhooks/").content.decode()  # shown once
    rotated = client.post(f"/webhooks/{endpoint.pk}/rotate/").content.decode()
    endpoint.refresh_from_db()
    assert endpoint.secret in rotated and "The old secret signs beside it" in rotated
    page = client.post(f"/webhooks/{endpoint.pk}/ping/", follow=True).content.decode()
    assert "webhook.ping is on its way" in page and WebhookDelivery.objects.filter(event_type="webhook.ping").exists()
    assert "is off" in client.post(f"/webhooks/{endpoint.pk}/off/", follow=True).content.decode()
    assert "Turn on" in client.get("/webhooks/").content.decode()
    assert console("t2_owner").post(f"/webhooks/{endpoint.pk}/remove/").status_code == 404
    assert console("t1_member").get("/webhooks/").status_code == 403
    assert "is removed" in client.post(f"/webhooks/{endpoint.pk}/remove/", follow=True).content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_a_bad_endpoint_says_why_and_keeps_what_was_typed(console, world):
    page = console("t1_admin").post("/webhooks/new/", {"url": "https://10.1.2.3/x", "event_types": "*"}).content
    assert b"inside a private network" in page and b"https://10.1.2.3/x" in page
    page = console("t1_admin").post("/webhooks/new/", {"url": URL, "event_types": "everything"}).content
    assert b"is no event type" in page
    assert not WebhookEndpoint.objects.exists()
