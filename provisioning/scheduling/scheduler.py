"""
The scheduler cycle: rank the queue, plan against a snapshot of free capacity, apply the plan.

``plan`` (provisioning.scheduling.planner) is pure; this module loads, ranks and applies through services,
platform-wide. One process leads (cloud.leader.LeaderLock); what lost a race to the fast path is
re-planned next cycle. The loop keeps a ``LoopMemory`` between cycles -- the teams' records, the
fleet's shape, the queue's rows, the planning index -- so a cycle reads what changed, not everything.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone

from cloud.models import GPUModel, Offering, Region
from core.db import update_rows
from core.epochs import UNREADABLE
from core.errors import Conflict, QuotaExceeded
from provisioning import admission
from provisioning.allocations import CapacityTaken, nodes_held_back
from provisioning.choices import BillingTerm
from provisioning.choices import ReservationState as R
from provisioning.models import Reservation
from provisioning.scheduling.fleet_shape import FleetShape
from provisioning.scheduling.kept_capacity import KeptCapacity
from provisioning.scheduling.plan_types import Placement, Request
from provisioning.scheduling.planner import plan
from provisioning.scheduling.priority import Weights, rank
from provisioning.scheduling.queue import QUEUE_RANKING
from provisioning.scheduling.ranked_rows import RankedRows
from provisioning.scheduling.snapshot import request_for
from provisioning.scheduling.team_record import TeamRecords
from provisioning.services import reservation_schedule, reservation_schedule_many, weights

log = logging.getLogger(__name__)
MAX_QUEUE = 20_000
# What ranking reads of every queued reservation (in this order), and what planning and applying
# read of those ranked high enough to be planned this cycle.
RANKING_COLUMNS = ["id", "tenant_id", "team_id", "gpu_model_id", "submitted_at", "urgency", "priority_adjustment"]
# The offering is set from the cycle's own read of the offerings (QueueMirror.whole), not joined.
QUEUE_COLUMNS = ["id", "tenant_id", "team_id", "name", "gpu_model_id", "offering_id", "submitted_at", "urgency",
                 "units", "gpus", "regions", "requested_start", "duration", "billing_term", "eviction_policy", "score",
                 "state", "state_reason", "vpc__fabric", "managed_by"]
MIRROR_BY_IDS = 2000  # the most rows the queue mirror reads by id; more are read by one scan
OFFERING_COLUMNS = ["id", "kind", "gpus_per_unit", "slots_per_gpu", "gpu_model_id", "time_slice_class", "confidential"]
WAITING_REASONS_PER_CYCLE = 200
MODEL_NAMES_REFRESH_S = 60.0
APPLY_BATCH = 100


@dataclass
class CycleReport:
    queued: int = 0
    placed: int = 0
    conflicts: int = 0
    over_quota: int = 0
    waiting: int = 0
    # The cycle stopped at the most placements its budget allowed, with ranked work not yet tried:
    # the loop goes on at once instead of waiting out its interval.
    cut_short: bool = False
    # Whether it ranked the queue afresh, or planned from the rest of the ranking of the cut-short
    # cycle before it (LoopMemory.rerank_s).
    ranked_afresh: bool = True
    timings_ms: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


class QueueMirror:
    """
    The queue as the loop last read it. Every cycle reads which reservations are queued now (ids
    only: the truth whatever the commit order of what changed, not a change feed that could miss
    one; held ones are left out) and loads only the rows it lacks: the ranking columns never
    change once a reservation is submitted but by staff's priority adjustment, which replaces
    the queue's epoch (``QUEUE_RANKING``) so that the next cycle reads them all again. The whole
    rows of the best-ranked are kept while they stay queued and near the top. Rows the cycle
    hands to services (placed, or tried and lost) are forgotten, because services change them.
    """

    def __init__(self):
        # str(id) -> (id, owner number, submitted_at as a timestamp, urgency, adjustment): strings,
        # not UUIDs, as keys (a UUID hashes in Python code; 10,000 of them several times a cycle added up).
        self.ranking: dict[str, tuple] = {}
        self.epoch = UNREADABLE
        self.owners: list[tuple] = []  # owner number -> (tenant_id, team_id, gpu_model_id)
        self._numbers: dict[tuple, int] = {}
        self.rows = RankedRows([], {}, dict)  # id -> Reservation (QUEUE_COLUMNS), for the last cycle's top

    def queued(self) -> list[tuple]:
        """
        ``(id, owner number, submitted_at timestamp, urgency, adjustment)`` of every queued
        reservation not held (the oldest MAX_QUEUE at most, in no particular order: ranking orders
        them); ``owners`` names the owner numbers.
        """
        epoch = QUEUE_RANKING.read()  # before the read: a change after it shows next cycle
        if epoch is UNREADABLE or epoch != self.epoch:
            self.ranking, self.epoch = {}, epoch
        ids = _queued_ids()
        present = set(ids)
        if len(self.ranking) != len(present) or not present.issuperset(self.ranking):
            self.ranking = {pk: row for pk, row in self.ranking.items() if pk in present}
        missing = [pk for pk in ids if pk not in self.ranking]
        if len(missing) > MIRROR_BY_IDS:  # cold (a new leader) or a burst: one scan beats a long id list
            rows = _oldest_queued().values_list(*RANKING_COLUMNS)
        else:
            rows = Reservation.objects.filter(pk__in=missing).values_list(*RANKING_COLUMNS) if missing else ()
        for pk, tenant, team, model, submitted_at, urgency, adjustment in rows:
            if (key := str(pk)) in present:
                self.ranking[key] = (pk, self._number((tenant, team, model)), submitted_at.timestamp(), urgency,
                                     adjustment)
        ranking = self.ranking
        return [ranking[pk] for pk in ids if pk in ranking]

    def _number(self, owner: tuple) -> int:
        number = self._numbers.get(owner)
        if number is None:
            number = self._numbers[owner] = len(self.owners)
            self.owners.append(owner)
        return number

    def whole(self, ids: list) -> RankedRows:
        """
        The whole rows of ``ids`` (queued a moment ago), each read when first asked for (``RankedRows``);
        the rest of what was kept is dropped. The offerings (which staff may edit) are read every time.
        """
        offerings = Offering.objects.only(*OFFERING_COLUMNS).in_bulk()  # the catalogue: tens of rows

        def load(ids) -> dict:
            rows = Reservation.objects.select_related("vpc").only(*QUEUE_COLUMNS).in_bulk(ids)
            for reservation in rows.values():
                reservation.offering = offerings[reservation.offering_id]
            return rows

        for reservation in self.rows.loaded.values():
            reservation.offering = offerings[reservation.offering_id]
        self.rows = RankedRows(list(ids), self.rows.loaded, load)
        return self.rows

    def forget(self, ids) -> None:
        for pk in ids:
            self.rows.pop(pk, None)


class CycleBudget:
    """
    How many placements a cycle may plan so that it ends within ``budget_ms`` (0: no budget),
    like Slurm's max_sched_time: the time already spent, the planning time and the commit time
    per placement of the cycles before tell how many more fit. At most ``ceiling``, at least
    ``floor``. The estimates start pessimistic and follow the last cycles (a moving average), so
    a burst on a slow database shortens cycles at once.

    Placing (committing) keeps at least ``share`` of a cycle even when the fixed part -- ranking
    the queue, the snapshot, building the planner's index -- fills the budget by itself, as on a
    slow host or a larger fleet: the cycle then runs over its budget rather than moving the queue
    by the floor alone (on a host about half as fast, a steady minute placed 71 a second of
    scheduler time with the floor alone and 199 with a share of 0.4).
    """

    FOLLOW = 0.3  # weight of the newest cycle in the estimates
    LEARN_FROM = 10  # placements a cycle needs before its commit time per placement is learnt

    def __init__(self, budget_ms: float, ceiling: int, floor: int = 25, share: float = 0.4):
        self.budget_ms, self.ceiling, self.floor = budget_ms, ceiling, min(floor, ceiling)
        self.share = min(max(share, 0.0), 0.9)
        self.plan_ms = 30.0  # pessimistic until learnt, as is the commit time below
        self.commit_ms_each = 2.0

    def placements(self, spent_ms: float) -> int:
        if self.budget_ms <= 0:
            return self.ceiling
        return max(self.floor, min(self.ceiling, int(self._room(spent_ms) / self.commit_ms_each)))

    def ends_at(self, spent_ms: float) -> float:
        """How far into the cycle (ms) its commits should end: the budget, or later by placing's share."""
        if self.budget_ms <= 0:
            return math.inf
        return spent_ms + self.plan_ms + self._room(spent_ms)

    def _room(self, spent_ms: float) -> float:
        fixed = spent_ms + self.plan_ms
        return max(self.budget_ms - fixed, fixed * self.share / (1 - self.share))

    def learn(self, *, plan_ms: float, apply_ms: float, placed: int) -> None:
        self.plan_ms += self.FOLLOW * (plan_ms - self.plan_ms)
        if placed >= self.LEARN_FROM:
            self.commit_ms_each += self.FOLLOW * (apply_ms / placed - self.commit_ms_each)


