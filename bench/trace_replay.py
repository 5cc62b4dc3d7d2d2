"""
Replay of the Alibaba openb v2023 GPU trace through Meridian's pure planner, in simulated time.

    .venv/bin/python bench/trace_replay.py
    .venv/bin/python bench/trace_replay.py --workload teams   # many teams, gangs, above capacity: bench/team_replay.py
    .venv/bin/python bench/trace_replay.py --workload mix     # on-demand, reserved, spot, headroom: bench/trace_mix.py

Environment: BENCH_JOBS (arrivals, 25000), BENCH_LOAD (0.9), BENCH_SEED (1), BENCH_FRACTION
(slots8 or layout, see below), MERIDIAN_TRACE_DIR (default ../shared/traces beside the repo).

No Django, no database: ``provisioning.scheduling.planner`` and ``provisioning.scheduling.priority`` are pure. The trace
files stay in ``../shared/traces`` (or ``$MERIDIAN_TRACE_DIR``) and are read from there.

The model, in short (every choice is also in the RESULT line under "model"):

Fleet. The GPU nodes of ``alibaba_openb_v2023_nodes.csv`` (``gpu`` > 0), ``gpu`` GPUs each, one
GPU model per ``model`` value, all in one region on one fabric, all in the shared pool (so the
VM/container best-fit and fractional slot packing apply). Nodes are taken per model in ``sn``
order, 32 to a leaf switch, 8 leaves to a pod. GPU memory per model is a guess (MEMORY_GIB): it
only sets the MiB bounds of slots, never whether something fits (slots are counted per GPU).

Jobs. The GPU tasks (``num_gpu`` >= 1) that have a duration. ``Pending`` tasks never ran (no
duration, no production queueing delay) and are left out. ``num_gpu`` > 1, or ``gpu_milli`` ==
1000: a whole-GPU container of ``num_gpu`` GPUs on one node. ``gpu_milli`` < 1000: a fractional
container of ``ceil(gpu_milli * 8 / 1000)`` slots of a GPU cut 8 ways (slots_per_gpu = 8), so it
is allocated ``units / 8`` of a GPU (up to 124 milli more than it asked). A Request's units are
independent slots, so the planner may put them on different GPUs (the RESULT counts how often:
``fractional_split_share``). BENCH_FRACTION=layout instead asks for one slot of a GPU cut
``1000 // gpu_milli`` ways (never split, but coarser: 650 milli takes a whole GPU, 470 a half;
GPUs only share slots of one cut). Acceptable models: every model with a node large enough for
one unit (``gpu_spec`` is empty for every task), smallest nodes first, so 8-GPU nodes stay whole
for 8-GPU work. No task is spot and none may preempt; the headroom is 0 (all work is on-demand).

Load. The trace cannot reach a load of 0.9 on its own nodes by compressing time: all its GPU
tasks at once ask for 5,485 GPUs (5,628 allocated in eighths), about 0.9 x 6,212 = 5,591, and
could hold that only while the shortest of them runs (median 655 s). So jobs are resampled with
replacement (seeded), and so are the trace's inter-arrival gaps (those under a day: the first
90 days hold 13 tasks), scaled by one factor so that

    arrival rate  lambda = 0.9 * G / mean(g * d)

over the trace's GPU tasks (g: GPUs allocated, d: duration_s, G: fleet GPUs); that is
``sum(g * d) / (G * span) = 0.9`` for a long stream. Durations are heavy-tailed (85 % of the
GPU-seconds are tasks running over 7 days, censored at the trace's end), so an empty cluster
would take months of simulated time to reach that load. The run therefore starts in steady
state: at time 0 the cluster holds jobs drawn with probability proportional to their duration
(what is running at a random instant), each with a residual time uniform in (0, d), until their
GPUs reach 0.9 x G; they are placed biggest first and are not counted in the delays. Then
``BENCH_JOBS`` arrivals are replayed.

Scheduling. At every event (arrivals and completions at one instant: completions first), the
waiting queue is ordered (a) by ``priority.rank`` (urgency from tenant_class: LS and Guaranteed
"high" 0.8, Burstable "normal" 0.5, BE "low" 0.2; fulfilment None (neutral), load 0, no
high-priority status, no usage; the age term grows with the wait) or (b) by arrival (FIFO). Then
every waiting job is tried in that order against one long-lived Planner and placed if it fits
now: greedy list scheduling with unrestricted backfill (a job that does not fit blocks nobody;
no capacity is held for it). Finished jobs are ``release()``-d. An arrival-only instant frees
nothing, so only its new arrivals are tried (the same decisions as trying all, for less work).
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import math
import os
import random
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID, uuid5

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import team_replay  # noqa: E402 -- beside this script
import trace_mix  # noqa: E402 -- beside this script; it uses this module's fleet and workload

from provisioning.scheduling.plan_types import (  # noqa: E402
    CONTAINER,
    SHARED_POOL,
    GPUCapacity,
    NodeCapacity,
    Request,
    Snapshot,
)
from provisioning.scheduling.planner import Planner  # noqa: E402
from provisioning.scheduling.priority import DEFAULT_WEIGHTS, URGENCY_LEVELS, rank  # noqa: E402

TRACE_DIR = Path(os.environ.get("MERIDIAN_TRACE_DIR") or Path(__file__).resolve().parents[2] / "shared" / "traces")
JOBS_CSV = "alibaba_openb_v2023_jobs.csv"
NODES_CSV = "alibaba_openb_v2023_nodes.csv"

LOAD = float(os.environ.get("BENCH_LOAD", "0.9"))
JOBS = int(os.environ.get("BENCH_JOBS", "25000"))
SEED = int(os.environ.get("BENCH_SEED", "1"))
REGION = "trace-openb"
NODES_PER_LEAF = 32
LEAVES_PER_POD = 8
SLOTS_PER_GPU = 8
# "slots8": ceil(gpu_milli * 8 / 1000) slots of 8-way GPUs (the planner may spread them over GPUs);
# "layout": one slot of an n-way GPU, n = 1000 // gpu_milli (whole GPU when n is 1).
FRACTION = os.environ.get("BENCH_FRACTION", "slots8")
if FRACTION not in ("slots8", "layout"):
    sys.exit(f"BENCH_FRACTION must be slots8 or layout, not {FRACTION!r}")
INITIAL_IDS = 1 << 40  # ids of the jobs running at time 0, above any arrival's
MAX_GAP_S = 86400.0  # inter-arrival gaps longer than this (the trace's sparse first 90 days) are not resampled
NAMESPACE = UUID("6f1c2a60-3d0e-4b8e-9a51-0c7b3f6e2d11")
EPOCH = datetime(2023, 1, 1, tzinfo=UTC)

# GiB per GPU model. T4, P100, A10 and the two V100s are public figures; G2 and G3 are anonymised
# in the trace and get A100-class guesses. Memory never decides a fit here (see the module doc).
MEMORY_GIB = {"T4": 16, "P100": 16, "A10": 24, "V100M16": 16, "V100M32": 32, "G2": 40, "G3": 80}
DEFAULT_GIB = 32

URGENCY = {"LS": URGENCY_LEVELS["high"], "Guaranteed": URGENCY_LEVELS["high"],
           "Burstable": URGENCY_LEVELS["normal"], "BE": URGENCY_LEVELS["low"]}


def trace_file(name: str) -> Path:
    path = TRACE_DIR / name
    if not path.is_file():
        sys.exit(f"trace file {path} not found (set MERIDIAN_TRACE_DIR to the folder holding {name})")
    return path


#
# Fleet
#

def build_fleet() -> tuple[Snapshot, dict[str, UUID], dict[UUID, str]]:
    """The snapshot of the trace's GPU nodes; model name -> id; id -> name."""
    with trace_file(NODES_CSV).open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["gpu"] or 0) > 0]
    by_model: dict[str, list[dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"] or "unknown", []).append(r)
    fabric = uuid5(NAMESPACE, "fabric")
    nodes: list[NodeCapacity] = []
    model_ids = {m: uuid5(NAMESPACE, f"model:{m}") for m in sorted(by_model)}
    for model in sorted(by_model):
        mib = MEMORY_GIB.get(model, DEFAULT_GIB) * 1024
        members = sorted(by_model[model], key=lambda r: r["sn"])
        for i, r in enumerate(members):
            leaf_no = i // NODES_PER_LEAF
            node_id = uuid5(NAMESPACE, f"node:{r['sn']}")
            gpus = [GPUCapacity(gpu_id=uuid5(NAMESPACE, f"gpu:{r['sn']}:{k}"), index=k, memory_mib=mib)
                    for k in range(int(r["gpu"]))]
            nodes.append(NodeCapacity(
                node_id=node_id, region=REGION, fabric_id=fabric,
                leaf_id=uuid5(NAMESPACE, f"leaf:{model}:{leaf_no}"), pod=leaf_no // LEAVES_PER_POD,
                pool=SHARED_POOL, gpu_model_id=model_ids[model], gpus=gpus,
            ))
    return Snapshot(now=EPOCH, nodes=nodes), model_ids, {v: k for k, v in model_ids.items()}


def model_order(snapshot: Snapshot, model_ids: dict[str, UUID], names: dict[UUID, str]) -> dict[int, tuple[UUID, ...]]:
    """Per unit size (GPUs on one node): the models with a node that holds it, smallest mean node first."""
    sizes: dict[str, list[int]] = {}
    for n in snapshot.nodes:
        sizes.setdefault(names[n.gpu_model_id], []).append(len(n.gpus))
    mean = {m: sum(v) / len(v) for m, v in sizes.items()}
    ordered = sorted(sizes, key=lambda m: (mean[m], -len(sizes[m]), m))
    biggest = max(max(v) for v in sizes.values())
    return {size: tuple(model_ids[m] for m in ordered if max(sizes[m]) >= size) for size in range(1, biggest + 1)}


#
# Jobs
#

class Job:
    __slots__ = ("idx", "arrival", "gpus_per_unit", "units", "slots", "duration", "urgency", "tenant_class",
                 "queue_s", "gpu_eq", "start", "placement", "rid", "size_class")

    def __init__(self, idx: int, row: dict, arrival: float, duration: float):
        self.idx = idx
        self.arrival = arrival
        self.duration = duration
        self.gpus_per_unit, self.units, self.slots, self.gpu_eq, self.size_class = shape(row)
        self.tenant_class = row["tenant_class"]
        self.urgency = URGENCY.get(self.tenant_class, URGENCY_LEVELS["normal"])
        self.queue_s = float(row["queue_s"]) if row["queue_s"] else None
        self.rid = UUID(int=idx + 1)
        self.start: float | None = None
        self.placement = None

    def request(self, now: float, models: dict[int, tuple[UUID, ...]], priority: float = 0.0) -> Request:
        start = EPOCH + timedelta(seconds=now)
        return Request(
            reservation_id=self.rid, kind=CONTAINER, gpu_model_ids=models[self.gpus_per_unit], regions=(REGION,),
            units=self.units, gpus_per_unit=self.gpus_per_unit, start=start,
            end=start + timedelta(seconds=self.duration), priority=priority, slots_per_gpu=self.slots,
            on_demand=True, may_preempt=False,
        )


def load_trace() -> tuple[list[dict], list[float]]:
    """The GPU tasks with a duration, and the trace's inter-arrival gaps (GPU tasks, under a day)."""
    with trace_file(JOBS_CSV).open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["num_gpu"] or 0) >= 1]
    submits = sorted(float(r["submit_time_s"]) for r in rows)
    gaps = [b - a for a, b in zip(submits, submits[1:], strict=False) if b - a < MAX_GAP_S]
    usable = [r for r in rows if r["duration_s"] and float(r["duration_s"]) > 0]
    return usable, gaps


