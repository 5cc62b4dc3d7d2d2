"""Periodic housekeeping of provisioning; thin wrappers around services."""

from datetime import timedelta

from celery import shared_task
from django.utils import timezone

IDEMPOTENCY_KEY_TTL = timedelta(hours=24)


@shared_task(name="provisioning.idempotency_key_prune")
def idempotency_key_prune() -> int:
    """Forget Idempotency-Keys after a day, as Stripe does; a later retry is a new request."""
    from .models import IdempotencyKey

    deleted, _ = IdempotencyKey.objects.filter(created_at__lt=timezone.now() - IDEMPOTENCY_KEY_TTL).delete()
    return deleted