@dataclass
class KeptRanking:
    """A cycle's ranking of the queue: how many waited, and the best-ranked ``(id, score)``."""

    at: float  # time.monotonic() when it was ranked
    queued: int
    ranked: list[tuple]


class LoopMemory:
    """
    What the scheduler loop keeps between cycles; a fresh one reads everything.

    A cycle cut short by its budget leaves ranked work it did not reach; the cycles right after
    it plan from the rest of that ranking for ``rerank_s`` seconds instead of reading and ranking
    the whole queue again (on a busy queue that was a fifth of every cycle, time a cycle then
    spends placing). Only the order is reused: the capacity, quotas and states are read every
    cycle, and what left the queue meanwhile (cancelled, placed by the fast path) is refused when
    its placement is applied, as a lost race is. Work that joined the queue waits for the next
    ranking, at most ``rerank_s`` later; a cycle that is not cut short ranks afresh next time.
    """

    def __init__(self, *, record_refresh_s: float = 0.0, usage_refresh_s: float | None = None,
                 shape_refresh_s: float = 0.0, budget_ms: float = 0.0, index_rebuild_s: float = 0.0,
                 rerank_s: float = 0.0):
        self.records = TeamRecords(refresh_s=record_refresh_s, usage_refresh_s=usage_refresh_s)
        self.shape = FleetShape(refresh_s=shape_refresh_s)
        self.capacity = KeptCapacity(self.shape, rebuild_s=index_rebuild_s)
        self.queue = QueueMirror()
        self.budget = CycleBudget(budget_ms, settings.MERIDIAN_SCHEDULER_MAX_PLACEMENTS,
                                  share=settings.MERIDIAN_SCHEDULER_PLACING_SHARE)
        # Owners found over quota at placement -> until when their work is left out of planning
        # (as long as their records are kept): refused again and again, it would take the
        # places of a budgeted cycle that others could use.
        self.over_quota: dict[tuple, float] = {}
        self.rerank_s = rerank_s
        self.last_ranking: KeptRanking | None = None  # the latest ranking made
        self.kept_ranking: KeptRanking | None = None  # the one the next cycles may plan from
        self.ranked_afresh = True  # whether the last ranked_queue ranked, or reused kept_ranking
        self.freezes = False  # the loop's own memory (for_loop) moves each new index out of the collector's way
        self._model_names: dict = {}
        self._model_names_read = -math.inf

    def model_names(self) -> dict:
        """
        GPU model names, for the reasons waiting reservations are told ("H100 in us-east-1: ...",
        not the model's id): the catalogue is a few rows that staff rarely change, read once a minute.
        """
        if time.monotonic() - self._model_names_read > MODEL_NAMES_REFRESH_S:
            self._model_names = dict(GPUModel.objects.values_list("pk", "name"))
            self._model_names_read = time.monotonic()
        return self._model_names

    def note_over_quota(self, owners) -> None:
        until = time.monotonic() + self.records.refresh_s
        self.over_quota = {owner: t for owner, t in self.over_quota.items() if t > time.monotonic()}
        self.over_quota.update(dict.fromkeys(owners, until))

    def left_out(self, reservation: Reservation) -> bool:
        until = self.over_quota.get(_owner(reservation))
        return until is not None and until > time.monotonic()

    def prime(self, now: datetime | None = None) -> None:
        """
        Read what a first cycle would read cold -- every queued reservation's ranking columns,
        its owners' records, the best-ranked rows, the fleet's shape -- before that cycle, as a
        new leader does (like kube-scheduler waiting for its caches to sync): the cycles then
        read only what changed. Nothing is planned or written.
        """
        with collector_paused():
            self.ranked_queue(now or timezone.now())
            self.capacity.for_cycle(now or timezone.now())

    def ranked_queue(self, now: datetime) -> tuple[int, list[tuple], dict]:
        """
        How many wait, the best-ranked MERIDIAN_SCHEDULER_QUEUE_DEPTH as ``(id, score)`` and their
        whole rows by id: ranked from a few columns of every queued reservation, or the rest of
        the kept ranking while it serves (``rerank_s``) and holds work not yet handed on.
        """
        kept = self.kept_ranking
        if kept is not None and time.monotonic() - kept.at < self.rerank_s:
            rows = self.queue.rows  # those handed to services since were forgotten
            if ranked := [entry for entry in kept.ranked if entry[0] in rows]:
                self.ranked_afresh = False
                return kept.queued - (len(kept.ranked) - len(ranked)), ranked, rows
        self.ranked_afresh = True
        queued = self.queue.queued()
        if not queued:
            return 0, [], {}
        ranked = rank_queue(queued, self.queue.owners, now, weights(),
                            self.records)[:settings.MERIDIAN_SCHEDULER_QUEUE_DEPTH]
        self.last_ranking = KeptRanking(at=time.monotonic(), queued=len(queued), ranked=ranked)
        return len(queued), ranked, self.queue.whole([reservation_id for reservation_id, _ in ranked])

    def cycle_ended(self, *, cut_short: bool) -> None:
        """Keep the latest ranking for the next cycles when this one left ranked work unreached."""
        self.kept_ranking = self.last_ranking if cut_short and self.rerank_s > 0 else None

    @classmethod
    def for_loop(cls) -> LoopMemory:
        memory = cls(record_refresh_s=settings.MERIDIAN_SCHEDULER_RECORD_REFRESH,
                     usage_refresh_s=settings.MERIDIAN_SCHEDULER_USAGE_REFRESH,
                     shape_refresh_s=settings.MERIDIAN_SCHEDULER_SHAPE_REFRESH,
                     budget_ms=settings.MERIDIAN_SCHEDULER_CYCLE_BUDGET_MS,
                     index_rebuild_s=settings.MERIDIAN_SCHEDULER_INDEX_REBUILD,
                     rerank_s=settings.MERIDIAN_SCHEDULER_RERANK)
        memory.freezes = True
        return memory


