"""
The pure planner on the benchmark fleet, in memory (no database): one region, 1,280 nodes x 8
GPUs of 80 GiB, leaves of 32 nodes, pods of 8 leaves, a quarter of the nodes shared hosts and
4 % of the bare-metal nodes spares (left out of the snapshot, as the loader does), as
cloud/fleet.py builds it. At 0 %, 50 % and 90 % full it measures:

  - building a Planner from the snapshot;
  - single placement decisions (p50/p99 wall clock, and p99 of the process's CPU time, which
    other work on a shared machine does not inflate): 1 and 8 GPUs (VMs on shared hosts, and one
    bare-metal node), 64 and 256 GPUs (bare-metal gangs of 8 and 32 nodes), each placement
    released again so the fill holds;
  - whether each 64-GPU gang landed inside one pod (leaf group) whenever one could hold it;
  - ``plan`` of a 10,000-request mixed queue (1-8 GPU VMs, fractional slots, 16-64 GPU gangs;
    on-demand, reserved and spot; some advance reservations).

    .venv/bin/python bench/planner.py            # BENCH_DECISIONS=300, BENCH_QUEUE=10000

It prints readable lines and one final ``RESULT {json}`` line.
"""

from __future__ import annotations

import gc
import json
import os
import random
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from provisioning.scheduling.plan_types import (  # noqa: E402
    BARE_METAL,
    BARE_METAL_POOL,
    CONTAINER,
    SHARED_POOL,
    VM,
    Busy,
    GPUCapacity,
    NodeCapacity,
    Request,
    Snapshot,
)
from provisioning.scheduling.planner import Planner, plan  # noqa: E402

