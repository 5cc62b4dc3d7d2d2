"""
The scheduler cycle: rank the queue, plan against a snapshot of free capacity, apply the plan.

``plan`` (provisioning.planner) is pure; this module loads, ranks and applies through services.
It works platform-wide on purpose. One process leads (cloud.db.LeaderLock); whatever lost a race
to the fast path in the meantime is simply re-planned next cycle.
"""

from __future__ import annotations

import gc
import logging
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from cloud.db import update_rows
from cloud.errors import Conflict, QuotaExceeded
from cloud.models import Region

from . import admission
from .allocations import CapacityTaken, nodes_held_back
from .choices import ReservationState as R
from .models import Reservation
from .planner import plan
from .priority import Weights, rank
from .services import reservation_schedule, reservation_schedule_many, weights
from .snapshot import load_snapshot, request_for
from .team_record import team_inputs_many

log = logging.getLogger(__name__)
MAX_QUEUE = 20_000
# What ranking reads of every queued reservation (in this order), and what planning and applying
# read of those ranked high enough to be planned this cycle.
RANKING_COLUMNS = ["id", "tenant_id", "team_id", "gpu_model_id", "submitted_at", "urgency"]
QUEUE_COLUMNS = ["id", "tenant_id", "team_id", "name", "gpu_model_id", "offering", "submitted_at", "urgency", "units",
                 "gpus", "regions", "requested_start", "duration", "billing_term", "eviction_policy", "score",
                 "state", "state_reason", "offering__kind", "offering__gpus_per_unit", "offering__slots_per_gpu",
                 "offering__gpu_model_id", "vpc__fabric"]
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


class TeamRecords:
    """
    The scheduler loop's teams' records, reread every ``refresh_s`` (they move slowly: 30-day
    rates, load, usage decaying over hours); owners new to the queue are read at once.
    """

    def __init__(self, refresh_s: float):
        self.refresh_s = refresh_s
        self.records: dict[tuple, object] = {}
        self.read_at = float("-inf")

    def get(self, owners: set[tuple], now: datetime, w: Weights) -> dict:
        if time.monotonic() - self.read_at >= self.refresh_s:
            self.records, self.read_at = {}, time.monotonic()
        missing = owners - self.records.keys()
        if missing:
            self.records.update(team_inputs_many(missing, now=now, weights=w))
        return self.records


def rank_queue(queued: list[tuple], now: datetime, w: Weights, records: TeamRecords | None = None) -> list[tuple]:
    """
    Score every queued reservation -- rows of RANKING_COLUMNS -- from its owner's record (read
    for all owners at once, or kept by ``records``) and order them best first:
    ``[(reservation_id, score), ...]``.
    """
    owners = {(tenant, team, model) for _, tenant, team, model, _, _ in queued}
    records = (records or TeamRecords(refresh_s=0)).get(owners, now, w)
    entries = []
    for reservation_id, tenant, team, model, submitted_at, urgency in queued:
        t = records[(tenant, team, model)]
        entries.append((reservation_id, submitted_at.timestamp(), urgency, t.fulfilment_rate, t.current_load,
                        t.high_priority, t.usage_share))
    return rank(entries, w, now.timestamp())


@contextmanager
def collector_paused():
    """
    A cycle makes tens of thousands of short-lived objects and no reference cycles worth
    chasing: with the collector on it ran hundreds of times a cycle (over half a second).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


LAST_CYCLE_KEY = "meridian:scheduler:last-cycle"


def run_cycle(*, now: datetime | None = None, records: TeamRecords | None = None) -> CycleReport:
    """One cycle. The loop passes ``records`` to keep the teams' records between cycles."""
    with collector_paused():
        report = _cycle(now or timezone.now(), records)
    # For the staff console and /metrics: what the last cycle did, whichever process ran it.
    cache.set(LAST_CYCLE_KEY, {**report.as_dict(), "finished_at": timezone.now().isoformat()}, None)
    return report


def last_cycle() -> dict | None:
    """The last cycle's report (counts, phase timings, ``finished_at``), or None before the first."""
    return cache.get(LAST_CYCLE_KEY)


