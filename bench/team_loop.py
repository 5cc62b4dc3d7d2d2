"""
Meridian's scheduler loop in simulated time, over a ``team_workload`` workload, with the real
priority scorer (``priority.rank``) and planner (``Planner``). ``bench/team_proposal.py`` changes
a few of its steps (a proposal, tried here without touching ``provisioning/scheduling``).

``Replay``, the loop as ``provisioning.scheduling.scheduler`` runs it: every cycle (``cycle_s`` of
simulated time; the real loop's is 0.5 s, so waits here are up to that much longer) the queue is
ranked by ``priority.rank`` from each team's record -- fulfilment (used / (used + no-shows) so
far), load (GPUs held / quota), approved high-priority status, decayed usage over its fair share
-- and the best-ranked ``QUEUE_DEPTH`` are placed in that order by one long-lived ``Planner``
whose index moves to "now" each cycle (``Capacity.advance``, as the kept capacity does). What
does not fit waits and nothing is held for it: later-ranked work that fits starts (backfill). A
cycle with no release since the last one tries only the work queued since (the rest failed
against at least as much capacity). A new request starting now that outranks everything queued
in its pool is tried at once (the fast path). Releases (a booked end, an early release, a
no-show reclaimed) free capacity at once.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid5

from team_workload import (
    DAY,
    GANG_GPUS,
    GPUS_PER_NODE,
    HOUR,
    LEAVES_PER_POD,
    NODES_PER_LEAF,
    Job,
    Workload,
)

from provisioning.scheduling.plan_types import (
    BARE_METAL,
    BARE_METAL_POOL,
    SHARED_POOL,
    GPUCapacity,
    NodeCapacity,
    Placement,
    Request,
    Snapshot,
)
from provisioning.scheduling.planner import Planner
from provisioning.scheduling.priority import DEFAULT_WEIGHTS, Weights, rank

NAMESPACE = UUID("1d7c5b0e-4a8f-4e36-9d0b-6c2f3e8a9b41")
EPOCH = datetime(2024, 1, 1, tzinfo=UTC)
REGION = "teams"
MODEL = uuid5(NAMESPACE, "model")
HEADROOM = 0.10  # MERIDIAN_HEADROOM; all work here is on-demand, which may use it
QUEUE_DEPTH = 1000  # MERIDIAN_SCHEDULER_QUEUE_DEPTH
WARMUP_DAYS = 1.0
TAIL_DAYS = 1.0
# Why a request did not fit in a cycle, by what was free now: a node (bare metal: enough whole nodes)
# with its GPUs free but booked ahead (advance reservations, holds); enough GPUs in the pool but not
# on one node (bare metal: not on whole nodes); not enough GPUs free in the pool.
BLOCKED = ("booked_ahead", "fragmented", "full")


def fleet_snapshot(workload: Workload) -> Snapshot:
    fabric = uuid5(NAMESPACE, "fabric")
    nodes = []
    for i in range(workload.nodes):
        leaf = i // NODES_PER_LEAF
        pool = BARE_METAL_POOL if leaf < workload.bare_metal_leaves else SHARED_POOL
        nodes.append(NodeCapacity(
            node_id=uuid5(NAMESPACE, f"node:{i}"), region=REGION, fabric_id=fabric,
            leaf_id=uuid5(NAMESPACE, f"leaf:{leaf}"), pod=leaf // LEAVES_PER_POD, pool=pool, gpu_model_id=MODEL,
            gpus=[GPUCapacity(gpu_id=uuid5(NAMESPACE, f"gpu:{i}:{k}"), index=k, memory_mib=80 * 1024)
                  for k in range(GPUS_PER_NODE)],
            installed=GPUS_PER_NODE,
        ))
    return Snapshot(now=EPOCH, nodes=nodes)


class TeamBook:
    """A team's record as the scheduler reads it: outcomes so far, GPUs held, usage decayed with the half-life."""

    __slots__ = ("used", "no_shows", "active", "held", "running_gpus", "running_gpu_start", "decayed", "decayed_at")

    def __init__(self):
        self.used = self.no_shows = 0  # reservations ended as used, and reclaimed as no-shows
        self.active = 0  # started, not ended: used as booked so far (a no-show is known once reclaimed)
        self.held = 0  # GPUs of scheduled and active reservations (QUOTA_STATES)
        self.running_gpus = 0
        self.running_gpu_start = 0.0  # sum of gpus x start of running work
        self.decayed = 0.0  # GPU-hours of ended work, decayed to ``decayed_at``
        self.decayed_at = 0.0

    def usage(self, now: float, half_life_s: float) -> float:
        """Decayed GPU-hours: ended work decayed by its age, running work counted whole (age 0)."""
        running = (self.running_gpus * now - self.running_gpu_start) / HOUR
        return self.decayed * 0.5 ** ((now - self.decayed_at) / half_life_s) + running

    def ended(self, gpus: int, start: float, end: float, half_life_s: float) -> None:
        self.decayed = self.usage(end, half_life_s) - (self.running_gpus * end - self.running_gpu_start) / HOUR
        self.decayed_at = end
        self.decayed += gpus * (end - start) / HOUR
        self.running_gpus -= gpus
        self.running_gpu_start -= gpus * start


