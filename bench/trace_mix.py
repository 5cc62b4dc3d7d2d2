"""
The Alibaba openb v2023 trace as a mix of Meridian's billing terms, with the headroom, spot work
and its eviction, through the pure planner in simulated time; against EASY backfill on the same jobs.

    .venv/bin/python bench/trace_replay.py --workload mix

Environment: BENCH_JOBS (arrivals, 60000), BENCH_LOAD (0.9), BENCH_SEED (1), BENCH_HEADROOM (0.10),
BENCH_GRACE_S (120, as MERIDIAN_SPOT_GRACE_SECONDS), BENCH_HEADROOM_MAX_WAIT_S (3600, as
MERIDIAN_HEADROOM_MAX_WAIT_SECONDS; ``new`` only), BENCH_POLICIES (``old,new,easy``; also ``shares``),
MERIDIAN_TRACE_DIR. The fleet, the jobs' shapes, the resampling to the offered load and the
steady state at time 0 are ``bench/trace_replay.py``'s (its module doc).

Kinds. The trace's tenant classes become billing terms: ``LS`` and ``Guaranteed`` (latency-critical,
guaranteed QoS) on-demand; ``Burstable`` reserved (not on-demand, not spot: kept out of the
headroom); ``BE`` (best effort) spot. Sub-GPU tasks (``gpu_milli`` < 1000) are fractional slots of
any of the three, reported by kind and also together as "fractional". The jobs running at time 0
get the same kinds.

Policies, each from the same steady state and the same arrivals:

- ``new``: what Meridian runs by default (``Planner(spot_in_headroom=True)``,
  MERIDIAN_SPOT_IN_HEADROOM on): Meridian's scorer order (``priority.rank``, urgency by tenant
  class as trace_replay) and its planner; reserved work keeps out of the headroom until it has
  waited an hour since it arrived, spot work may use it, and GPUs only spot work holds count as
  headroom; work that finds no room evicts spot work ranked below it, softly: the victim runs on
  for the grace period, the work starts when it ends. Spot work is an eviction candidate once
  placed (as the scheduler's index reads it from the database). A cut GPU counts whole.
- ``shares``: ``old`` with a cut GPU counted by its free share (``slot_shares``).
- ``old``: the rule before issue 43: spot work kept out of the headroom like reserved work
  (``Planner(spot_in_headroom=False)``).
- ``easy``: EASY backfill: arrival order, no headroom, no kinds; the first job that does not fit
  gets the earliest start it can have (durations are known exactly) and is booked there; later
  jobs start now only where they do not delay it (the planner keeps its booked window). One such
  booking at a time: the next is made when it has started.

Models. Each job asks for one GPU model (``pin_models``: BENCH_PIN_MODELS=arrival, the least
loaded at its arrival, or window, the least loaded over the window; 0: any model with a node
large enough, as ``trace_replay.py`` has it -- on which nothing ever waits at 0.9, so the headroom
never binds).

An evicted job is queued again when its grace period ends, with the time it still had to run
(it resumes), keeping its place in age. Its wait is the sum of its times queued. "Lost" is the
GPU-time its interrupted runs had done (what a job that does not checkpoint would run again).
Headroom refusals count the place calls refused for the headroom rule.

A pass at an instant tries the new arrivals, and when capacity was freed the waiting jobs of the
models it was freed on (``MixSim.candidates``): with one model per job the others would meet
what they met before, the headroom being per model too. That is exact but for one thing: a
waiting job's rank grows with its age, so it may come to outrank running spot work (or pass its
``headroom_from``) between two events on its model; it evicts (or uses the headroom) at the
model's next event instead of the scheduler's next cycle.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import time
from datetime import timedelta
from uuid import UUID

import trace_replay as replay

from provisioning.scheduling.plan_types import CONTAINER, Busy, Request
from provisioning.scheduling.planner import Planner
from provisioning.scheduling.priority import DEFAULT_WEIGHTS, rank

JOBS = int(os.environ.get("BENCH_JOBS", "60000"))
HEADROOM = float(os.environ.get("BENCH_HEADROOM", "0.10"))
GRACE_S = float(os.environ.get("BENCH_GRACE_S", "120"))
MAX_WAIT_S = float(os.environ.get("BENCH_HEADROOM_MAX_WAIT_S", "3600"))
POLICIES = os.environ.get("BENCH_POLICIES", "old,new,easy").split(",")
PIN = os.environ.get("BENCH_PIN_MODELS", "arrival")  # "arrival", "window" or "0" (any model: pin_models)
if PIN not in ("arrival", "window", "0"):
    raise SystemExit(f"BENCH_PIN_MODELS={PIN!r}: say arrival, window or 0 (see bench/trace_mix.py)")
ON_DEMAND, RESERVED, SPOT = "on-demand", "reserved", "spot"
KINDS = {"LS": ON_DEMAND, "Guaranteed": ON_DEMAND, "Burstable": RESERVED, "BE": SPOT}
HEADROOM_REFUSAL = "kept for on-demand"


class Run:
    """One trace job's life in a mix: its kind, what it still has to run, its waits and evictions."""

    __slots__ = ("job", "kind", "remaining", "queued_at", "waited", "started", "placement", "gen", "evictions",
                 "score")

    def __init__(self, job: replay.Job):
        self.job = job
        self.kind = KINDS.get(job.tenant_class, RESERVED)
        self.remaining = job.duration
        self.queued_at = job.arrival
        self.waited = 0.0
        self.started: float | None = None  # when its current run starts
        self.placement = None
        self.gen = 0  # bumped when its current run is cut short: its completion event is void
        self.evictions = 0
        self.score = 0.0

    def request(self, at: float, model_ids: tuple[UUID, ...], priority: float, easy: bool,
                max_wait: float = 0.0) -> Request:
        job = self.job
        start = replay.EPOCH + timedelta(seconds=at)
        spot = self.kind == SPOT and not easy
        return Request(
            reservation_id=job.rid, kind=CONTAINER, gpu_model_ids=model_ids, regions=(replay.REGION,),
            units=job.units, gpus_per_unit=job.gpus_per_unit, start=start,
            end=start + timedelta(seconds=self.remaining), priority=priority, slots_per_gpu=job.slots,
            on_demand=easy or self.kind == ON_DEMAND, preemptible=spot,
            may_preempt=not easy and not spot,
            eviction_grace=timedelta(seconds=GRACE_S),
            # As snapshot.headroom_from: reserved work may use the headroom once it has waited max_wait (0: never).
            headroom_from=(replay.EPOCH + timedelta(seconds=job.arrival + max_wait)
                           if self.kind == RESERVED and max_wait > 0 else None),
        )


