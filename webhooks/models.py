"""
Webhooks (docs/webhooks.md): the endpoints a tenant registers, the events it is sent, and each
delivery's attempts. Loaded with tenants' models.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from security.crypto import EncryptedTextField
from tenants.scoping import TenantOwnedModel


class WebhookEndpoint(TenantOwnedModel):
    """
    A URL of the tenant's that is sent the event types it asks for (``*``: every type), each
    delivery signed with its secret (HMAC-SHA256). After a rotation the previous secret still signs
    until ``previous_secret_until``, so receivers can move over. Repeated failure disables it.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    url = models.URLField(max_length=500)
    description = models.CharField(max_length=200, blank=True)
    event_types = models.JSONField(default=list, help_text='Event types it is sent, e.g. ["reservation.state"]; '
                                                           '["*"]: every type.')
    secret = EncryptedTextField()
    previous_secret = EncryptedTextField(null=True, blank=True)
    previous_secret_until = models.DateTimeField(null=True, blank=True)
    is_active = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=300, blank=True)
    failures_in_a_row = models.PositiveIntegerField(default=0, help_text="Deliveries given up on since the last "
                                                                         "that succeeded.")
    created_by = models.ForeignKey("tenants.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["tenant"], condition=Q(is_active=True), name="webhook_active_by_tenant")]

    def __str__(self):
        return self.url

    def wants(self, event_type: str) -> bool:
        return "*" in self.event_types or event_type in self.event_types


class WebhookDelivery(TenantOwnedModel):
    """
    One event for one endpoint: written in the transaction of the change it reports (an outbox), so
    a rolled-back change sends nothing and a committed one is sent at least once. ``id`` is the
    delivery's id in the ``Meridian-Delivery`` header: the same on every attempt, for the receiver's
    idempotency check.
    """

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    event_id = models.UUIDField(help_text="The event's id (one event may go to several endpoints).")
    event_type = models.CharField(max_length=64)
    payload = models.JSONField()
    state = models.CharField(max_length=12, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["next_attempt_at"], condition=Q(state="pending"), name="webhook_due_idx"),
                   models.Index(fields=["endpoint", "created_at"], name="webhook_delivery_endpoint_idx")]

    def __str__(self):
        return f"{self.event_type} to {self.endpoint_id}: {self.state}"


class WebhookAttempt(models.Model):
    """One try of a delivery: what the receiver answered (or why it could not be reached)."""

    id = models.BigAutoField(primary_key=True)
    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log")
    at = models.DateTimeField(auto_now_add=True)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    duration_ms = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self):
        return f"{self.status_code or self.error} at {self.at:%Y-%m-%d %H:%M:%S}"