def shape(row: dict) -> tuple[int, int, int, float, str]:
    """(gpus_per_unit, units, slots_per_gpu, GPUs allocated, size class) of one trace task."""
    num, milli = int(row["num_gpu"]), int(row["gpu_milli"] or 1000)
    if num == 1 and milli < 1000:
        if FRACTION == "layout":  # one slot of the finest cut whose slot still holds the share
            n = 1000 // milli
            if n > 1:
                return 1, 1, n, 1.0 / n, "fraction"
        else:  # ceil(share / (1/8)) slots of a GPU cut 8 ways, wherever the planner finds them
            units = max(1, math.ceil(milli * SLOTS_PER_GPU / 1000))
            return 1, units, SLOTS_PER_GPU, units / SLOTS_PER_GPU, "fraction"
    return num, 1, 1, float(num), f"{num}gpu"


def gpu_eq(row: dict) -> float:
    return shape(row)[3]


def workload(rows: list[dict], gaps: list[float], fleet_gpus: int, n: int, seed: int) -> tuple[list, list, dict]:
    """The steady-state initial population, ``n`` resampled arrivals, and the figures behind them."""
    rng = random.Random(seed)
    work = [gpu_eq(r) * float(r["duration_s"]) for r in rows]
    rate = LOAD * fleet_gpus / (sum(work) / len(work))  # jobs per second
    scale = (1.0 / rate) / (sum(gaps) / len(gaps))  # trace gaps x scale have mean 1 / rate
    # What runs at a random instant: jobs drawn in proportion to their duration, residual uniform.
    durations = [float(r["duration_s"]) for r in rows]
    initial, held = [], 0.0
    target = LOAD * fleet_gpus
    cum = []
    acc = 0.0
    for d in durations:
        acc += d
        cum.append(acc)
    while held < target:
        i = min(len(rows) - 1, _bisect(cum, rng.random() * acc))
        job = Job(INITIAL_IDS + len(initial), rows[i], 0.0, float(rows[i]["duration_s"]) * (1.0 - rng.random()))
        if held + job.gpu_eq > target + 0.5:
            break
        held += job.gpu_eq
        initial.append(job)
    arrivals, t = [], 0.0
    for k in range(n):
        row = rows[rng.randrange(len(rows))]
        arrivals.append(Job(k, row, t, float(row["duration_s"])))
        t += rng.choice(gaps) * scale
    info = {"rate_per_s": rate, "gap_scale": scale, "mean_gpu_seconds_per_job": sum(work) / len(work),
            "initial_jobs": len(initial), "initial_gpus": held}
    return initial, arrivals, info


