"""
Sending events (docs/webhooks.md, "Delivery"). ``dispatch`` turns the events written since its
last run (``tenants.Event``, the outbox) into one delivery per endpoint that asks for the type, in
one transaction with marking the events dispatched (rows locked, skip-locked: two dispatchers never
take the same event). ``deliver`` makes one attempt at a due delivery: a POST of the event's JSON,
signed, to the endpoint's URL (checked again against the guard), 10 s at most. A 2xx delivers it;
anything else is logged and tried again after 30 s, 1 min, 2 min ... (doubling, 6 h at most) until
MERIDIAN_WEBHOOK_MAX_ATTEMPTS, when it fails; MERIDIAN_WEBHOOK_DISABLE_AFTER failed deliveries in
a row disable the endpoint, and the tenant's admins are told. At least once: a worker killed
mid-attempt leaves the delivery pending and due, and the sweep sends it again -- with the same
``Meridian-Delivery`` id, for the receiver's idempotency check.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta

import requests
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from tenants.events import listeners_changed, listeners_source
from tenants.models import Event
from tenants.notifications import notify
from webhooks import catalogue, guard, signing
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint

log = logging.getLogger(__name__)

TIMEOUT_S = 10
BATCH = 500
MAX_BACKOFF = timedelta(hours=6)
LEASE = timedelta(seconds=60)  # an attempt under way: no other worker takes the delivery meanwhile
_enqueue = None  # the Celery task's delay, set by webhooks.tasks


def register() -> None:
    listeners_source(listening_tenants)


def listening_tenants() -> set:
    return set(WebhookEndpoint.objects.filter(is_active=True).values_list("tenant_id", flat=True).distinct())


def enqueue_with(send) -> None:
    global _enqueue
    _enqueue = send


def deliver_soon(delivery_ids: list) -> None:
    """Queue an attempt at each once the transaction commits (the sweep sends any this misses)."""
    if _enqueue is not None and delivery_ids:
        ids = [str(pk) for pk in delivery_ids]
        transaction.on_commit(lambda: [_enqueue(pk) for pk in ids])


def event_payload(event_id, event_type: str, at: datetime, data: dict, *, tenant_id=None, team_id=None) -> dict:
    return {"id": str(event_id), "type": event_type, "created_at": at.isoformat(),
            "tenant": str(tenant_id) if tenant_id else None, "team": str(team_id) if team_id else None, "data": data}


def dispatch(limit: int = BATCH) -> tuple[int, int]:
    """Fan the next undispatched events out to their endpoints' deliveries; returns (events, deliveries)."""
    with transaction.atomic():
        events = list(Event.objects.select_for_update(skip_locked=True).filter(dispatched_at__isnull=True)
                      .order_by("id")[:limit])
        if not events:
            return 0, 0
        endpoints: dict = {}
        for endpoint in WebhookEndpoint.objects.filter(tenant_id__in={e.tenant_id for e in events}, is_active=True):
            endpoints.setdefault(endpoint.tenant_id, []).append(endpoint)
        now = timezone.now()
        made = [WebhookDelivery(tenant_id=event.tenant_id, endpoint=endpoint, event_id=event.public_id,
                                event_type=event.type, next_attempt_at=now,
                                payload=event_payload(event.public_id, event.type, event.created_at, event.data,
                                                      tenant_id=event.tenant_id, team_id=event.team_id))
                for event in events for endpoint in endpoints.get(event.tenant_id, [])
                if catalogue.wants(endpoint.event_types, event.type)]
        WebhookDelivery.objects.bulk_create(made)
        Event.objects.filter(pk__in=[e.pk for e in events]).update(dispatched_at=now)
        deliver_soon([d.pk for d in made])
    return len(events), len(made)


def due(now: datetime | None = None, limit: int = BATCH) -> list:
    """Pending deliveries whose attempt is due (the sweep's work)."""
    now = now or timezone.now()
    return list(WebhookDelivery.objects.filter(state=WebhookDelivery.State.PENDING, next_attempt_at__lte=now,
                                               endpoint__is_active=True)
                .order_by("next_attempt_at").values_list("pk", flat=True)[:limit])


def backoff(attempts: int) -> timedelta:
    """How long after its ``attempts``-th failed try a delivery is tried again."""
    return min(timedelta(seconds=settings.MERIDIAN_WEBHOOK_RETRY_SECONDS * 2 ** (attempts - 1)), MAX_BACKOFF)