def _queued_ids() -> list[str]:
    """The ids of the queued reservations as strings: the oldest MAX_QUEUE at most, in no particular order."""
    if connection.vendor != "postgresql":
        return [str(pk) for pk in _oldest_queued().values_list("id", flat=True)]
    with connection.cursor() as cursor:
        cursor.execute(*_queued_ids_statement())
        joined = cursor.fetchone()[0] or ""
    return [joined[i:i + 36] for i in range(0, len(joined), 36)]


def _oldest_queued():
    return Reservation.objects.filter(state=R.QUEUED, held_at__isnull=True).order_by("submitted_at")[:MAX_QUEUE]


@functools.cache
def _queued_ids_statement() -> tuple[str, tuple]:
    """
    One text of 36-character ids: 10,000 UUID objects made and hashed each cycle cost more than
    the query. Not ordered again inside the aggregate: that second sort was half of the
    statement, and ranking orders the queue anyway. Built by the ORM once per process; only its
    own SQL is formatted in, every value is a parameter.
    """
    subquery, params = _oldest_queued().values("id").query.sql_with_params()
    return f"SELECT string_agg(id::text, '') FROM ({subquery}) AS q", params  # noqa: S608


def rank_queue(queued: list[tuple], owners: list[tuple], now: datetime, w: Weights,
               records: TeamRecords | None = None) -> list[tuple]:
    """
    Score every queued reservation -- ``QueueMirror.queued`` rows, whose owner numbers index
    ``owners`` -- from its owner's record (read for all owners at once, or kept by ``records``)
    and order them best first: ``[(reservation_id, score), ...]``.
    """
    numbers = {row[1] for row in queued}
    kept = (records or TeamRecords(refresh_s=0)).get({owners[n] for n in numbers}, now, w)
    inputs = {}
    for n in numbers:
        t = kept[owners[n]]
        inputs[n] = (t.fulfilment_rate, t.current_load, t.high_priority, t.usage_share)
    entries = [(reservation_id, submitted, urgency, *inputs[number], adjustment)
               for reservation_id, number, submitted, urgency, adjustment in queued]
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


