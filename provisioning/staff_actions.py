"""
What platform admins may do to a tenant's queued work from the staff queue, each with a note,
audited and told to the reservation's team (or its whole tenant):

- **raise or lower its priority**: an adjustment in [-1, 1] added to its score after the factors'
  clamp (``scheduling.priority``), kept until changed; the scheduler's queue mirror reads it again
  on its next cycle (``QUEUE_RANKING``);
- **hold** it: it stays queued (and counts against quotas as waiting work does) but no cycle or
  fast path places it, and nothing waits behind it; **let go** puts it back in the race;
- **cancel** it with a reason (a queued, scheduled or provisioning reservation, as a tenant may);
- **contact the team** with a message, without changing the reservation.

The row is locked for the change, as placement locks it: a hold either lands before a cycle
places the reservation (the cycle then leaves it) or after (the hold is refused, it moved on).
"""

from __future__ import annotations

from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from core.errors import Conflict, DomainError, Forbidden
from provisioning.choices import ReservationState as R
from provisioning.models import Reservation
from provisioning.scheduling.queue import QUEUE_RANKING
from provisioning.services import reservation_cancel, reservation_rescore
from security.audit import audit_record
from tenants.models import Notification
from tenants.notifications import notify

NOTE_MAX = Reservation._meta.get_field("staff_note").max_length
ADJUSTMENT_RANGE = (-1.0, 1.0)


def reservation_adjust_priority(*, actor, reservation: Reservation, adjustment: float, note: str) -> Reservation:
    """Set staff's adjustment of a queued reservation's score (0 takes it back); rescored at once."""
    note = _note(note)
    if isinstance(adjustment, bool) or not isinstance(adjustment, int | float) or adjustment != adjustment \
            or not ADJUSTMENT_RANGE[0] <= adjustment <= ADJUSTMENT_RANGE[1]:
        raise DomainError({"adjustment": ["Give a number from -1 (lowest) to 1 (highest); "
                                          "0 takes an adjustment back."]}, code="invalid")
    with transaction.atomic():
        locked = _locked(actor, reservation, waiting=True)
        before = {"priority_adjustment": locked.priority_adjustment, "score": locked.score}
        locked.priority_adjustment, locked.staff_note = float(adjustment), note
        locked.save(update_fields=["priority_adjustment", "staff_note"])
        reservation_rescore(locked)
        QUEUE_RANKING.changed()
        audit_record(actor=actor, action="reservation.priority_adjust", target=locked, before=before,
                     after={"priority_adjustment": locked.priority_adjustment, "score": locked.score, "note": note})
        way = "raised" if adjustment > 0 else "lowered" if adjustment < 0 else "set back to its own score"
        _tell(locked, kind="reservation.priority_adjusted", title=f"{locked.name}: priority {way} by the operator",
              body=f"Its priority score is now {locked.score:.3f} (adjustment {adjustment:+.2f}). Note: {note}")
    return locked


def reservation_hold(*, actor, reservation: Reservation, note: str) -> Reservation:
    """Keep a queued reservation out of the scheduler's reach until let go."""
    note = _note(note)
    with transaction.atomic():
        locked = _locked(actor, reservation, waiting=True)
        if locked.held_at is not None:
            raise Conflict("The reservation is held already.", code="already_held")
        locked.held_at, locked.staff_note = timezone.now(), note
        locked.state_reason = f"Held by the operator: {note}"[:500]
        locked.save(update_fields=["held_at", "staff_note", "state_reason"])
        audit_record(actor=actor, action="reservation.hold", target=locked,
                     after={"held_at": locked.held_at.isoformat(), "note": note})
        _tell(locked, kind="reservation.held", title=f"{locked.name} is held in the queue by the operator",
              body=f"It keeps its place in your quota but is not placed until the operator lets it go. Note: {note}")
    return locked


def reservation_let_go(*, actor, reservation: Reservation, note: str) -> Reservation:
    """Put a held reservation back in the race for capacity."""
    note = _note(note)
    with transaction.atomic():
        locked = _locked(actor, reservation, waiting=True)
        if locked.held_at is None:
            raise Conflict("The reservation is not held.", code="not_held")
        held_at = locked.held_at
        locked.held_at, locked.staff_note, locked.state_reason = None, note, "Waiting for the scheduler."
        locked.save(update_fields=["held_at", "staff_note", "state_reason"])
        audit_record(actor=actor, action="reservation.let_go", target=locked, before={"held_at": held_at.isoformat()},
                     after={"held_at": None, "note": note})
        _tell(locked, kind="reservation.let_go", title=f"{locked.name} is back in the queue",
              body=f"The operator let it go: it is placed as soon as capacity allows. Note: {note}")
    return locked


def reservation_staff_cancel(*, actor, reservation: Reservation, reason: str) -> Reservation:
    """Cancel a reservation that has not become active, saying why to its team."""
    reason = _note(reason, what="reason")
    with transaction.atomic():
        locked = _locked(actor, reservation, waiting=False)
        locked.staff_note = reason
        locked.save(update_fields=["staff_note"])
        cancelled = reservation_cancel(actor=actor, reservation=locked,
                                       reason=f"Cancelled by the operator: {reason}"[:500])
        _tell(cancelled, kind="reservation.cancelled_by_operator",
              title=f"{cancelled.name} was cancelled by the operator", body=f"Reason: {reason}")
    return cancelled


def reservation_contact(*, actor, reservation: Reservation, message: str) -> Notification:
    """Send the reservation's team a message from the operator (audited; the reservation is unchanged)."""
    message = _note(message, what="message")
    _staff(actor)
    with transaction.atomic():
        audit_record(actor=actor, action="reservation.contact", target=reservation, after={"message": message})
        return _tell(reservation, kind="operator.message",
                     title=f"A message from the operator about {reservation.name}", body=message)


def _staff(actor) -> None:
    if actor is None or not getattr(actor, "is_platform_admin", False):
        raise Forbidden("Only platform admins act on the queue.", code="permission_denied")


def _locked(actor, reservation: Reservation, *, waiting: bool) -> Reservation:
    """The reservation's row, locked; a 409 naming its state unless it waits (``waiting``) or may be cancelled."""
    _staff(actor)
    locked = Reservation.objects.select_for_update(of=("self",)).select_related("tenant", "team").get(pk=reservation.pk)
    allowed = {R.PENDING, R.QUEUED} if waiting else {R.PENDING, R.QUEUED, R.SCHEDULED, R.PROVISIONING}
    if locked.state not in allowed:
        doing = "waits in the queue" if waiting else "has not become active"
        raise Conflict(f"The reservation is '{locked.state}': this acts only on one that {doing}.",
                       code="invalid_transition", current_state=locked.state)
    return locked


def _note(text, *, what: str = "note") -> str:
    text = (text or "").strip() if isinstance(text, str) else ""
    if not text or len(text) > NOTE_MAX:
        raise DomainError({what: [f"Write a {what} of 1 to {NOTE_MAX} characters: the team reads it."]},
                          code="invalid")
    return text


def _tell(reservation: Reservation, *, kind: str, title: str, body: str) -> Notification:
    return notify(reservation.tenant, team=reservation.team, kind=kind, title=title, body=body,
                  link=reverse("reservation-detail", args=[reservation.pk]))
