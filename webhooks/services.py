"""
Webhook endpoints (docs/webhooks.md): a tenant's admins register, change, rotate and remove them,
look at their deliveries and send one again. Every change is audited; a secret is shown once.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.errors import Conflict, Forbidden
from security.audit import audit_record
from tenants.events import listeners_changed
from webhooks import catalogue, guard, signing
from webhooks.delivery import deliver_soon, event_payload
from webhooks.models import WebhookDelivery, WebhookEndpoint

MAX_ENDPOINTS = 20  # per tenant
AUDITED = ("url", "event_types", "description", "is_active")


def _audited(endpoint: WebhookEndpoint) -> dict:
    return {name: getattr(endpoint, name) for name in AUDITED}


@transaction.atomic
def endpoint_create(*, actor, url: str, event_types: list, description: str = "") -> tuple[WebhookEndpoint, str]:
    """Register an endpoint of the actor's tenant; returns it and its secret (shown only now)."""
    if actor.tenant is None:
        raise Forbidden("Webhooks belong to a tenant; choose one with the X-Meridian-Tenant header.")
    if WebhookEndpoint.objects.filter(tenant=actor.tenant).count() >= MAX_ENDPOINTS:
        raise Conflict(f"A tenant has at most {MAX_ENDPOINTS} webhook endpoints: remove one first.",
                       code="too_many_endpoints")
    secret = signing.new_secret()
    endpoint = WebhookEndpoint.objects.create(
        tenant=actor.tenant, url=guard.url_allowed(url), event_types=catalogue.types_check(event_types),
        description=description[:200], secret=secret, created_by=actor.user)
    audit_record(actor=actor, action="webhook.create", target=endpoint, after=_audited(endpoint))
    _listeners_changed()
    return endpoint, secret


@transaction.atomic
def endpoint_update(*, actor, endpoint: WebhookEndpoint, **changes) -> WebhookEndpoint:
    """Change the URL, event types, description, or turn it on (a disabled one starts afresh) or off."""
    before = _audited(endpoint)
    if "url" in changes:
        endpoint.url = guard.url_allowed(changes["url"])
    if "event_types" in changes:
        endpoint.event_types = catalogue.types_check(changes["event_types"])
    if "description" in changes:
        endpoint.description = changes["description"][:200]
    if "is_active" in changes:
        endpoint.is_active = bool(changes["is_active"])
        if endpoint.is_active:
            endpoint.disabled_reason, endpoint.failures_in_a_row = "", 0
    endpoint.save()
    audit_record(actor=actor, action="webhook.update", target=endpoint, before=before, after=_audited(endpoint))
    _listeners_changed()
    return endpoint


@transaction.atomic
def endpoint_delete(*, actor, endpoint: WebhookEndpoint) -> None:
    audit_record(actor=actor, action="webhook.delete", target=endpoint, before=_audited(endpoint))
    endpoint.delete()
    _listeners_changed()


@transaction.atomic
def secret_rotate(*, actor, endpoint: WebhookEndpoint) -> tuple[WebhookEndpoint, str]:
    """
    A new secret (returned, shown only now); the old one still signs each delivery beside it for
    MERIDIAN_WEBHOOK_SECRET_OVERLAP_HOURS, so receivers can move over without missing one.
    """
    locked = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
    secret = signing.new_secret()
    locked.previous_secret, locked.secret = locked.secret, secret
    locked.previous_secret_until = timezone.now() + timedelta(hours=settings.MERIDIAN_WEBHOOK_SECRET_OVERLAP_HOURS)
    locked.save(update_fields=["previous_secret", "secret", "previous_secret_until", "updated_at"])
    audit_record(actor=actor, action="webhook.rotate_secret", target=locked,
                 after={"previous_secret_until": locked.previous_secret_until.isoformat()})
    return locked, secret


@transaction.atomic
def ping(*, actor, endpoint: WebhookEndpoint) -> WebhookDelivery:
    """Send the endpoint a ``webhook.ping`` event now (only it), to check the receiver."""
    if not endpoint.is_active:
        raise Conflict("The endpoint is disabled: turn it on first (is_active).", code="endpoint_disabled")
    now, event_id = timezone.now(), uuid.uuid4()
    delivery = WebhookDelivery.objects.create(
        tenant_id=endpoint.tenant_id, endpoint=endpoint, event_type="webhook.ping", next_attempt_at=now,
        event_id=event_id, payload=event_payload(event_id, "webhook.ping", now, {"endpoint": str(endpoint.pk)}))
    audit_record(actor=actor, action="webhook.ping", target=endpoint)
    deliver_soon([delivery.pk])
    return delivery


@transaction.atomic
def redeliver(*, actor, delivery: WebhookDelivery) -> WebhookDelivery:
    """Send a delivery again now, whatever became of it (same id: the receiver's idempotency check holds)."""
    if not delivery.endpoint.is_active:
        raise Conflict("The endpoint is disabled: turn it on first (is_active).", code="endpoint_disabled")
    WebhookDelivery.objects.filter(pk=delivery.pk).update(state=WebhookDelivery.State.PENDING,
                                                          next_attempt_at=timezone.now(), attempts=0)
    audit_record(actor=actor, action="webhook.redeliver", target=delivery.endpoint,
                 after={"delivery": str(delivery.pk)})
    deliver_soon([delivery.pk])
    delivery.refresh_from_db()
    return delivery



def _listeners_changed() -> None:
    """Forget who listens now and once committed (a reader between the two may cache the old answer a while)."""
    listeners_changed()
    transaction.on_commit(listeners_changed)