NODES = 1280
NODES_PER_LEAF = 32
LEAVES_PER_POD = 8
GPUS_PER_NODE = 8
MEMORY_MIB = 81920
SHARED_RATIO = 0.25
SPARE_EVERY = 25  # 4 % of the bare-metal nodes
REGION = "us-east-1"
MODEL = uuid.UUID(int=1)
MODEL_NAMES = {MODEL: "H100 80GB"}
FABRIC = uuid.UUID(int=2)
NOW = datetime(2025, 6, 2, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
DURATIONS = [1, 2, 4, 8, 24]  # hours: tenants book round lengths
DECISIONS = int(os.environ.get("BENCH_DECISIONS", "300"))
QUEUE = int(os.environ.get("BENCH_QUEUE", "10000"))


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


#
# The fleet and its fill
#

def fleet() -> list[NodeCapacity]:
    leaves = [uuid.uuid4() for _ in range(NODES // NODES_PER_LEAF)]
    shared_from = NODES - int(NODES * SHARED_RATIO)
    nodes = []
    for i in range(NODES):
        shared = i >= shared_from
        if not shared and i % SPARE_EVERY == SPARE_EVERY - 1:
            continue  # a spare: never in a snapshot
        leaf = i // NODES_PER_LEAF
        nodes.append(NodeCapacity(
            node_id=uuid.uuid4(), region=REGION, fabric_id=FABRIC, leaf_id=leaves[leaf],
            pod=leaf // LEAVES_PER_POD, pool=SHARED_POOL if shared else BARE_METAL_POOL, gpu_model_id=MODEL,
            gpus=[GPUCapacity(uuid.uuid4(), g, MEMORY_MIB) for g in range(GPUS_PER_NODE)],
        ))
    return nodes


def busy(rng: random.Random, *, lo: int = 0, hi: int = MEMORY_MIB, rid: uuid.UUID | None = None,
         start: datetime | None = None, spot: bool | None = None) -> Busy:
    """Work running now: started up to 12 h ago, ending within two days; a sixth of it spot."""
    spot = rng.random() < 1 / 6 if spot is None else spot
    start = start or NOW - rng.uniform(0, 12) * HOUR
    end = max(start, NOW) + rng.uniform(0.5, 48) * HOUR
    return Busy(rid or uuid.uuid4(), start, end, lo, hi, preemptible=spot,
                priority=rng.uniform(0, 0.4) if spot else rng.uniform(0.3, 1))


def shared_gpus_in_use(rng: random.Random, shared: list[NodeCapacity], fill: float) -> list[GPUCapacity]:
    """
    ``fill`` of the shared hosts' GPUs, as a best-fitting scheduler leaves them: most packed onto
    some hosts (whole hosts stay free), a fifth scattered one by one.
    """
    gpus = [g for n in shared for g in n.gpus]
    target = round(fill * len(gpus))
    chosen = {id(g): g for g in rng.sample(gpus, round(target * 0.2))}
    for node in rng.sample(shared, len(shared)):
        for g in node.gpus:
            if len(chosen) >= target:
                return list(chosen.values())
            chosen.setdefault(id(g), g)
    return list(chosen.values())


def snapshot(fill: float, seed: int) -> Snapshot:
    """
    ``fill`` of the GPUs busy now: whole bare-metal nodes (gangs of up to 4 nodes share a
    reservation), single GPUs of shared hosts (a tenth of them cut into 8 slots, partly used);
    and on 5 % of the nodes left free an advance reservation from a few hours on.
    """
    rng = random.Random(seed)
    nodes = fleet()
    bare = [n for n in nodes if n.pool == BARE_METAL_POOL]
    shared = [n for n in nodes if n.pool == SHARED_POOL]
    taken = rng.sample(bare, round(fill * len(bare)))
    while taken:
        gang = [taken.pop() for _ in range(min(len(taken), rng.randint(1, 4)))]
        template = busy(rng)
        for node in gang:
            for g in node.gpus:
                g.busy.append(template)
    for g in shared_gpus_in_use(rng, shared, fill):
        if rng.random() < 0.1:
            for k in rng.sample(range(8), rng.randint(1, 7)):
                g.busy.append(busy(rng, lo=k * MEMORY_MIB // 8, hi=(k + 1) * MEMORY_MIB // 8))
        else:
            g.busy.append(busy(rng))
    for node in nodes:
        if not any(g.busy for g in node.gpus) and rng.random() < 0.05:
            held = busy(rng, start=NOW + rng.uniform(2, 12) * HOUR, spot=False)
            for g in node.gpus:
                g.busy.append(held)
    return Snapshot(now=NOW, nodes=nodes)


#
# Requests
#

def request(rng: random.Random, kind: str, units: int, per_unit: int, *, slots: int = 1, start: datetime = NOW,
            term: str = "on_demand", may_preempt: bool = False) -> Request:
    return Request(
        reservation_id=uuid.uuid4(), kind=kind, gpu_model_ids=(MODEL,), regions=(REGION,), units=units,
        gpus_per_unit=per_unit, start=start, end=start + rng.choice(DURATIONS) * HOUR,
        priority=rng.uniform(0.2, 1.0), slots_per_gpu=slots, preemptible=term == "spot",
        on_demand=term == "on_demand", may_preempt=may_preempt and term != "spot",
        eviction_grace=rng.choice([timedelta(0), timedelta(minutes=5)]),
    )


def mixed_queue(rng: random.Random, count: int) -> list[Request]:
    """Mostly small VMs; some fractional slots and 16-64 GPU gangs; 15 % advance reservations."""
    queue = []
    for _ in range(count):
        start = NOW if rng.random() < 0.85 else NOW + rng.randint(1, 24) * HOUR
        term = rng.choices(["on_demand", "reserved", "spot"], [0.7, 0.2, 0.1])[0]
        shape = rng.choices(["vm", "slots", "gang"], [0.85, 0.05, 0.10])[0]
        if shape == "vm":
            kind, units, per_unit, slots = VM, 1, rng.choices([1, 2, 4, 8], [0.45, 0.25, 0.18, 0.12])[0], 1
        elif shape == "slots":
            kind, units, per_unit, slots = CONTAINER, rng.randint(1, 4), 1, 8
        else:
            kind, units, per_unit, slots = BARE_METAL, rng.choice([2, 4, 8]), GPUS_PER_NODE, 1
        queue.append(request(rng, kind, units, per_unit, slots=slots, start=start, term=term, may_preempt=True))
    return queue


#
# Measurements
#

def pods_that_hold(snap: Snapshot, req: Request) -> set[int]:
    """Pods with enough bare-metal nodes free for the request's window, counted from the snapshot itself."""
    free: dict[int, int] = {}
    for node in snap.nodes:
        if node.pool == BARE_METAL_POOL and all(
            b.end <= req.start or b.start >= req.end for g in node.gpus for b in g.busy
        ):
            free[node.pod] = free.get(node.pod, 0) + 1
    return {pod for pod, count in free.items() if count >= req.units}


def decisions(planner: Planner, snap: Snapshot, make, label: str, check_pod: bool = False) -> dict:
    """Time ``place`` for DECISIONS requests made by ``make``, releasing each so the fill holds."""
    times, cpu, placed, in_pod, could_pod = [], [], 0, 0, 0
    pod_of = {n.node_id: n.pod for n in snap.nodes}
    for _ in range(DECISIONS):
        req = make()
        t0, c0 = time.perf_counter(), time.process_time()
        placement = planner.place(req)
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
        if placement is None:
            continue
        placed += 1
        if check_pod and pods_that_hold(snap, req):
            could_pod += 1
            in_pod += len({pod_of[a.node_id] for a in placement.assignments}) == 1
        planner.release(placement)
    out = {"p50_ms": round(percentile(times, 50), 3), "p99_ms": round(percentile(times, 99), 3),
           "cpu_p99_ms": round(percentile(cpu, 99), 3), "placed": placed, "tried": DECISIONS}
    line = (f"  place {label:<31} p50 {out['p50_ms']:6.3f} ms  p99 {out['p99_ms']:6.3f} ms "
            f"(CPU {out['cpu_p99_ms']:6.3f} ms)  placed {placed}/{DECISIONS}")
    if check_pod:
        out["one_pod_when_possible"] = f"{in_pod}/{could_pod}"
        line += f"  in one pod when one could hold it: {in_pod}/{could_pod}"
    print(line, flush=True)
    return out


def run_fill(fill: float) -> dict:
    rng = random.Random(int(fill * 100))
    snap = snapshot(fill, seed=int(fill * 100) + 1)
    gpus = sum(len(n.gpus) for n in snap.nodes)
    busy_now = sum(1 for n in snap.nodes for g in n.gpus if any(b.start <= NOW < b.end for b in g.busy))
    print(f"{fill:.0%} full: {len(snap.nodes)} nodes in the snapshot, {gpus} GPUs, {busy_now} busy now", flush=True)
    builds = []
    for _ in range(5):
        t0 = time.perf_counter()
        planner = Planner(snap, model_names=MODEL_NAMES)
        builds.append((time.perf_counter() - t0) * 1000)
    print(f"  build planner {min(builds):.1f} ms (best of 5), {percentile(builds, 50):.1f} ms median", flush=True)
    # The snapshot lives for the whole cycle: freezing it keeps the collector from walking its
    # tens of thousands of objects every few placements (a scheduler process should do the same).
    gc.collect()
    gc.freeze()
    result: dict = {"busy_now": busy_now, "gpus": gpus, "build_ms": round(min(builds), 2)}
    shapes = [
        ("place_1gpu_vm", "1 GPU (VM)", VM, 1, 1),
        ("place_8gpu_vm", "8 GPUs (VM, one node)", VM, 1, 8),
        ("place_8gpu_bm", "8 GPUs (1 bare-metal node)", BARE_METAL, 1, 8),
        ("place_64gpu_bm", "64 GPUs (8 bare-metal nodes)", BARE_METAL, 8, 8),
        ("place_256gpu_bm", "256 GPUs (32 bare-metal nodes)", BARE_METAL, 32, 8),
    ]
    for key, label, kind, units, per_unit in shapes:
        result[key] = decisions(planner, snap, lambda k=kind, u=units, g=per_unit: request(rng, k, u, g), label,
                                check_pod=key == "place_64gpu_bm")
    queue = mixed_queue(rng, QUEUE)
    t0 = time.perf_counter()
    outcome = plan(snap, queue, model_names=MODEL_NAMES)
    took = (time.perf_counter() - t0) * 1000
    evictions = sum(len(p.evictions) for p in outcome.placements)
    result["plan"] = {"queue": len(queue), "ms": round(took, 1), "placed": len(outcome.placements),
                      "unplaced": len(outcome.unplaced), "evictions": evictions}
    print(f"  plan of {len(queue)} mixed requests: {took:.0f} ms, {len(outcome.placements)} placed, "
          f"{len(outcome.unplaced)} wait, {evictions} evictions", flush=True)
    if outcome.unplaced:
        print(f"  e.g. waits: {next(iter(outcome.unplaced.values()))}", flush=True)
    gc.unfreeze()
    return result


def main() -> None:
    started = time.perf_counter()
    results = {f"{round(fill * 100)}%": run_fill(fill) for fill in (0.0, 0.5, 0.9)}
    summary = {
        "fleet": {"nodes": NODES, "gpus_per_node": GPUS_PER_NODE, "nodes_per_leaf": NODES_PER_LEAF,
                  "leaves_per_pod": LEAVES_PER_POD, "shared_ratio": SHARED_RATIO},
        "decisions": DECISIONS,
        "fills": results,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(f"done in {summary['seconds']} s")
    print("RESULT " + json.dumps(summary, separators=(",", ":")))


if __name__ == "__main__":
    main()
