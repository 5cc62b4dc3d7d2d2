"""
The reservation transition table (DESIGN.md, Reservations). Services move reservations only
through ``cloud.transitions.compare_and_set`` with this table.
"""

from .choices import ReservationState as R

RESERVATION_TRANSITIONS: dict[str, frozenset[str]] = {
    R.PENDING: frozenset({R.QUEUED, R.SCHEDULED, R.CANCELLED, R.FAILED}),
    R.QUEUED: frozenset({R.SCHEDULED, R.CANCELLED, R.EXPIRED, R.FAILED}),
    # A scheduled reservation has capacity held; spot work may lose it before it starts.
    R.SCHEDULED: frozenset({R.PROVISIONING, R.CANCELLED, R.PREEMPTED, R.EXPIRED, R.NO_SHOW, R.RELEASING}),
    # Provisioning that failed on a node goes back to the queue, keeping its place.
    R.PROVISIONING: frozenset({R.ACTIVE, R.QUEUED, R.FAILED, R.RELEASING}),
    # Active work whose hardware failed is provisioned again on a replacement.
    R.ACTIVE: frozenset({R.RELEASING, R.PROVISIONING}),
    R.RELEASING: frozenset({R.RELEASED, R.CANCELLED, R.PREEMPTED, R.FAILED}),
}
TERMINAL_STATES = frozenset({R.RELEASED, R.FAILED, R.CANCELLED, R.PREEMPTED, R.EXPIRED, R.NO_SHOW})
# States in which a reservation holds capacity (its allocations count).
HOLDING_STATES = frozenset({R.SCHEDULED, R.PROVISIONING, R.ACTIVE, R.RELEASING})
WAITING_STATES = frozenset({R.PENDING, R.QUEUED})
for _state in TERMINAL_STATES:
    RESERVATION_TRANSITIONS.setdefault(_state, frozenset())