def deliver(delivery_id, now: datetime | None = None) -> str:
    """
    One attempt at a due delivery (none when it is not pending and due). The delivery is leased
    first (its next attempt moved LEASE on, in a short transaction), then posted outside any
    transaction, then the outcome recorded: a worker killed mid-attempt leaves it to be tried again
    once the lease is over.
    """
    now = now or timezone.now()
    with transaction.atomic():
        delivery = (WebhookDelivery.objects.select_for_update(skip_locked=True).select_related("endpoint")
                    .filter(pk=delivery_id, state=WebhookDelivery.State.PENDING, next_attempt_at__lte=now,
                            endpoint__is_active=True).first())
        if delivery is None:
            return "not_due"
        WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=now + LEASE)
    status, error, took = _post(delivery)
    with transaction.atomic():
        done = timezone.now()
        WebhookAttempt.objects.create(delivery=delivery, status_code=status, error=error[:500], duration_ms=took)
        delivery.attempts += 1
        delivery.last_status_code, delivery.last_error = status, error[:500]
        if status is not None and 200 <= status < 300:
            delivery.state, delivery.delivered_at = WebhookDelivery.State.DELIVERED, done
            WebhookEndpoint.objects.filter(pk=delivery.endpoint_id).update(failures_in_a_row=0)
        elif delivery.attempts >= settings.MERIDIAN_WEBHOOK_MAX_ATTEMPTS:
            delivery.state = WebhookDelivery.State.FAILED
            _given_up(delivery.endpoint)
        else:
            delivery.next_attempt_at = done + backoff(delivery.attempts)
        WebhookDelivery.objects.filter(pk=delivery.pk, state=WebhookDelivery.State.PENDING).update(
            attempts=delivery.attempts, last_status_code=status, last_error=error[:500], state=delivery.state,
            delivered_at=delivery.delivered_at, next_attempt_at=delivery.next_attempt_at)
    return delivery.state


def _post(delivery: WebhookDelivery) -> tuple[int | None, str, int]:
    """POST the delivery; (status code or None, error, milliseconds)."""
    endpoint = delivery.endpoint
    began = time.monotonic()
    try:
        guard.url_check(endpoint.url)
    except guard.Refused as exc:
        return None, f"refused: {exc}", 0
    body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True).encode()
    secrets_in_use = [endpoint.secret]
    if endpoint.previous_secret and endpoint.previous_secret_until and endpoint.previous_secret_until > timezone.now():
        secrets_in_use.append(endpoint.previous_secret)
    headers = {"Content-Type": "application/json", "User-Agent": "Meridian-Webhooks/1",
               "Meridian-Event": delivery.event_type, "Meridian-Delivery": str(delivery.pk),
               "Meridian-Signature": signing.header(secrets_in_use, int(time.time()), body)}
    try:
        answer = requests.post(endpoint.url, data=body, headers=headers, timeout=TIMEOUT_S, allow_redirects=False)
    except requests.RequestException as exc:
        return None, f"{type(exc).__name__}: {exc}", int((time.monotonic() - began) * 1000)
    error = "" if 200 <= answer.status_code < 300 else answer.text[:200]
    return answer.status_code, error, int((time.monotonic() - began) * 1000)


def _given_up(endpoint: WebhookEndpoint) -> None:
    """A delivery failed for good: count it, and disable the endpoint after too many in a row (telling the admins)."""
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(failures_in_a_row=F("failures_in_a_row") + 1)
    endpoint.refresh_from_db(fields=["failures_in_a_row", "is_active"])
    if endpoint.is_active and endpoint.failures_in_a_row >= settings.MERIDIAN_WEBHOOK_DISABLE_AFTER:
        reason = (f"{endpoint.failures_in_a_row} deliveries in a row failed after "
                  f"{settings.MERIDIAN_WEBHOOK_MAX_ATTEMPTS} attempts each.")
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(is_active=False, disabled_reason=reason)
        notify(endpoint.tenant, kind="webhook.disabled", title=f"Webhook to {endpoint.url} disabled"[:200],
               body=f"{reason} Fix the receiver, then turn the endpoint on again; its failed deliveries can be "
                    "sent again from their log.", key=f"webhook.disabled:{endpoint.pk}:{timezone.now():%Y%m%d%H%M}")
        transaction.on_commit(listeners_changed)


def prune(now: datetime | None = None) -> int:
    """Forget dispatched events and finished deliveries older than MERIDIAN_WEBHOOK_KEEP_DAYS."""
    before = (now or timezone.now()) - timedelta(days=settings.MERIDIAN_WEBHOOK_KEEP_DAYS)
    events, _ = Event.objects.filter(dispatched_at__lt=before).delete()
    deliveries, _ = WebhookDelivery.objects.filter(created_at__lt=before).exclude(
        state=WebhookDelivery.State.PENDING).delete()
    return events + deliveries
