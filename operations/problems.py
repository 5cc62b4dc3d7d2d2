"""
What is wrong with the platform now, for the staff console's landing page: nodes that need a
person (suspect, quarantined, faulty, in repair, without attestation references, unhealthy),
nodes failing validation, operations that failed or stopped moving, open incidents, the queue's
depth and waits, and the scheduler's last cycle. A fixed number of queries however large the
fleet: the lists are capped, the counts are aggregates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Case, Count, F, IntegerField, Q, Value, When

from cloud.choices import Health, NodeState
from cloud.models import Node
from provisioning.choices import OperationKind, OperationState
from provisioning.choices import ReservationState as R
from provisioning.models import Operation, Reservation
from security.models import Incident

LISTED = 25  # rows per list; the counts say how many there are in all
# Node states that wait for a person, worst first (the order the page lists them in).
ATTENTION_STATES = [NodeState.FAULTY, NodeState.QUARANTINED, NodeState.SUSPECT, NodeState.REFERENCE_UNAVAILABLE,
                    NodeState.REPAIR]
FAILED_RECENTLY = timedelta(hours=24)
QUEUE_SAMPLE = 10_000  # the longest waits the percentiles are read from


@dataclass
class Problems:
    node_counts: dict[str, int] = field(default_factory=dict)
    nodes: list[dict] = field(default_factory=list)
    failed_validations: list[dict] = field(default_factory=list)
    failed_operations: list[dict] = field(default_factory=list)
    failed_operations_total: int = 0
    stuck_operations: list[dict] = field(default_factory=list)
    incidents: list[dict] = field(default_factory=list)
    incident_counts: dict[str, int] = field(default_factory=dict)
    queue: dict = field(default_factory=dict)

    @property
    def nodes_total(self) -> int:
        """Every node waiting for a person (the list shows the worst LISTED of them)."""
        return sum(self.node_counts.values())

    @property
    def nothing_wrong(self) -> bool:
        return not (self.nodes or self.failed_validations or self.failed_operations or self.stuck_operations
                    or self.incidents)


def problems_now(now: datetime) -> Problems:
    found = Problems()
    _nodes(found)
    _operations(found, now)
    _incidents(found)
    found.queue = queue_waits(now)
    return found


def _nodes(found: Problems) -> None:
    attention = Q(state__in=ATTENTION_STATES) | Q(health__in=[Health.DEGRADED, Health.FAILED])
    counts = Node.objects.filter(attention).aggregate(
        **{state: Count("pk", filter=Q(state=state)) for state in ATTENTION_STATES},
        unhealthy=Count("pk", filter=Q(health__in=[Health.DEGRADED, Health.FAILED]) & ~Q(state__in=ATTENTION_STATES)))
    found.node_counts = {key: value for key, value in counts.items() if value}
    # Worst first, ranked by the database: cut after ranking, a faulty node is never left out for older suspects.
    rank = Case(*[When(state=state, then=Value(i)) for i, state in enumerate(ATTENTION_STATES)],
                default=Value(len(ATTENTION_STATES)), output_field=IntegerField())
    rows = list(Node.objects.filter(attention).annotate(rank=rank).order_by("rank", "state_changed_at").values(
        "pk", "hostname", "state", "state_reason", "state_changed_at", "health", "region__slug")[:LISTED])
    labels = dict(NodeState.choices)
    for row in rows:
        row["state_label"] = labels.get(row["state"], row["state"])
    found.nodes = rows


def _operations(found: Problems, now: datetime) -> None:
    failed = Operation.objects.filter(state=OperationState.FAILED, finished_at__gte=now - FAILED_RECENTLY)
    columns = ("pk", "kind", "step", "error", "finished_at", "updated_at", "reservation_id", "reservation__name",
               "tenant__name", "node_id", "node__hostname")
    found.failed_validations = list(failed.filter(kind=OperationKind.VALIDATE).order_by("-finished_at")
                                    .values(*columns)[:LISTED])
    others = failed.exclude(kind=OperationKind.VALIDATE)
    found.failed_operations_total = others.count()
    found.failed_operations = list(others.order_by("-finished_at").values(*columns)[:LISTED])
    found.stuck_operations = list(
        Operation.objects.filter(state__in=[OperationState.PENDING, OperationState.RUNNING],
                                 updated_at__lt=now - settings.MERIDIAN_STUCK_AFTER)
        .order_by("updated_at").values(*columns)[:LISTED])


def _incidents(found: Problems) -> None:
    open_ = Incident.objects.filter(resolved_at__isnull=True)
    found.incident_counts = dict(open_.values_list("kind").annotate(n=Count("pk")).order_by("-n", "kind"))
    # Worst first: those still hurting work (not restored), then by GPUs affected.
    found.incidents = list(open_.order_by(F("restored_at").asc(nulls_first=True), "-gpus_affected", "-detected_at")
                           .values("pk", "kind", "summary", "gpus_affected", "detected_at", "restored_at",
                                   "node_id", "reservation_id")[:LISTED])


def queue_waits(now: datetime) -> dict:
    """How many reservations wait in the queue, and how long they have waited (p50, p95, longest) in seconds."""
    waiting = Reservation.objects.filter(state=R.QUEUED)
    submitted = list(waiting.order_by("submitted_at").values_list("submitted_at", flat=True)[:QUEUE_SAMPLE])
    waits = sorted((now - at).total_seconds() for at in submitted)
    depth = waiting.count() if len(submitted) == QUEUE_SAMPLE else len(submitted)
    return {"depth": depth, "p50_s": _percentile(waits, 0.5), "p95_s": _percentile(waits, 0.95),
            "longest_s": waits[-1] if waits else None}


def _percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile of sorted ``values``."""
    if not values:
        return None
    return values[min(len(values) - 1, max(0, round(q * len(values) + 0.5) - 1))]