def run_cycle(*, now: datetime | None = None, memory: LoopMemory | None = None, leader: str = "") -> CycleReport:
    """One cycle. The loop passes its ``memory`` to keep what it read between cycles, and names itself."""
    kept = memory is not None
    memory = memory if kept else LoopMemory()
    with collector_paused():
        try:
            report = _cycle(now or timezone.now(), memory)
            memory.cycle_ended(cut_short=report.cut_short)
            if memory.freezes:  # the loop's process: a new index out of the collector's way
                memory.capacity.freeze()
        finally:
            if not kept:
                memory.capacity.dispose()  # freed at once, not left to the collector
    # For the staff console and /metrics: what the last cycle did, whichever process ran it.
    cache.set(LAST_CYCLE_KEY, {**report.as_dict(), "finished_at": timezone.now().isoformat(), "leader": leader},
              None)
    return report


def last_cycle() -> dict | None:
    """The last cycle's report (counts, phase timings, ``finished_at``), or None before the first."""
    return cache.get(LAST_CYCLE_KEY)


def _cycle(now: datetime, memory: LoopMemory) -> CycleReport:
    report = CycleReport()
    began = clock = time.perf_counter()

    def lap(name):
        nonlocal clock
        report.timings_ms[name] = round((time.perf_counter() - clock) * 1000, 2)
        clock = time.perf_counter()

    report.queued, ranked, by_id = memory.ranked_queue(now)
    report.ranked_afresh = memory.ranked_afresh
    if not ranked:
        return report
    lap("rank")
    requests = _requests(ranked, by_id, memory, now)
    first = next(requests, None)
    if first is None:
        return report
    capacity = memory.capacity.for_cycle(now)  # the whole sellable fleet, kept by the loop
    lap("snapshot")
    spent_ms = (time.perf_counter() - began) * 1000
    result = plan(None, itertools.chain([first], requests), headroom=settings.MERIDIAN_HEADROOM, capacity=capacity,
                  spot_in_headroom=settings.MERIDIAN_SPOT_IN_HEADROOM,
                  max_placements=memory.budget.placements(spent_ms), model_names=memory.model_names())
    lap("plan")
    report.cut_short = result.cut_short
    planned_at, (now, result.placements) = now, _bound_from_now(result.placements, planned_at=now)
    planned, settled, xids = result.placements, set(), set()
    over_quota = _owners_over_quota([by_id[p.reservation_id] for p in result.placements], now)
    memory.note_over_quota(over_quota)
    # Checked once for the cycle: placements on a node held back since the snapshot are refused.
    refused = nodes_held_back({a.node_id for p in result.placements for a in p.assignments})
    regions = {r.slug: r for r in Region.objects.filter(slug__in={p.region for p in result.placements})}
    # Placements commit in batches, one transaction and a few statements each (a cycle pays for
    # a few commits, not one per placement); a batch that meets a lost race is redone one by one.
    ends_at_ms, applying = memory.budget.ends_at(spent_ms), time.perf_counter()
    for batch_start in range(0, len(result.placements), APPLY_BATCH):
        batch = result.placements[batch_start:batch_start + APPLY_BATCH]
        if batch_start and _would_overrun(began, applying, batch_start, len(batch), ends_at_ms):
            # This cycle commits slower than the cycles before it did (a busy database): the
            # rest of its plan is left, queued and first in the kept ranking, to the next cycle.
            result.placements, report.cut_short = result.placements[:batch_start], True
            break
        with transaction.atomic():
            settled |= _apply_batch(batch, by_id, over_quota, refused, regions, result, report)
            xids.add(memory.capacity.feed.transaction_id())
    if now == planned_at:  # (placements moved in time: read again where the plan wrote) Spot work placed is a
        # victim only once read from the database: the plan's entries are not.
        unsettled = {a.node_id for p in planned for a in p.assignments
                     if p.reservation_id not in settled or by_id[p.reservation_id].billing_term == BillingTerm.SPOT}
        memory.capacity.applied(xids, unsettled)
    _note_waiting([(by_id[rid], reason) for rid, reason in result.unplaced.items()])
    memory.queue.forget(p.reservation_id for p in result.placements)
    report.waiting = report.queued - report.placed
    lap("apply")
    memory.budget.learn(plan_ms=report.timings_ms["plan"], apply_ms=report.timings_ms["apply"],
                        placed=len(result.placements))
    return report


