"""
The reservation transition table (DESIGN.md, Reservations). Services move reservations only
through ``cloud.transitions.compare_and_set`` with this table.
"""

from .choices import ReservationState as R
from .choices import VPCState as V

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
    # GPUs were never used ends as a no-show (provisioning.no_shows); its GPUs are cleaned after.
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