class Replay:
    """Meridian's loop over one workload (see the module's doc)."""

    label = "meridian"

    def __init__(self, workload: Workload, cycle_s: float = 30.0, weights: Weights = DEFAULT_WEIGHTS):
        self.w = workload
        self.cycle_s = cycle_s
        self.weights = weights
        snapshot = fleet_snapshot(workload)
        self.planner = Planner(snapshot, headroom=HEADROOM)
        # Per pool, its nodes as (leaf, node id); per node, the booked ends of its GPUs held now, sorted.
        self.nodes: dict[str, list[tuple[UUID, UUID]]] = {BARE_METAL_POOL: [], SHARED_POOL: []}
        for node in snapshot.nodes:
            self.nodes[node.pool].append((node.leaf_id, node.node_id))
        self.ends: dict[UUID, list[float]] = {node.node_id: [] for node in snapshot.nodes}
        self.idle_nodes = {pool: len(nodes) for pool, nodes in self.nodes.items()}  # nodes with nothing running
        self.fitting: dict[tuple[str, int], int] = {}
        self.now = 0.0
        self.measure_from = WARMUP_DAYS * DAY
        self.measure_to = workload.horizon_s - TAIL_DAYS * DAY
        self.stop = workload.horizon_s
        self.events: list[tuple[float, int, int, Job]] = []  # (time, order, seq, job): releases, then starts
        self.seq = 0
        self.queue: dict[str, dict[int, Job]] = {BARE_METAL_POOL: {}, SHARED_POOL: {}}
        self.fresh: dict[str, list[Job]] = {BARE_METAL_POOL: [], SHARED_POOL: []}
        self.freed = {BARE_METAL_POOL: False, SHARED_POOL: False}
        self.busy = {BARE_METAL_POOL: 0, SHARED_POOL: 0}  # GPUs held now
        self.best_queued = {BARE_METAL_POOL: -math.inf, SHARED_POOL: -math.inf}
        self.books = [TeamBook() for _ in workload.teams]
        self.inputs: dict[int, tuple] = {}
        self.used_now = self.held_now = 0
        self.area_used = self.area_held = 0.0
        self.place_calls = self.cycles = 0

    #
    # Time and accounting
    #

    def advance(self, t: float) -> None:
        lo, hi = max(self.now, self.measure_from), min(t, self.measure_to)
        if hi > lo:
            self.area_used += self.used_now * (hi - lo)
            self.area_held += self.held_now * (hi - lo)
        self.now = t

    def push(self, t: float, order: int, job: Job) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, order, self.seq, job))

    def started(self, job: Job) -> None:
        end = job.start + job.booked_s
        for a in job.placement.assignments:
            ends = self.ends[a.node_id]
            if not ends:
                self.idle_nodes[job.pool] -= 1
            bisect.insort(ends, end)
        self.busy[job.pool] += job.gpus
        self.held_now += job.gpus
        if job.outcome != "no_show":
            self.used_now += job.gpus
        book = self.books[job.team]
        book.active += 1
        book.running_gpus += job.gpus
        book.running_gpu_start += job.gpus * job.start

    def release(self, job: Job) -> None:
        self.planner.release(job.placement)
        end = job.start + job.booked_s
        for a in job.placement.assignments:
            ends = self.ends[a.node_id]
            ends.remove(end)
            if not ends:
                self.idle_nodes[job.pool] += 1
        job.released = True
        self.busy[job.pool] -= job.gpus
        self.held_now -= job.gpus
        book = self.books[job.team]
        book.active -= 1
        if job.outcome == "no_show":
            book.no_shows += 1
        else:
            self.used_now -= job.gpus
            book.used += 1
        book.held -= job.gpus
        book.ended(job.gpus, job.start, self.now, self.weights.usage_half_life_s)
        self.freed[job.pool] = True

    #
    # Scoring and placing
    #

    def refresh_inputs(self) -> None:
        hl = self.weights.usage_half_life_s
        for team, book in zip(self.w.teams, self.books, strict=True):
            total = book.used + book.active + book.no_shows
            rate = (book.used + book.active) / total if total else None
            fair = max(team.quota_gpus, 1) * hl / HOUR
            self.inputs[team.index] = (rate, book.held / team.quota_gpus, team.high_priority,
                                       book.usage(self.now, hl) / fair)

    def ranked(self, jobs) -> list[tuple[Job, float]]:
        by_id = {j.idx: j for j in jobs}
        entries = [(j.idx, j.submit, j.urgency, *self.inputs[j.team], 0.0) for j in jobs]
        return [(by_id[i], s) for i, s in rank(entries, self.weights, self.now)]

    def request(self, job: Job, score: float, start: float | None = None) -> Request:
        start = max(job.start_at, self.now) if start is None else start
        return Request(
            reservation_id=UUID(int=job.idx + 1), kind=job.kind, gpu_model_ids=(MODEL,), regions=(REGION,),
            units=job.units, gpus_per_unit=job.gpus_per_unit, start=EPOCH + timedelta(seconds=start),
            end=EPOCH + timedelta(seconds=start + job.booked_s), priority=score, on_demand=True,
        )

    def place(self, job: Job, score: float, start: float | None = None) -> Placement | None:
        self.place_calls += 1
        return self.planner.place(self.request(job, score, start))

    def try_place(self, job: Job, score: float) -> bool:
        placement = self.place(job, score)
        if placement is None:
            return False
        self.take(job, placement)
        return True

    def take(self, job: Job, placement: Placement) -> None:
        job.placement = placement
        job.start = (placement.start - EPOCH).total_seconds()
        job.leaves = placement.leaves
        self.books[job.team].held += job.gpus
        self.queue[job.pool].pop(job.idx, None)
        if job.start <= self.now:
            self.started(job)
        else:
            self.push(job.start, 1, job)
        self.push(job.start + job.held_s, 0, job)

    def fits_now(self, job: Job, free: int) -> bool:
        """False only when it cannot fit: work starting now needs as many GPUs free now (the planner would say no)."""
        return job.start_at > self.now or job.gpus <= free

    def plan_pool(self, pool: str) -> None:
        queue = self.queue[pool]
        candidates = list(queue.values()) if self.freed[pool] else [j for j in self.fresh[pool] if j.idx in queue]
        self.fresh[pool] = []
        self.freed[pool] = False
        if not candidates:
            return
        ranked = self.order(self.ranked(candidates))
        whole = len(candidates) == len(self.queue[pool])
        if whole:
            ranked = ranked[:QUEUE_DEPTH]
        free = self.w.pool_gpus(pool) - self.busy[pool]
        best = -math.inf  # the best score left queued, for the fast path
        for job, score in ranked:
            if self.fits_now(job, free) and self.try_place(job, score):
                if job.start <= self.now:
                    free -= job.gpus
            else:
                best = max(best, score)
                self.note_blocked(job, free)
                self.blocked(pool, job, score)
        self.best_queued[pool] = best if whole else max(best, self.best_queued[pool])

    def note_blocked(self, job: Job, free: int) -> None:
        """What was free now when it did not fit (``BLOCKED``)."""
        if job.kind == BARE_METAL:
            fits = self.idle_nodes[job.pool] >= job.units
        else:
            key = (job.pool, job.gpus_per_unit)
            if key not in self.fitting:  # nodes with that many GPUs free now, counted once a cycle
                self.fitting[key] = sum(1 for _, node in self.nodes[job.pool]
                                        if GPUS_PER_NODE - len(self.ends[node]) >= job.gpus_per_unit)
            fits = self.fitting[key] >= job.units
        job.tries[0 if fits else 1 if job.gpus <= free else 2] += 1

    def order(self, ranked: list[tuple[Job, float]]) -> list[tuple[Job, float]]:
        """The order of trial: the ranking's."""
        return ranked

    def blocked(self, pool: str, job: Job, score: float) -> None:
        """A request of this cycle's plan that did not fit (the proposal holds capacity for the first few)."""

    def cycle(self) -> None:
        self.cycles += 1
        self.fitting = {}
        self.planner.capacity.advance(EPOCH + timedelta(seconds=self.now))
        self.refresh_inputs()
        for pool in (BARE_METAL_POOL, SHARED_POOL):
            self.plan_pool(pool)

    def arrive(self, job: Job) -> None:
        """The fast path: a request starting now that outranks all queued work of its pool is tried at once."""
        queue = self.queue[job.pool]
        queue[job.idx] = job
        if not job.advance:
            if not self.inputs:
                self.refresh_inputs()
            score = self.ranked([job])[0][1]
            if len(queue) == 1 or score > self.best_queued[job.pool]:
                self.planner.capacity.advance(EPOCH + timedelta(seconds=self.now))
                if self.fits_now(job, self.w.pool_gpus(job.pool) - self.busy[job.pool]) and self.try_place(job, score):
                    return
        self.fresh[job.pool].append(job)

    #
    # The run
    #

    def run(self) -> dict:
        started = time.perf_counter()
        jobs = self.w.jobs
        for job in jobs:  # a workload may be replayed more than once
            job.start, job.placement, job.leaves, job.released = None, None, 0, False
            job.tries = [0, 0, 0]
        i = 0
        next_cycle = 0.0  # cycles run on a grid of cycle_s; one with nothing to do is skipped
        while True:
            t_arrival = jobs[i].submit if i < len(jobs) else math.inf
            t_event = self.events[0][0] if self.events else math.inf
            pending = self.freed[BARE_METAL_POOL] or self.freed[SHARED_POOL] or any(self.fresh.values())
            t_cycle = max(next_cycle, math.ceil(self.now / self.cycle_s) * self.cycle_s) if pending else math.inf
            t = min(t_arrival, t_event, t_cycle)
            if t >= self.stop:
                break
            self.advance(t)
            if t_event <= t:
                _, order, _, job = heapq.heappop(self.events)
                if order == 0:
                    self.release(job)
                else:
                    self.started(job)
            elif t_arrival <= t:
                self.arrive(jobs[i])
                i += 1
            else:
                self.cycle()
                next_cycle = t + self.cycle_s
        self.advance(self.stop)
        return self.figures(time.perf_counter() - started)

    #
    # Figures
    #

    def counters(self) -> dict:
        return {}

    def late_small(self, under: list[Job], waits: dict[int, float]) -> dict:
        """Work under GANG_GPUS that waited over 2 h; how often what it asked for was free now when it did not fit."""
        late = [j for j in under if waits[j.idx] > 2 * HOUR]
        tries = [sum(j.tries[k] for j in late) for k in range(len(BLOCKED))]
        total = sum(tries)
        sizes = sorted({j.gpus for j in late})
        return {"late_under_64": len(late),
                "late_under_64_by_gpus": {g: sum(1 for j in late if j.gpus == g) for g in sizes},
                "late_under_64_blocked": {why: n / total if total else 0.0
                                          for why, n in zip(BLOCKED, tries, strict=True)}}

    def figures(self, wall: float) -> dict:
        w = self.w
        window = [j for j in w.jobs if self.measure_from <= j.submit < self.measure_to]
        now_work = [j for j in window if not j.advance]
        # Rounded to the millisecond: a start read back from the planner is rounded to its microsecond ticks.
        waits = {j.idx: round(max(0.0, (j.start if j.start is not None else self.stop) - j.submit), 3)
                 for j in now_work}
        under = [j for j in now_work if j.gpus < GANG_GPUS]
        hp = {t.index for t in w.teams if t.high_priority}
        gangs = [j for j in window if j.category.name == "gang" and j.start is not None]
        mids = [j for j in window if j.category.name == "mid" and j.start is not None]
        advance = [j for j in window if j.advance and j.start_at < self.stop]
        on_time = {j.idx for j in advance if j.start is not None and j.start <= j.start_at + 1e-6}
        span = self.measure_to - self.measure_from
        hp_p90 = pct([waits[j.idx] for j in now_work if j.team in hp], 90)
        other_p90 = pct([waits[j.idx] for j in now_work if j.team not in hp], 90)
        # Work that waited for capacity, not only for the next cycle: where priority decides.
        queued = [j for j in now_work if waits[j.idx] > self.cycle_s]
        hp_q90 = pct([waits[j.idx] for j in queued if j.team in hp], 90)
        other_q90 = pct([waits[j.idx] for j in queued if j.team not in hp], 90)
        by_size = {}
        for j in now_work:
            by_size.setdefault(f"{j.gpus:03d}", []).append(waits[j.idx])
        return {
            "jobs_measured": len(window),
            "now_work": len(now_work),
            "unstarted": sum(1 for j in now_work if j.start is None),
            "unstarted_under_64": sum(1 for j in under if j.start is None),
            "wait_s": stats(list(waits.values())),
            "wait_under_64_s": stats([waits[j.idx] for j in under]),
            "wait_by_gpus_s": {k: stats(v) for k, v in sorted(by_size.items())},
            "hp_p90_s": hp_p90,
            "others_p90_s": other_p90,
            "hp_p90_ratio": ratio(hp_p90, other_p90),
            "queued": len(queued),
            "queued_hp": sum(1 for j in queued if j.team in hp),
            "hp_queued_p90_s": hp_q90,
            "others_queued_p90_s": other_q90,
            "hp_queued_p90_ratio": ratio(hp_q90, other_q90),
            "hp_under_64_p90_s": pct([waits[j.idx] for j in under if j.team in hp], 90),
            "others_under_64_p90_s": pct([waits[j.idx] for j in under if j.team not in hp], 90),
            **self.late_small(under, waits),
            "gangs_placed": len(gangs),
            "gangs_one_leaf": sum(1 for j in gangs if j.leaves == 1) / len(gangs) if gangs else 0.0,
            "gangs_one_leaf_by_nodes": {n: share_one_leaf([j for j in gangs if j.units == n])
                                        for n in sorted({j.units for j in gangs})},
            "mid_one_leaf": share_one_leaf(mids),
            "advance_reservations": len(advance),
            "advance_on_time": len(on_time) / len(advance) if advance else 1.0,
            "advance_late": len(advance) - len(on_time),
            "advance_late_mean_s": mean([(j.start if j.start is not None else self.stop) - j.start_at
                                         for j in advance if j.idx not in on_time]),
            "useful_utilization": self.area_used / (w.gpus * span),
            "held_utilization": self.area_held / (w.gpus * span),
            "place_calls": self.place_calls,
            "cycles": self.cycles,
            **self.counters(),
            "wall_s": wall,
        }


def ratio(a: float, b: float) -> float:
    return a / b if b else (0.0 if not a else math.inf)


def share_one_leaf(jobs: list[Job]) -> float:
    return sum(1 for j in jobs if j.leaves == 1) / len(jobs) if jobs else 0.0



def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def stats(values: list[float]) -> dict:
    return {"n": len(values), "mean": mean(values), "p50": pct(values, 50), "p90": pct(values, 90),
            "p99": pct(values, 99), "max": max(values, default=0.0)}
