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


@shared_task(name="security.incidents_page")
def incidents_page() -> dict:
    """Page the on-call address about new incidents and send staff their incident notices."""
    from security.incident_paging import page_round

    return page_round()