def _would_overrun(began: float, applying: float, applied: int, batch: int, ends_at_ms: float) -> bool:
    """Whether most of the next batch would commit after the cycle's end, at this cycle's pace so far."""
    now = time.perf_counter()
    each_ms = (now - applying) * 1000 / applied
    return (now - began) * 1000 + each_ms * batch / 2 > ends_at_ms


def _bound_from_now(placements: list[Placement], *, planned_at: datetime) -> tuple[datetime, list[Placement]]:
    """
    The moment the cycle binds from, and its placements: when the cycle has run long since
    ``planned_at`` (a slow host, a stalled database), work planned to start before now is moved,
    window and evictions alike, to start now. Bound from a moment that far back it would be
    refused as stale (allocations._check_fresh), and cycles that all ran as long would place
    nothing. The database's constraint refuses a moved window whose added end clashes, and that
    placement is planned again. A short lag moves nothing: backfill that ends as a held window
    begins would clash.
    """
    moment = timezone.now()
    if moment - planned_at < settings.MERIDIAN_ALLOCATION_ARCHIVE_AFTER / 4:
        return planned_at, placements
    return moment, [_moved(p, moment - p.start) if p.start < moment else p for p in placements]


def _moved(placement: Placement, by: timedelta) -> Placement:
    return dataclasses.replace(placement, start=placement.start + by, end=placement.end + by,
                               evictions=tuple(dataclasses.replace(e, at=e.at + by) for e in placement.evictions))