def _cycle(now: datetime, records: TeamRecords | None) -> CycleReport:
    report = CycleReport()
    clock = time.perf_counter()

    def lap(name):
        nonlocal clock
        report.timings_ms[name] = round((time.perf_counter() - clock) * 1000, 2)
        clock = time.perf_counter()

    # Rank from a few columns of every queued reservation; load whole rows only for the top.
    queued = list(Reservation.objects.filter(state=R.QUEUED).order_by("submitted_at")
                  .values_list(*RANKING_COLUMNS)[:MAX_QUEUE])
    report.queued = len(queued)
    if not queued:
        return report
    ranked = rank_queue(queued, now, weights(), records)[:settings.MERIDIAN_SCHEDULER_QUEUE_DEPTH]
    by_id = Reservation.objects.select_related("offering", "vpc").only(*QUEUE_COLUMNS).in_bulk(
        [reservation_id for reservation_id, _ in ranked])
    lap("rank")
    requests = []
    for reservation_id, total in ranked:
        reservation = by_id.get(reservation_id)
        if reservation is None or reservation.state != R.QUEUED:
            continue  # moved on since the queue was read
        reservation.score = total
        requests.append(request_for(reservation, now))
    if not requests:
        return report
    snapshot = load_snapshot(now=now, until=max(r.end for r in requests),
                             regions={region for r in requests for region in r.regions},
                             gpu_model_ids={m for r in requests for m in r.gpu_model_ids})
    lap("snapshot")
    result = plan(snapshot, requests, headroom=settings.MERIDIAN_HEADROOM,
                  max_placements=settings.MERIDIAN_SCHEDULER_MAX_PLACEMENTS)
    lap("plan")
    over_quota = _owners_over_quota([by_id[p.reservation_id] for p in result.placements], now)
    # Checked once for the cycle: placements on a node held back since the snapshot are refused.
    refused = nodes_held_back({a.node_id for p in result.placements for a in p.assignments})
    regions = {r.slug: r for r in Region.objects.filter(slug__in={p.region for p in result.placements})}
    # Placements commit in batches, one transaction and a few statements each (a cycle pays for
    # a few commits, not one per placement); a batch that meets a lost race is redone one by one.
    for batch_start in range(0, len(result.placements), APPLY_BATCH):
        with transaction.atomic():
            _apply_batch(result.placements[batch_start:batch_start + APPLY_BATCH], by_id, over_quota, refused,
                         regions, result, report)
    _note_waiting([(by_id[rid], reason) for rid, reason in result.unplaced.items()])
    report.waiting = len(queued) - report.placed
    lap("apply")
    return report


def _apply_batch(placements, by_id, over_quota, refused, regions, result, report) -> None:
    plain = []
    for placement in placements:
        reservation = by_id[placement.reservation_id]
        if _owner(reservation) in over_quota:
            report.over_quota += 1
            result.unplaced[reservation.pk] = str(over_quota[_owner(reservation)].detail)
        elif any(a.node_id in refused for a in placement.assignments):
            report.conflicts += 1  # a planned node was held back since the snapshot
        elif placement.evictions:
            _apply(placement, reservation, regions, report)  # rare: the victims are locked one by one
        else:
            plain.append((reservation, placement, regions[placement.region]))
    if not plain:
        return
    try:
        moved = reservation_schedule_many(items=plain)
    except CapacityTaken:
        for reservation, placement, _ in plain:
            _apply(placement, reservation, regions, report)
        return
    report.placed += len(moved)
    report.conflicts += len(plain) - len(moved)


def _apply(placement, reservation, regions, report) -> None:
    """One placement in its own savepoint: a lost race undoes only itself."""
    try:
        reservation_schedule(reservation=reservation, placement=placement, actor=None,
                             region=regions[placement.region], checked=True)
        report.placed += 1
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
    each of them: usage over a wider window is never smaller. Only owners that could be over at
    all (admission.quota_suspects) are checked in detail.
    """
    suspects = admission.quota_suspects({_owner(r) for r in placed})
    spans: dict[tuple, list] = {}
    for r in placed:
        if _owner(r) not in suspects:
            continue
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
    update_rows(Reservation, top, ["state_reason", "score"])