class MixSim:
    def __init__(self, snapshot, models: dict, policy: str, pins: dict[int, tuple[UUID, ...]] | None = None):
        self.policy = policy
        self.pins = pins or {}
        self.easy = policy == "easy"
        new = policy == "new"
        self.max_wait = MAX_WAIT_S if new else 0.0
        self.planner = Planner(snapshot, headroom=0.0 if self.easy else HEADROOM, spot_in_headroom=new,
                               slot_shares=policy == "shares")
        self.models = models
        self.now = 0.0
        self.events: list = []  # (time, seq, what, run, gen): "done" or "stop" (an evicted run's grace ended)
        self.seq = 0
        self.by_rid: dict[UUID, Run] = {}
        self.spot_score: dict[UUID, float] = {}  # running spot work: its score, as the database keeps it
        self.booked: Run | None = None  # EASY: the job booked at its earliest start, until it starts
        self.tries = self.refusals = self.evicted = 0
        self.lost_gpu_s = 0.0
        self.stopping = 0  # evicted runs whose grace has not ended: they come back to the queue
        self.evicted_jobs: set[int] = set()

    def push(self, t: float, what: str, run: Run) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, what, run, run.gen))

    #
    # Placing
    #

    def shape(self, run: Run) -> tuple[UUID, ...]:
        return self.pins.get(run.job.idx) or self.models[run.job.gpus_per_unit]

    def place(self, run: Run, at: float, priority: float):
        self.tries += 1
        placement = self.planner.place(run.request(at, self.shape(run), priority, self.easy, self.max_wait))
        if placement is None and HEADROOM_REFUSAL in self.planner.last_reason:
            self.refusals += 1
        return placement

    def started(self, run: Run, placement, score: float) -> None:
        """``run`` placed: its wait ends when its window starts; the spot work it evicts stops after the grace."""
        start = (placement.start - replay.EPOCH).total_seconds()
        run.waited += start - run.queued_at
        run.started, run.placement, run.score = start, placement, score
        self.by_rid[run.job.rid] = run
        self.push(start + run.remaining, "done", run)
        for eviction in placement.evictions:
            self.evict(self.by_rid[eviction.victim_reservation_id], (eviction.at - replay.EPOCH).total_seconds())
        if run.kind == SPOT and not self.easy:
            self.spot_score[run.job.rid] = score
            self.enlist(placement)

    def enlist(self, placement) -> None:
        """Spot work is an eviction candidate once stored: its GPUs are read again, as the scheduler's index does."""
        cap = self.planner.capacity
        for gpu_id in {a.gpu_id for a in placement.assignments}:
            gpu = cap.gpus[gpu_id]
            cap.reload(gpu, [Busy(x.owner, cap.time(x.start), cap.time(x.end), x.lo, x.hi,
                                  preemptible=x.owner in self.spot_score, priority=self.spot_score.get(x.owner, 0.0),
                                  share_class=x.share_class) for x in gpu.entries])

    def evict(self, victim: Run, at: float) -> None:
        self.evicted += 1
        self.evicted_jobs.add(victim.job.idx)
        victim.evictions += 1
        ran = max(0.0, at - victim.started)
        self.lost_gpu_s += ran * victim.job.gpu_eq
        victim.remaining -= ran
        victim.gen += 1
        self.stopping += 1
        self.spot_score.pop(victim.job.rid, None)
        self.push(at, "stop", victim)

    def ordered(self, queue: list[Run]) -> list[tuple[Run, float]]:
        """The scorer's order and scores (even of one job: a spot holder's score decides who may evict it)."""
        if self.easy:
            return [(r, 0.0) for r in queue]
        by_id = {r.job.idx: r for r in queue}
        entries = [(r.job.idx, r.job.arrival, r.job.urgency, None, 0.0, False, 0.0, 0.0) for r in queue]
        return [(by_id[i], s) for i, s in rank(entries, DEFAULT_WEIGHTS, self.now)]

    def schedule(self, candidates: list[Run]) -> set[int]:
        placed = set()
        for run, score in self.ordered(candidates):
            placement = self.place(run, self.now, score)
            if placement is None and self.easy and self.booked is None:
                placement = self.book(run)
                self.booked = run
            if placement is not None:
                self.started(run, placement, score)
                placed.add(run.job.idx)
        return placed

    def book(self, run: Run):
        """EASY's reservation: the earliest completion after which ``run`` fits (free capacity only grows)."""
        ends = sorted({t for t, _, what, _, _ in self.events if what == "done" and t > self.now})
        lo, hi = 0, len(ends) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            trial = self.place(run, ends[mid], 0.0)
            if trial is not None:
                self.planner.release(trial)
                hi = mid
            else:
                lo = mid + 1
        placement = self.place(run, ends[lo], 0.0)
        if placement is None:
            raise RuntimeError(f"job {run.job.idx} fits nowhere even when everything has ended")
        return placement

    #
    # Running
    #

    def run(self, initial: list[replay.Job], arrivals: list[replay.Job]) -> dict:
        started = time.perf_counter()
        for job in sorted(initial, key=lambda j: (-j.gpus_per_unit, -j.units, j.idx)):
            run = Run(job)
            placement = self.place(run, 0.0, 0.0)
            if placement is not None:
                self.started(run, placement, 0.0)
        runs = [Run(j) for j in arrivals]
        queue: list[Run] = []
        i = 0
        while i < len(runs) or queue or self.stopping:
            t = min(runs[i].job.arrival if i < len(runs) else math.inf, self.events[0][0] if self.events else math.inf)
            if t == math.inf:
                raise RuntimeError(f"{len(queue)} jobs wait and nothing will ever free capacity")
            self.now = t
            self.planner.capacity.advance(replay.EPOCH + timedelta(seconds=t))
            freed, new, dirty = False, [], set()
            while self.events and self.events[0][0] <= t:
                _, _, what, run, gen = heapq.heappop(self.events)
                if gen != run.gen:
                    continue  # a run cut short by an eviction: its "stop" replaces this
                self.planner.release(run.placement)
                dirty.add(self.shape(run))
                self.spot_score.pop(run.job.rid, None)
                run.placement = None
                freed = True
                if what == "stop":
                    self.stopping -= 1
                    run.queued_at = t
                    new.append(run)
                if self.booked is run:
                    self.booked = None
            while i < len(runs) and runs[i].job.arrival <= t:
                new.append(runs[i])
                i += 1
            if self.booked is not None and self.booked.started <= t:
                self.booked = None  # it has started: the next job that does not fit may be booked
                freed, dirty = True, None
            queue.extend(new)
            candidates = self.candidates(queue, new, freed, dirty)
            if candidates:
                placed = self.schedule(candidates)
                if placed:
                    queue = [r for r in queue if r.job.idx not in placed]
        return self.figures(runs, time.perf_counter() - started)

    def candidates(self, queue: list[Run], new: list[Run], freed: bool, dirty: set | None) -> list[Run]:
        """
        What a scheduling pass tries: the whole queue when capacity was freed (every job, when each
        may take any model), else the new arrivals. With one model per job, only the jobs of the
        models something changed on: the others would meet what they met before (the same decisions
        as trying all, for less work; the headroom is per model too).
        """
        if not freed and not dirty:
            return new
        if dirty is None or not self.pins:
            return queue
        fresh = {id(r) for r in new}
        return [r for r in queue if self.shape(r) in dirty or id(r) in fresh]

    def figures(self, runs: list[Run], wall: float) -> dict:
        def table(members: list[Run]) -> dict:
            w = [r.waited for r in members]
            return {"jobs": len(w), "mean_s": replay._mean(w), "p90_s": replay._pct(w, 90),
                    "max_s": max(w, default=0.0)}

        waits = [r.waited for r in runs]
        return {
            "jobs": len(runs),
            "wait_s": {**replay._stats(waits), "max": max(waits, default=0.0)},
            "by_kind": {k: table([r for r in runs if r.kind == k]) for k in (ON_DEMAND, RESERVED, SPOT)},
            "fractional": table([r for r in runs if r.job.slots > 1]),
            "under_8_gpus_max_wait_s": max((r.waited for r in runs if r.job.gpu_eq < 8), default=0.0),
            "evictions": {"count": self.evicted, "distinct_jobs": len(self.evicted_jobs),
                          "gpu_hours_lost_if_not_checkpointed": self.lost_gpu_s / 3600},
            "headroom_refusals": self.refusals,
            "place_calls": self.tries,
            "wall_s": wall,
        }


