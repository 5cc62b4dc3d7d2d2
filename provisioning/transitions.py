"""
The reservation transition table (DESIGN.md, Reservations), and the one way to move a
reservation through it (``reservation_transition``: compare-and-set with this table).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils import timezone

from core.transitions import compare_and_set
from provisioning.choices import ReservationState as R
from provisioning.choices import VPCState as V
from security.audit import snapshot
from tenants.events import Happened, emit_many

if TYPE_CHECKING:
    from provisioning.models import Reservation

RESERVATION_TRANSITIONS: dict[str, frozenset[str]] = {
    R.PENDING: frozenset({R.QUEUED, R.SCHEDULED, R.CANCELLED, R.FAILED}),
    R.QUEUED: frozenset({R.SCHEDULED, R.CANCELLED, R.EXPIRED, R.FAILED}),
    # A scheduled reservation has capacity held; spot work may lose it before it starts.
    # Back to the queue (keeping its place) when its capacity is lost before it starts.
    R.SCHEDULED: frozenset({R.PROVISIONING, R.QUEUED, R.CANCELLED, R.PREEMPTED, R.EXPIRED, R.NO_SHOW,
                            R.RELEASING, R.FAILED}),
    # Provisioning that failed on a node goes back to the queue, keeping its place.
    R.PROVISIONING: frozenset({R.ACTIVE, R.QUEUED, R.FAILED, R.RELEASING}),
    # Active work whose hardware failed is provisioned again on a replacement. Active work whose
    # GPUs were never used ends as a no-show (provisioning.lifecycle.no_shows); its GPUs are cleaned after.
    R.ACTIVE: frozenset({R.RELEASING, R.PROVISIONING, R.FAILED, R.NO_SHOW}),
    R.RELEASING: frozenset({R.RELEASED, R.CANCELLED, R.PREEMPTED, R.FAILED}),
}
TERMINAL_STATES = frozenset({R.RELEASED, R.FAILED, R.CANCELLED, R.PREEMPTED, R.EXPIRED, R.NO_SHOW})
# States in which a reservation holds capacity (its allocations count).
HOLDING_STATES = frozenset({R.SCHEDULED, R.PROVISIONING, R.ACTIVE, R.RELEASING})
# What counts against quotas and a team's load: released work gave its GPUs back when it was
# released (its allocations end then), so RELEASING no longer counts.
QUOTA_STATES = frozenset({R.SCHEDULED, R.PROVISIONING, R.ACTIVE})
WAITING_STATES = frozenset({R.PENDING, R.QUEUED})
for _state in TERMINAL_STATES:
    RESERVATION_TRANSITIONS.setdefault(_state, frozenset())


# IB-VPCs: a partition is programmed (pending -> active), or deleted once nothing uses it; a
# fabric error parks it in error until the reconciler or a retry gets it through.
VPC_TRANSITIONS: dict[str, frozenset[str]] = {
    V.PENDING: frozenset({V.ACTIVE, V.ERROR, V.DELETING}),
    V.ACTIVE: frozenset({V.DELETING, V.ERROR}),
    V.ERROR: frozenset({V.ACTIVE, V.DELETING}),
    V.DELETING: frozenset({V.DELETED, V.ERROR}),
    V.DELETED: frozenset(),
}


AUDITED = ["state", "units", "gpus", "regions", "starts_at", "ends_at", "billing_term", "score"]


def reservation_transition(reservation: Reservation, target: str, *, only_from=None, reason: str = "", **also) -> None:
    """
    Compare-and-set the reservation's state in one UPDATE (409 names the current state), and the
    same values on ``reservation`` (plain values: nothing to read back).
    """
    changes = {"state_reason": reason[:500], "state_changed_at": timezone.now(), **also}
    compare_and_set(
        type(reservation).objects.all(), reservation.pk, table=RESERVATION_TRANSITIONS, target=target,
        only_from=frozenset(only_from) if only_from else None, previous=False, **changes,
    )
    for name, value in {"state": target, **changes}.items():
        setattr(reservation, name, value)
    reservations_changed([reservation])


# Callbacks of the apps above that follow reservations' states (an endpoint's load balancer).
_LISTENERS: list = []


def on_reservations_changed(callback) -> None:
    """Call ``callback(reservations)`` in the transaction of every change of reservations' states."""
    _LISTENERS.append(callback)


def reservations_changed(reservations) -> None:
    """
    Tell the tenants' webhooks of the reservations' states as they now are (``reservation.state``
    events), and the listeners above (``on_reservations_changed``).
    """
    reservations = list(reservations)
    for listener in _LISTENERS:
        listener(reservations)
    emit_many(Happened(tenant_id=r.tenant_id, team_id=r.team_id, type="reservation.state", data={
        "reservation": str(r.pk), "name": r.name, "state": r.state, "reason": r.state_reason,
        "starts_at": r.starts_at.isoformat() if r.starts_at else None,
        "ends_at": r.ends_at.isoformat() if r.ends_at else None}) for r in reservations)


def reservation_audited(reservation: Reservation) -> dict:
    """The reservation's fields an audit event records (before and after)."""
    return snapshot(reservation, AUDITED)