def _requests(ranked: list[tuple], by_id: dict, memory: LoopMemory, now: datetime) -> Iterator[Request]:
    """
    The planner's requests in ranked order, each made when planning reaches it: a budgeted cycle
    tries a hundred or so of the thousand it ranked, and making the rest was wasted.
    """
    for reservation_id, total in ranked:
        reservation = by_id.get(reservation_id)
        if reservation is None or reservation.state != R.QUEUED:
            continue  # moved on between reading the ids and loading the row
        if memory.over_quota and memory.left_out(reservation):
            continue  # its owner was over quota a moment ago: it keeps its place and its reason
        reservation.score = total
        yield request_for(reservation, now)


def _apply_batch(placements, by_id, over_quota, refused, regions, result, report) -> set:
    """Commit a batch (inside the caller's transaction); the reservations placed exactly as planned."""
    plain, settled = [], set()
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
        return settled
    try:
        moved = reservation_schedule_many(items=plain)
    except CapacityTaken:
        for reservation, placement, _ in plain:
            if _apply(placement, reservation, regions, report):
                settled.add(reservation.pk)
        return settled
    report.placed += len(moved)
    report.conflicts += len(plain) - len(moved)
    return settled | {reservation.pk for reservation in moved}


def _apply(placement, reservation, regions, report) -> bool:
    """One placement in its own savepoint: a lost race undoes only itself. Whether it stands as planned."""
    try:
        reservation_schedule(reservation=reservation, placement=placement, actor=None,
                             region=regions[placement.region], checked=True)
        report.placed += 1
        return not placement.evictions  # a victim's end may differ from the plan's (a hard eviction: now)
    except Conflict:
        # Lost a race: the capacity (CapacityTaken), or the reservation or a victim moved on
        # (cancelled, released) since the snapshot. Re-planned next cycle if still queued.
        report.conflicts += 1
        return False


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