def pin_models(snapshot, models: dict, initial: list, arrivals: list,
               by: str = "arrival") -> dict[int, tuple[UUID, ...]]:
    """
    One GPU model per job. The trace names none (``gpu_spec`` is empty), and a job that may take
    any model with a node large enough never waits at 0.9 (BENCH_PIN_MODELS=0): the models the
    large jobs need sit part free, and the rest spills there. A GPU cloud's customer asks for a
    model, so each job asks for one of those that can hold it, the least loaded per GPU:

    - ``arrival`` (BENCH_PIN_MODELS=arrival, the default): at the job's arrival, by the jobs before
      it that would still run then had each started on arrival (the running ones first) -- what a
      customer who picks the model with room now does; every model then runs near the offered
      load all along.
    - ``window`` (BENCH_PIN_MODELS=window): by GPU-seconds held within the arrivals' window (a
      30-day job counts for the window, not for its month) -- every model runs near the offered
      load over the window as a whole, but some run over capacity for hours while others idle.
    """
    gpus: dict[UUID, int] = {}
    for node in snapshot.nodes:
        gpus[node.gpu_model_id] = gpus.get(node.gpu_model_id, 0) + len(node.gpus)
    window = max(arrivals[-1].arrival if arrivals else 0.0, 3600.0)
    load = dict.fromkeys(gpus, 0.0)
    running: dict[UUID, list[tuple[float, float]]] = {m: [] for m in gpus}  # (end, GPUs), earliest end first
    pins: dict[int, tuple[UUID, ...]] = {}
    for job in [*initial, *arrivals]:
        if by == "window":
            held = job.gpu_eq * min(job.duration, max(window - job.arrival, 0.0))
        else:
            held = job.gpu_eq
            for model, ends in running.items():
                while ends and ends[0][0] <= job.arrival:
                    load[model] -= heapq.heappop(ends)[1]
        model = min(models[job.gpus_per_unit], key=lambda m: (load[m] + held) / gpus[m])
        load[model] += held
        if by != "window":
            heapq.heappush(running[model], (job.arrival + job.duration, held))
        pins[job.idx] = (model,)
    return pins


