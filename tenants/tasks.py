"""Periodic housekeeping of tenancy objects; thin wrappers around services."""

from celery import shared_task


@shared_task(name="tenants.invitation_expire")
def invitation_expire() -> int:
    from .services import invitation_expire_all

    return invitation_expire_all()


@shared_task(name="tenants.hp_revoke_due")
def hp_revoke_due() -> dict:
    """Expire or revoke high-priority status that is due (beat, hourly); idempotent."""
    from .high_priority import hp_revoke_due as revoke_due

    return revoke_due()
