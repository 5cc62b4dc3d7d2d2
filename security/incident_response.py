"""
Staff's response to an incident (docs/incidents.md): acknowledge it, assign it to a platform
admin, resolve it with a note. Each locks the incident, changes it, writes an audit event in the
same transaction, and leaves a notice for the assignee when someone else acted on their incident
(sent by security.incident_paging's round, so a mail server that is down delays it, never loses it).

- **acknowledge**: someone is on it. Idempotent (the first acknowledgement stands); a resolved
  incident answers 409 ``incident_resolved``.
- **assign**: to a platform admin (the only staff who may act on incidents), 400 ``not_staff``
  for anyone else; assigning to the current assignee changes nothing; a resolved incident is 409.
- **resolve**: with a note of what was done. Idempotent (a resolved incident, whoever resolved
  it, is left as it is). Detection's copies of a platform incident for the tenants it hit
  (``evidence.platform_incident``) are resolved with it, as detection itself resolves them; a
  node failure's tenant incidents are not: they end when the replacement hands the tenant
  working hardware (provisioning.lifecycle.replacement), and the SLA counts until then.

Detection keeps setting ``resolved_at`` itself when a condition clears; that leaves the response
fields as they are.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from core.errors import Conflict, DomainError, Forbidden
from security.audit import audit_record
from security.incident_paging import console_url
from security.models import Incident, IncidentNotice
from tenants.models import User

NOTE_MAX = 2000
# Tenant incidents that outlive their platform incident: ended by the replacement, not with it.
ENDED_ON_THEIR_OWN = ("node_failure",)
STAFF_ONLY = "Only platform admins may respond to incidents."
RESOLVED = "The incident is resolved already: there is nothing left to {verb}."


def incident_acknowledge(*, actor, incident: Incident) -> Incident:
    """Say someone is on it; the first acknowledgement stands."""
    user = _staff(actor)
    with transaction.atomic():
        locked = _locked(incident)
        _open(locked, "acknowledge")
        if locked.acknowledged_at is not None:
            return locked
        locked.acknowledged_at, locked.acknowledged_by = timezone.now(), user
        locked.save(update_fields=["acknowledged_at", "acknowledged_by"])
        audit_record(actor=actor, action="incident.acknowledge", target=locked,
                     after={"acknowledged_at": locked.acknowledged_at.isoformat()})
        _tell_assignee(locked, user, f"acknowledged by {user.email}")
    return locked


def incident_assign(*, actor, incident: Incident, assignee: User) -> Incident:
    """Hand the incident to a platform admin (oneself included); they are told unless they did it."""
    user = _staff(actor)
    if not (assignee.is_active and assignee.is_staff):
        raise DomainError({"assignee": [f"{assignee.email} is not a platform admin: only platform admins can be "
                                        "assigned incidents, as only they may acknowledge and resolve them."]},
                          code="not_staff")
    with transaction.atomic():
        locked = _locked(incident)
        _open(locked, "assign")
        if locked.assignee_id == assignee.pk:
            return locked
        before = {"assignee": str(locked.assignee_id) if locked.assignee_id else None}
        previous = locked.assignee
        locked.assignee, locked.assigned_at = assignee, timezone.now()
        locked.save(update_fields=["assignee", "assigned_at"])
        audit_record(actor=actor, action="incident.assign", target=locked, before=before,
                     after={"assignee": str(assignee.pk), "assignee_email": assignee.email})
        _tell_assignee(locked, user, f"assigned to you by {user.email}")
        if previous is not None and previous.pk != user.pk:
            _notice(locked, previous, f"reassigned to {assignee.email} by {user.email}")
    return locked


def incident_resolve(*, actor, incident: Incident, note: str) -> Incident:
    """End the incident with what was done; a resolved one is left as it is."""
    user = _staff(actor)
    note = (note or "").strip()
    if not note:
        raise DomainError({"note": ["Say what was done (or why nothing needs doing): the note stays with the "
                                    "incident."]}, code="blank")
    if len(note) > NOTE_MAX:
        raise DomainError({"note": [f"Keep the note to {NOTE_MAX} characters."]}, code="max_length")
    with transaction.atomic():
        locked = _locked(incident)
        if locked.resolved_at is not None:
            return locked
        locked.resolved_at, locked.resolved_by, locked.resolution_note = timezone.now(), user, note
        locked.save(update_fields=["resolved_at", "resolved_by", "resolution_note"])
        copies = 0
        if locked.tenant_id is None and locked.kind not in ENDED_ON_THEIR_OWN:
            copies = Incident.objects.filter(kind=locked.kind, evidence__platform_incident=str(locked.pk),
                                             resolved_at__isnull=True).update(resolved_at=locked.resolved_at)
        audit_record(actor=actor, action="incident.resolve", target=locked,
                     after={"resolved_at": locked.resolved_at.isoformat(), "note": note,
                            "tenant_incidents_resolved": copies})
        _tell_assignee(locked, user, f"resolved by {user.email}: {note}")
    return locked


def _staff(actor) -> User:
    user = getattr(actor, "user", actor)
    if not isinstance(user, User) or not user.is_staff:
        raise Forbidden(STAFF_ONLY, code="permission_denied")
    return user


def _locked(incident: Incident) -> Incident:
    return Incident.objects.select_for_update(of=("self",)).select_related("assignee").get(pk=incident.pk)


def _open(incident: Incident, verb: str) -> None:
    if incident.resolved_at is not None:
        raise Conflict(RESOLVED.format(verb=verb), code="incident_resolved")


def _tell_assignee(incident: Incident, actor: User, what: str) -> None:
    if incident.assignee is not None and incident.assignee.pk != actor.pk:
        _notice(incident, incident.assignee, what)


def _notice(incident: Incident, to: User, what: str) -> None:
    IncidentNotice.objects.create(
        incident=incident, to=to.email, subject=f"[Meridian] {incident.kind}: {what}"[:200],
        body=f"{incident.summary}\n\nThe incident was {what}.\n\nIt is at {console_url(incident.pk)}\n")
