"""
A proposed change to the scheduler loop, tried on the ``team_loop`` replay without touching
``provisioning/scheduling``: holds, latency classes and one leaf for gangs.

Holds. During a cycle's plan, a request that does not fit now may be booked at its earliest start
(a future window, which the planner already keeps: later work fits in front of it only if it ends
first). A hold is kept across cycles and booked again, sooner, when capacity comes back early; once
its start has come it is placed for real; an advance reservation that finds a hold in its way goes
first (the holds are booked again after it). The first ``holds`` requests of a pool's ranked plan
that do not fit now get one (the head of the queue, as in EASY backfilling); so does every request
under ``GANG_GPUS`` that has waited ``starve_s`` (oldest first, before anything ranked is planned;
if only the holds keep it out, it goes before them).

Latency classes. Work under ``GANG_GPUS`` is planned before gangs, each class in the ranking's order.

One leaf. A gang that fits under one leaf switch waits for one leaf (and is held on one) until it
has waited ``leaf_wait_s``; an advance reservation's window comes first.
"""

from __future__ import annotations

from uuid import UUID

from team_loop import EPOCH, Replay
from team_workload import GANG_GPUS, GPUS_PER_NODE, HOUR, NODES_PER_LEAF, Job, Workload

from provisioning.scheduling.plan_types import BARE_METAL, BARE_METAL_POOL, SHARED_POOL, Placement
from provisioning.scheduling.priority import DEFAULT_WEIGHTS, Weights

HOLD_TRIES = 6  # start times tried for one hold