def _bisect(cum: list[float], x: float) -> int:
    lo, hi = 0, len(cum)
    while lo < hi:
        mid = (lo + hi) // 2
        if cum[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


#
# Simulation
#

class Sim:
    def __init__(self, snapshot: Snapshot, models: dict[int, tuple[UUID, ...]], order: str, fleet_gpus: int):
        self.planner = Planner(snapshot, headroom=0.0)
        self.models = models
        self.order = order
        self.fleet_gpus = fleet_gpus
        self.now = 0.0
        self.completions: list[tuple[float, int, Job]] = []
        self.alloc = 0.0  # GPU-equivalents allocated now
        self.gpu_users: Counter = Counter()  # GPU id -> placements on it now
        self.area_alloc = 0.0
        self.area_used = 0.0
        self.split = 0  # fractional arrivals whose slots landed on more than one GPU
        self.fractional = 0  # fractional arrivals placed
        self.places = 0
        self.tries = 0

    def advance(self, t: float, until: float) -> None:
        """Move the clock to ``t``, integrating allocation up to ``until`` (the measurement window)."""
        lo, hi = min(self.now, until), min(t, until)
        if hi > lo:
            self.area_alloc += self.alloc * (hi - lo)
            self.area_used += len(self.gpu_users) * (hi - lo)
        self.now = t

    def try_place(self, job: Job, priority: float = 0.0) -> bool:
        self.tries += 1
        placement = self.planner.place(job.request(self.now, self.models, priority))
        if placement is None:
            return False
        self.places += 1
        job.start, job.placement = self.now, placement
        self.alloc += job.gpu_eq
        gpus = {a.gpu_id for a in placement.assignments}
        for g in gpus:
            self.gpu_users[g] += 1
        if job.slots > 1 and job.idx < INITIAL_IDS:
            self.fractional += 1
            self.split += len(gpus) > 1
        heapq.heappush(self.completions, (self.now + job.duration, job.idx, job))
        return True

    def finish(self, job: Job) -> None:
        self.planner.release(job.placement)
        self.alloc -= job.gpu_eq
        for g in {a.gpu_id for a in job.placement.assignments}:
            self.gpu_users[g] -= 1
            if not self.gpu_users[g]:
                del self.gpu_users[g]
        job.placement = None

    def ordered(self, queue: list[Job]) -> list[tuple[Job, float]]:
        if self.order == "fifo" or len(queue) < 2:
            return [(j, 0.0) for j in queue]
        by_id = {j.idx: j for j in queue}
        entries = [(j.idx, j.arrival, j.urgency, None, 0.0, False, 0.0, 0.0) for j in queue]
        return [(by_id[i], s) for i, s in rank(entries, DEFAULT_WEIGHTS, self.now)]

    def run(self, initial: list[Job], arrivals: list[Job]) -> dict:
        started = time.perf_counter()
        # Steady state at time 0: biggest first, as a packer would; what does not fit is dropped.
        dropped = 0
        for job in sorted(initial, key=lambda j: (-j.gpus_per_unit, -j.units, j.idx)):
            if not self.try_place(job):
                dropped += 1
        window = arrivals[-1].arrival if arrivals else 0.0
        queue: list[Job] = []
        i = 0
        while i < len(arrivals) or queue:
            next_arrival = arrivals[i].arrival if i < len(arrivals) else math.inf
            next_done = self.completions[0][0] if self.completions else math.inf
            t = min(next_arrival, next_done)
            if t == math.inf:
                raise RuntimeError(f"{len(queue)} jobs wait and nothing will ever free capacity")
            self.advance(t, window)
            freed = False
            while self.completions and self.completions[0][0] <= t:
                self.finish(heapq.heappop(self.completions)[2])
                freed = True
            new = []
            while i < len(arrivals) and arrivals[i].arrival <= t:
                new.append(arrivals[i])
                i += 1
            queue.extend(new)
            candidates = queue if freed else new
            if candidates:
                placed = {j.idx for j, prio in self.ordered(candidates) if self.try_place(j, prio)}
                if placed:
                    queue = [j for j in queue if j.idx not in placed]
        wall = time.perf_counter() - started
        waits = [j.start - j.arrival for j in arrivals]
        by_class = {}
        for key in sorted({j.tenant_class for j in arrivals}):
            w = [j.start - j.arrival for j in arrivals if j.tenant_class == key]
            by_class[key] = {"jobs": len(w), "mean_s": _mean(w), "p99_s": _pct(w, 99)}
        by_size = {}
        for key in sorted({j.size_class for j in arrivals}):
            w = [j.start - j.arrival for j in arrivals if j.size_class == key]
            by_size[key] = {"jobs": len(w), "mean_s": _mean(w), "p99_s": _pct(w, 99)}
        return {
            "jobs": len(arrivals),
            "queueing_delay_s": _stats(waits),
            "zero_wait_share": sum(1 for w in waits if w <= 0) / len(waits) if waits else 0.0,
            "gpu_allocation": self.area_alloc / (self.fleet_gpus * window) if window else 0.0,
            "gpus_in_use_share": self.area_used / (self.fleet_gpus * window) if window else 0.0,
            "window_s": window,
            "makespan_s": max((j.start + j.duration for j in arrivals), default=0.0),
            "last_start_s": max((j.start for j in arrivals), default=0.0),
            "by_tenant_class": by_class,
            "by_size": by_size,
            "initial_dropped": dropped,
            "fractional_split_share": self.split / self.fractional if self.fractional else 0.0,
            "place_calls": self.tries,
            "placements": self.places,
            "wall_s": wall,
        }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _stats(values: list[float]) -> dict:
    return {"mean": _mean(values), "p50": _pct(values, 50), "p90": _pct(values, 90), "p99": _pct(values, 99)}


def offered_load(initial: list[Job], arrivals: list[Job], fleet_gpus: int) -> float:
    """GPU-seconds offered inside [0, last arrival] over the fleet's GPU-seconds in it."""
    window = arrivals[-1].arrival if arrivals else 0.0
    if window <= 0:
        return 0.0
    work = sum(j.gpu_eq * min(j.duration, window) for j in initial)
    work += sum(j.gpu_eq * min(j.duration, window - j.arrival) for j in arrivals)
    return work / (fleet_gpus * window)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    parser.add_argument("--workload", choices=("trace", "teams", "mix"), default="trace",
                        help="trace: the Alibaba tasks resampled (this module); teams: the synthetic multi-team "
                             "workload above capacity (bench/team_replay.py, its own BENCH_* settings); mix: the "
                             "Alibaba tasks as on-demand, reserved and spot work with the headroom, old and new "
                             "rule and EASY backfill (bench/trace_mix.py)")
    chosen = parser.parse_args().workload
    if chosen == "teams":
        team_replay.main()
        return
    if chosen == "mix":
        trace_mix.main()
        return
    t0 = time.perf_counter()
    snapshot, model_ids, names = build_fleet()
    fleet_gpus = sum(len(n.gpus) for n in snapshot.nodes)
    models = model_order(snapshot, model_ids, names)
    rows, gaps = load_trace()
    gpu_counts = Counter()
    for n in snapshot.nodes:
        gpu_counts[names[n.gpu_model_id]] += len(n.gpus)
    print(f"trace: {TRACE_DIR}")
    print(f"fleet: {len(snapshot.nodes)} GPU nodes, {fleet_gpus} GPUs: "
          + ", ".join(f"{m} {c}" for m, c in gpu_counts.most_common()))
    print(f"jobs: {len(rows)} GPU tasks with a duration; all at once they ask for "
          f"{sum(gpu_eq(r) for r in rows):.0f} GPU-equivalents")

    results = {}
    info = {}
    for order in ("priority", "fifo"):
        initial, arrivals, info = workload(rows, gaps, fleet_gpus, JOBS, SEED)
        sim = Sim(snapshot, models, order, fleet_gpus)
        results[order] = sim.run(initial, arrivals)
        info["offered_load_in_window"] = offered_load(initial, arrivals, fleet_gpus)
        ref = [j.queue_s for j in arrivals if j.queue_s is not None]
        info["production_queue_s"] = _stats(ref)
    print(f"workload: {JOBS} arrivals at {info['rate_per_s']:.3f}/s (trace gaps x {info['gap_scale']:.4f}), "
          f"{info['initial_jobs']} jobs running at t=0 holding {info['initial_gpus']:.0f} GPUs; "
          f"offered load in the window {info['offered_load_in_window']:.3f}")
    for order, r in results.items():
        q = r["queueing_delay_s"]
        print(f"{order:>8}: {r['jobs']} jobs, delay mean {q['mean']:.1f} s p50 {q['p50']:.1f} p90 {q['p90']:.1f} "
              f"p99 {q['p99']:.1f}, zero-wait {r['zero_wait_share']:.1%}, GPU allocation {r['gpu_allocation']:.3f} "
              f"(GPUs in use {r['gpus_in_use_share']:.3f}) over {r['window_s']:.0f} s, "
              f"makespan {r['makespan_s']:.0f} s, last start {r['last_start_s']:.0f} s, wall {r['wall_s']:.1f} s")
        for label, table in (("class", r["by_tenant_class"]), ("size", r["by_size"])):
            print(f"          by {label}: " + "; ".join(
                f"{k} n={v['jobs']} mean {v['mean_s']:.1f} p99 {v['p99_s']:.1f}" for k, v in table.items()))
    p = info["production_queue_s"]
    print(f"production (trace queue_s, same jobs): mean {p['mean']:.1f} s p50 {p['p50']:.1f} p90 {p['p90']:.1f} "
          f"p99 {p['p99']:.1f}")
    wall = time.perf_counter() - t0
    print(f"wall time {wall:.1f} s")
    result = {
        "bench": "trace_replay",
        "trace": JOBS_CSV,
        "load": LOAD,
        "seed": SEED,
        "fleet": {"nodes": len(snapshot.nodes), "gpus": fleet_gpus, "models": dict(gpu_counts.most_common())},
        "workload": info,
        "priority": results["priority"],
        "fifo": results["fifo"],
        "production_queue_s": info["production_queue_s"],
        "wall_s": wall,
        "model": {
            "memory_gib": MEMORY_GIB, "nodes_per_leaf": NODES_PER_LEAF, "leaves_per_pod": LEAVES_PER_POD,
            "fraction": FRACTION, "fraction_units": ("ceil(gpu_milli * 8 / 1000) slots of 8" if FRACTION == "slots8"
                                                     else "1 slot of (1000 // gpu_milli)"),
            "pending_tasks": "skipped", "urgency": {k: v for k, v in URGENCY.items()},
            "arrivals": "jobs and trace gaps (< 1 day) resampled with replacement; lambda = 0.9 * G / mean(g * d)",
            "start": "steady state: duration-biased jobs with uniform residuals up to 0.9 * G",
            "policy": "order (score or FIFO), then greedy backfill: every job that fits now starts",
        },
    }
    print("RESULT " + json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
