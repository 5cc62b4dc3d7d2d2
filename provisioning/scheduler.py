"""
The scheduler cycle: rank the queue, plan against a snapshot of free capacity, apply the plan.

``plan`` (provisioning.planner) is pure; this module loads, ranks and applies through services.
It works platform-wide on purpose. One process leads (cloud.db.LeaderLock); whatever lost a race
to the fast path in the meantime is simply re-planned next cycle.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from cloud.errors import Conflict, QuotaExceeded
from cloud.models import Region

from . import admission
from .allocations import CapacityTaken, unallocatable
from .choices import ReservationState as R
from .models import Reservation
from .planner import plan
from .priority import Weights, rank
from .services import reservation_schedule, weights
from .snapshot import load_snapshot, request_for
from .team_record import team_inputs

log = logging.getLogger(__name__)
MAX_QUEUE = 20_000
# What ranking, planning and applying read of a queued reservation (not its key or breakdown).
QUEUE_COLUMNS = ["id", "tenant_id", "team_id", "name", "gpu_model_id", "offering", "submitted_at", "urgency", "units",
                 "gpus", "regions", "requested_start", "duration", "billing_term", "eviction_policy", "score",
                 "state", "state_reason", "offering__kind", "offering__gpus_per_unit", "offering__slots_per_gpu",
                 "offering__gpu_model_id"]
WAITING_REASONS_PER_CYCLE = 200
APPLY_BATCH = 100


@dataclass
class CycleReport:
    queued: int = 0
    placed: int = 0
    conflicts: int = 0
    over_quota: int = 0
    waiting: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def rank_queue(queued: list[Reservation], now: datetime, w: Weights) -> list[tuple]:
    """Score every queued reservation from its team's record (one read per team and model) and order them."""
    records = {}
    entries = []
    for r in queued:
        key = (r.tenant_id, r.team_id, r.gpu_model_id)
        if key not in records:
            records[key] = team_inputs(tenant=r.tenant_id, team=r.team_id, gpu_model_id=r.gpu_model_id, now=now,
                                       weights=w)
        t = records[key]
        entries.append((r.pk, r.submitted_at.timestamp(), r.urgency, t.fulfilment_rate, t.current_load,
                        t.high_priority, t.usage_share))
    return rank(entries, w, now.timestamp())


def run_cycle(*, now: datetime | None = None) -> CycleReport:
    now = now or timezone.now()
    report = CycleReport()
    clock = time.perf_counter()

    def lap(name):
        nonlocal clock
        report.timings_ms[name] = round((time.perf_counter() - clock) * 1000, 2)
        clock = time.perf_counter()

    queued = list(Reservation.objects.filter(state=R.QUEUED).select_related("offering").only(*QUEUE_COLUMNS)
                  .order_by("submitted_at")[:MAX_QUEUE])
    report.queued = len(queued)
    if not queued:
        return report
    by_id = {r.pk: r for r in queued}
    ranked = rank_queue(queued, now, weights())
    lap("rank")
    requests = []
    depth = settings.MERIDIAN_SCHEDULER_QUEUE_DEPTH
    for reservation_id, total in ranked[:depth]:
        reservation = by_id[reservation_id]
        reservation.score = total
        requests.append(request_for(reservation, now))
    snapshot = load_snapshot(now=now, until=max(r.end for r in requests),
                             regions={region for r in requests for region in r.regions},
                             gpu_model_ids={m for r in requests for m in r.gpu_model_ids})
    lap("snapshot")
    result = plan(snapshot, requests, headroom=settings.MERIDIAN_HEADROOM)
    lap("plan")
    over_quota = _owners_over_quota([by_id[p.reservation_id] for p in result.placements], now)
    # Checked once for the cycle: GPUs whose node was held back since the snapshot are refused.
    refused = unallocatable({a.gpu_id for p in result.placements for a in p.assignments})
    regions = {r.slug: r for r in Region.objects.filter(slug__in={p.region for p in result.placements})}
    # Placements commit in batches: one transaction per batch, a savepoint per placement (inside
    # reservation_schedule), so a lost race undoes only its own placement and a cycle pays for a
    # few commits instead of one per placement.
    for batch_start in range(0, len(result.placements), APPLY_BATCH):
        with transaction.atomic():
            for placement in result.placements[batch_start:batch_start + APPLY_BATCH]:
                _apply(placement, by_id[placement.reservation_id], over_quota, refused, regions, result, report)
    _note_waiting([(by_id[rid], reason) for rid, reason in result.unplaced.items()])
    report.waiting = len(queued) - report.placed
    lap("apply")
    return report


def _apply(placement, reservation, over_quota, refused, regions, result, report) -> None:
    try:
        if _owner(reservation) in over_quota:
            raise over_quota[_owner(reservation)]
        if any(a.gpu_id in refused for a in placement.assignments):
            raise CapacityTaken("A planned node was held back since the snapshot.")
        reservation_schedule(reservation=reservation, placement=placement, actor=None,
                             region=regions[placement.region], checked=True)
        report.placed += 1
    except QuotaExceeded as exc:
        report.over_quota += 1
        result.unplaced[reservation.pk] = str(exc.detail)
    except Conflict:
        # Lost a race: the capacity (CapacityTaken), or the reservation or a victim moved on
        # (cancelled, released) since the snapshot. Re-planned next cycle if still queued.
        report.conflicts += 1


def _owner(reservation: Reservation) -> tuple:
    return reservation.tenant_id, reservation.team_id, reservation.gpu_model_id


def _owners_over_quota(placed: list[Reservation], now: datetime) -> dict[tuple, QuotaExceeded]:
    """
    Quotas are checked again at placement: one lowered since admission keeps the reservation
    queued. Placing queued work does not change what counts (waiting work counts already), so
    one check per owner and GPU model over the span of all its placements this cycle covers
    each of them: usage over a wider window is never smaller.
    """
    spans: dict[tuple, list] = {}
    for r in placed:
        start = max(r.requested_start or now, now)
        span = spans.setdefault(_owner(r), [start, start + r.duration, r])
        span[0], span[1] = min(span[0], start), max(span[1], start + r.duration)
    refused = {}
    for owner, (start, end, r) in spans.items():
        ask = admission.Ask(name=r.name, offering=r.offering, units=r.units, regions=(), duration=end - start)
        try:
            admission.check_quota(tenant=r.tenant_id, team=r.team_id, ask=ask, window_start=start,
                                  counted_already=True)
        except QuotaExceeded as exc:
            refused[owner] = exc
    return refused


def _note_waiting(waiting: list[tuple[Reservation, str]]) -> None:
    """
    Tell the best-ranked waiting reservations why they wait, with their current score (the age
    term moves it every cycle): one batched UPDATE; state is not written, so a concurrent move
    stands (at worst its reason is overwritten once).
    """
    top = [reservation for reservation, reason in waiting[:WAITING_REASONS_PER_CYCLE]]
    for reservation, reason in waiting[:WAITING_REASONS_PER_CYCLE]:
        reservation.state_reason = reason[:500]
    Reservation.objects.bulk_update(top, ["state_reason", "score"], batch_size=500)