class HoldingReplay(Replay):
    """The loop with the proposal's holds, latency classes and one leaf for gangs (see the module's doc)."""

    label = "proposal"

    def __init__(self, workload: Workload, cycle_s: float = 30.0, weights: Weights = DEFAULT_WEIGHTS, *,
                 holds: int = 2, starve_s: float = HOUR, leaf_wait_s: float = 48 * HOUR, classes: bool = True,
                 displace: bool = True):
        super().__init__(workload, cycle_s, weights)
        self.classes = classes
        self.displace = displace
        self.holds = holds
        self.starve_s = starve_s
        self.leaf_wait_s = leaf_wait_s
        self.held: dict[str, dict[int, tuple[Job, Placement]]] = {BARE_METAL_POOL: {}, SHARED_POOL: {}}
        self.tables: dict[tuple, list] = {}  # earliest-start tables of this cycle (start_times)
        self.holds_booked = self.holds_missed = self.holds_moved = self.spread_refused = self.starving_held = 0

    def counters(self) -> dict:
        return {"holds_booked": self.holds_booked, "holds_missed": self.holds_missed, "holds_moved": self.holds_moved,
                "starving_held": self.starving_held, "spread_refused": self.spread_refused}

    def waited(self, job: Job) -> float:
        return self.now - max(job.submit, job.start_at)

    def order(self, ranked: list[tuple[Job, float]]) -> list[tuple[Job, float]]:
        """Work under GANG_GPUS first, each class in the ranking's order (a stable sort keeps it)."""
        return sorted(ranked, key=lambda item: item[0].gpus >= GANG_GPUS) if self.classes else ranked

    def plan_pool(self, pool: str) -> None:
        self.tables = {}
        if self.freed[pool]:
            self.revisit(pool)
        self.advance_first(pool)
        queue, held = self.queue[pool], self.held[pool]
        starving = []
        for job in queue.values():  # in submission order (advance reservations wait from their start)
            if self.waited(job) < self.starve_s:
                if not job.advance:
                    break
            elif job.idx not in held and job.gpus < GANG_GPUS:
                starving.append(job)
        for job, score in self.ranked(starving):
            if self.try_place(job, score) or self.before_holds(pool, job, score):
                continue
            if self.book(pool, job, score):
                self.starving_held += 1
        super().plan_pool(pool)

    def before_holds(self, pool: str, job: Job, score: float) -> bool:
        """Starving work under GANG_GPUS that the holds keep out goes first (holds are booked again after it)."""
        held = self.held[pool]
        if not held or not self.displace:
            return False
        holds = list(held.values())
        for _, hold in holds:
            self.planner.release(hold)
        held.clear()
        placed = self.try_place(job, score)
        for other, _ in holds:
            self.book(pool, other, self.ranked([other])[0][1])
        return placed

    def advance_first(self, pool: str) -> None:
        """A new advance reservation is a commitment, a hold is not: one that a hold is in the way of goes first."""
        held = self.held[pool]
        for job in self.fresh[pool] if held else ():
            if not job.advance or job.idx not in self.queue[pool] or job.start_at <= self.now:
                continue
            score = self.ranked([job])[0][1]
            if self.try_place(job, score):
                continue
            holds = list(held.values())
            for _, hold in holds:
                self.planner.release(hold)
            held.clear()
            self.try_place(job, score)
            for other, _ in holds:
                self.book(pool, other, self.ranked([other])[0][1])

    def revisit(self, pool: str) -> None:
        """Capacity came back: a hold that may start sooner (or now) is booked again."""
        held = self.held[pool]
        for idx, (job, hold) in list(held.items()):
            start = (hold.start - EPOCH).total_seconds()
            times = self.start_times(pool, job, self.one_leaf(job))
            if start > self.now and (not times or times[0] >= start - self.cycle_s):
                continue
            self.planner.release(hold)
            del held[idx]
            self.holds_moved += 1
            score = self.ranked([job])[0][1]
            if not self.try_place(job, score):
                self.book(pool, job, score)

    def fits_now(self, job: Job, free: int) -> bool:
        return job.idx not in self.held[job.pool] and super().fits_now(job, free)

    def blocked(self, pool: str, job: Job, score: float) -> None:
        if job.idx not in self.held[pool] and len(self.held[pool]) < self.holds:
            self.book(pool, job, score)

    def book(self, pool: str, job: Job, score: float) -> bool:
        placement = self.hold(pool, job, score)
        if placement is None:
            self.holds_missed += 1
            return False
        self.holds_booked += 1
        self.held[pool][job.idx] = (job, placement)
        return True

    def try_place(self, job: Job, score: float) -> bool:
        placement = self.place(job, score)
        if placement is None:
            return False
        if placement.leaves > 1 and self.one_leaf(job):
            self.planner.release(placement)  # undone: it waits for one leaf
            self.spread_refused += 1
            return False
        self.take(job, placement)
        return True

    def one_leaf(self, job: Job) -> bool:
        """A gang waits for one leaf for a while; an advance reservation's window comes first."""
        return (job.kind == BARE_METAL and job.gpus >= GANG_GPUS and job.units <= NODES_PER_LEAF
                and job.start_at <= self.now and self.waited(job) < self.leaf_wait_s)

    def hold(self, pool: str, job: Job, score: float) -> Placement | None:
        """Book ``job`` at the earliest of a few start times when, by the booked ends of what runs, it may fit."""
        one_leaf = self.one_leaf(job)
        for start in self.start_times(pool, job, one_leaf)[:HOLD_TRIES]:
            placement = self.place(job, score, start)
            if placement is None:
                continue
            if one_leaf and placement.leaves > 1:
                self.planner.release(placement)
                continue
            return placement
        return None

    def start_times(self, pool: str, job: Job, one_leaf: bool) -> list[float]:
        """
        When a node (for bare metal: enough whole nodes, under one leaf if it must) has the GPUs free
        by the booked ends of what holds them now, soonest first; the planner decides whether it
        really fits then (bookings ahead, such as advance reservations and holds, are not counted here).
        """
        now = self.now
        if job.kind == BARE_METAL:
            per_leaf = self.table(pool, "leaves")
            k = job.units
            times = {frees[k - 1] for frees in per_leaf if len(frees) >= k}
            every = self.table(pool, "nodes")
            if not one_leaf and len(every) >= k:
                times.add(every[k - 1])
            found = sorted(times)
        else:
            # Nodes the pool's other holds took are likely the soonest: start past as many.
            found = self.table(pool, job.gpus_per_unit)[job.units - 1 + len(self.held[pool]):]
        return [max(t, job.start_at) for t in found if t > now][:HOLD_TRIES]

    def table(self, pool: str, what) -> list:
        """This cycle's earliest-free times: per leaf its nodes' (sorted), all nodes', or per node for ``what`` GPUs."""
        key = (pool, what)
        if key not in self.tables:
            now, size = self.now, GPUS_PER_NODE
            if what in ("leaves", "nodes"):
                per_leaf: dict[UUID, list[float]] = {}
                for leaf, node in self.nodes[pool]:
                    ends = self.ends[node]
                    per_leaf.setdefault(leaf, []).append(ends[-1] if ends else now)
                self.tables[(pool, "leaves")] = [sorted(frees) for frees in per_leaf.values()]
                self.tables[(pool, "nodes")] = sorted(t for frees in per_leaf.values() for t in frees)
            else:
                frees = []
                for _, node in self.nodes[pool]:
                    ends = self.ends[node]
                    free = size - len(ends)
                    frees.append(now if free >= what else ends[what - free - 1])
                self.tables[key] = sorted(frees)
        return self.tables[key]