def line(policy: str, r: dict) -> str:
    w, k = r["wait_s"], r["by_kind"]
    kinds = "; ".join(f"{name} n={v['jobs']} mean {v['mean_s']:.0f} p90 {v['p90_s']:.0f} max {v['max_s']:.0f}"
                      for name, v in [*k.items(), ("fractional", r["fractional"])])
    e = r["evictions"]
    return (f"{policy:>5}: wait mean {w['mean']:.0f} s p50 {w['p50']:.0f} p90 {w['p90']:.0f} p99 {w['p99']:.0f} "
            f"max {w['max']:.0f}; max under 8 GPUs {r['under_8_gpus_max_wait_s']:.0f} s\n"
            f"       {kinds}\n"
            f"       evictions {e['count']} ({e['distinct_jobs']} jobs, "
            f"{e['gpu_hours_lost_if_not_checkpointed']:.0f} GPU-h run before them), headroom refusals "
            f"{r['headroom_refusals']}, place calls {r['place_calls']}, wall {r['wall_s']:.0f} s")


def main() -> None:
    t0 = time.perf_counter()
    snapshot, model_ids, names = replay.build_fleet()
    fleet_gpus = sum(len(n.gpus) for n in snapshot.nodes)
    models = replay.model_order(snapshot, model_ids, names)
    rows, gaps = replay.load_trace()
    results, info = {}, {}
    for policy in POLICIES:
        initial, arrivals, info = replay.workload(rows, gaps, fleet_gpus, JOBS, replay.SEED)
        pins = pin_models(snapshot, models, initial, arrivals, PIN) if PIN != "0" else None
        results[policy] = MixSim(snapshot, models, policy, pins).run(initial, arrivals)
        info["offered_load_in_window"] = replay.offered_load(initial, arrivals, fleet_gpus)
        print(line(policy, results[policy]), flush=True)
    print(f"fleet {len(snapshot.nodes)} nodes, {fleet_gpus} GPUs; {JOBS} arrivals, offered load "
          f"{info.get('offered_load_in_window', 0):.3f}; headroom {HEADROOM}, grace {GRACE_S:.0f} s; "
          f"wall {time.perf_counter() - t0:.0f} s")
    result = {"bench": "trace_replay_mix", "jobs": JOBS, "pinned_models": PIN, "load": replay.LOAD, "seed": replay.SEED,
              "headroom": HEADROOM, "grace_s": GRACE_S, "kinds": KINDS, "workload": info, **results}
    print("RESULT " + json.dumps(result, sort_keys=True))
