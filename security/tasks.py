"""Periodic work of the security records; thin wrappers around services."""

from celery import shared_task


@shared_task(name="security.audit_seal")
def audit_seal() -> int:
    """Chain the audit events written since the last seal and sign a checkpoint of the head."""
    from security.audit_chain import audit_seal as seal

    sealed = total = seal()
    while sealed:  # a backlog is sealed in batches, each its own transaction
        sealed = seal()
        total += sealed
    return total
