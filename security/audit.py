"""
The one door for writing audit events.

Every service that changes state calls ``audit_record`` inside its transaction, so the event
commits or rolls back with the change. It is a cheap append; the tamper-evident chain over these
rows is built by a sealer, separately, so writers are never serialised.
"""

from __future__ import annotations

import datetime
import decimal
import uuid
from typing import Any

from django.db import connection, models
from django.utils import timezone

from core.db import copy_rows
from core.middleware import current_request_id
from security.models import AuditEvent


def _jsonable(value: Any) -> Any:
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, models.Model):
        return str(value.pk)
    return value


def snapshot(instance: models.Model, fields: list[str]) -> dict[str, Any]:
    """The named fields of ``instance`` as JSON-ready values (foreign keys as ids)."""
    out = {}
    for name in fields:
        field = instance._meta.get_field(name)
        value = getattr(instance, field.attname)
        out[name] = _jsonable(value)
    return out


def audit_record(
    *,
    actor,
    action: str,
    target: models.Model,
    tenant_id: uuid.UUID | None = None,
    before: dict | None = None,
    after: dict | None = None,
) -> AuditEvent:
    """
    Append one audit event for a change made by ``actor`` (a Principal, a User, or None for the
    system) to ``target``. Must run inside the transaction that makes the change.
    """
    _require_transaction()
    event = _event(actor=actor, action=action, target=target, tenant_id=tenant_id, before=before, after=after)
    event.save(force_insert=True)
    return event


def audit_event(
    *, actor, action: str, target: models.Model, tenant_id: uuid.UUID | None = None, after: dict | None = None,
) -> AuditEvent:
    """
    ``audit_record``'s event, not yet saved: for a service that inserts it in one statement with
    the change it records (core.db.insert_objects). Must be saved in that change's transaction.
    """
    _require_transaction()
    return _event(actor=actor, action=action, target=target, tenant_id=tenant_id, after=after)


COPIED_COLUMNS = ("public_id", "occurred_at", "actor_id", "actor_email", "token_id", "tenant_id", "action",
                  "target_type", "target_id", "before", "after", "request_id", "chain_hash")


def audit_record_many(*, actor, action: str, changes: list[tuple[models.Model, dict | None]]) -> int:
    """
    ``audit_record`` for many targets changed alike in one transaction (``changes``: target and
    its after-values), in one statement (a COPY on PostgreSQL), for the scheduler's batched
    placements. Returns how many events were written.
    """
    _require_transaction()
    actor_id, actor_email, token_id = _who(actor)
    now, request_id = timezone.now(), current_request_id() or ""
    copy_rows(AuditEvent, COPIED_COLUMNS, [
        (uuid.uuid4(), now, actor_id, actor_email, token_id, getattr(target, "tenant_id", None), action,
         target._meta.label_lower, str(target.pk), None, after, request_id, "")
        for target, after in changes
    ])
    return len(changes)


def _require_transaction() -> None:
    if not connection.in_atomic_block:
        raise RuntimeError("audit_record must be called inside the transaction that makes the change.")


def _who(actor) -> tuple:
    """The actor's user id, email and token id (a Principal, a User, or None for the system)."""
    user, token = getattr(actor, "user", actor), getattr(actor, "token", None)
    return getattr(user, "pk", None), getattr(user, "email", "") or "", getattr(token, "pk", None)


def _event(*, actor, action, target, tenant_id=None, before=None, after=None) -> AuditEvent:
    actor_id, actor_email, token_id = _who(actor)
    if tenant_id is None:
        tenant_id = getattr(target, "tenant_id", None)
    return AuditEvent(
        actor_id=actor_id,
        actor_email=actor_email,
        token_id=token_id,
        tenant_id=tenant_id,
        action=action,
        target_type=target._meta.label_lower,
        target_id=str(target.pk),
        before=before,
        after=after,
        request_id=current_request_id() or "",
    )
