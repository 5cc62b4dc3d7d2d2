"""Periodic housekeeping of tenancy objects; thin wrappers around services."""

from celery import shared_task


@shared_task(name="tenants.invitation_expire")
def invitation_expire() -> int:
    from tenants.services import invitation_expire_all

    return invitation_expire_all()


