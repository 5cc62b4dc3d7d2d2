"""
Packing inference tasks (issue 39), the pure planner in memory (no database): 1,280 shared hosts x 8
GPUs of 80 GiB (an inference fleet: every node a shared host), empty, and 10,000 inference tasks of
mixed slice classes (real-time, batch, training) and memory caps (1/2, 1/4 and 1/8 of a GPU, as the
time-sliced offerings cut it), in one ``plan`` call -- what one scheduler cycle plans. Beside it, the
same 10,000 tasks placed one whole GPU each.

Reported: the planning time against the scheduler's cycle budget (MERIDIAN_SCHEDULER_CYCLE_BUDGET_MS,
250 ms by default), the tasks placed, the GPUs they touch, the occupied share of those GPUs (the
memory their slots cover over the memory of the GPUs touched), and that no GPU mixes classes or holds
more than 8 tasks.

    .venv/bin/python bench/inference_packing.py            # BENCH_TASKS=10000, BENCH_NODES=1280

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
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from provisioning.scheduling.plan_types import (  # noqa: E402
    CONTAINER,
    SHARED_POOL,
    GPUCapacity,
    NodeCapacity,
    Request,
    Snapshot,
)
from provisioning.scheduling.planner import plan  # noqa: E402

NODES = int(os.environ.get("BENCH_NODES", "1280"))
TASKS = int(os.environ.get("BENCH_TASKS", "10000"))
NODES_PER_LEAF, LEAVES_PER_POD, GPUS, MEMORY = 32, 8, 8, 81920
MODEL, FABRIC = uuid.UUID(int=1), uuid.UUID(int=2)
CLASSES = ("realtime", "batch", "training")
FRACTIONS = (2, 4, 8)
BUDGET_MS = float(os.environ.get("MERIDIAN_SCHEDULER_CYCLE_BUDGET_MS", "250"))
NOW = datetime(2026, 12, 1, 9, tzinfo=UTC)
HOUR = timedelta(hours=1)


def fleet() -> Snapshot:
    leaves = [uuid.uuid4() for _ in range(max(1, NODES // NODES_PER_LEAF))]
    nodes = [NodeCapacity(uuid.uuid4(), "us-east-1", FABRIC, leaves[i // NODES_PER_LEAF % len(leaves)],
                          i // NODES_PER_LEAF // LEAVES_PER_POD, SHARED_POOL, MODEL,
                          [GPUCapacity(uuid.uuid4(), g, MEMORY) for g in range(GPUS)]) for i in range(NODES)]
    return Snapshot(now=NOW, nodes=nodes)


def tasks(rng: random.Random, *, whole: bool) -> list[Request]:
    made = []
    for _ in range(TASKS):
        klass, n = rng.choice(CLASSES), rng.choice(FRACTIONS)
        made.append(Request(reservation_id=uuid.uuid4(), kind=CONTAINER, gpu_model_ids=(MODEL,), regions=("us-east-1",),
                            units=1, gpus_per_unit=1, start=NOW, end=NOW + rng.choice((1, 4, 24)) * HOUR,
                            priority=rng.random(), slots_per_gpu=1 if whole else n,
                            share_class="" if whole else klass))
    return made


def run(whole: bool) -> dict:
    rng = random.Random(39)  # noqa: S311 -- the same tasks in both runs
    queue = tasks(rng, whole=whole)
    snap = fleet()
    gc.collect()
    started = time.perf_counter()
    result = plan(snap, queue, headroom=0.0)
    elapsed_ms = (time.perf_counter() - started) * 1000
    per_gpu: dict = defaultdict(list)
    for placement in result.placements:
        for a in placement.assignments:
            per_gpu[a.gpu_id].append((a.share_class, a.mem_hi - a.mem_lo))
    covered = sum(width for slots in per_gpu.values() for _, width in slots)
    return {"placed": len(result.placements), "unplaced": len(result.unplaced), "plan_ms": round(elapsed_ms, 1),
            "gpus_touched": len(per_gpu), "occupied_share": round(covered / (len(per_gpu) * MEMORY), 4),
            "max_tasks_a_gpu": max(len(s) for s in per_gpu.values()),
            "gpus_mixing_classes": sum(1 for s in per_gpu.values() if len({c for c, _ in s}) > 1)}


def main() -> None:
    print(f"fleet: {NODES} shared hosts x {GPUS} GPUs; {TASKS} inference tasks (classes {', '.join(CLASSES)}; "
          f"1/{', 1/'.join(map(str, FRACTIONS))} of a GPU)")
    sliced = run(whole=False)
    print(f"time-sliced: {sliced['placed']} placed in {sliced['plan_ms']} ms (budget {BUDGET_MS:.0f} ms) on "
          f"{sliced['gpus_touched']} GPUs, {sliced['occupied_share']:.1%} of their memory covered; at most "
          f"{sliced['max_tasks_a_gpu']} tasks a GPU, {sliced['gpus_mixing_classes']} GPUs mixing classes")
    whole = run(whole=True)
    print(f"whole GPUs:  {whole['placed']} placed in {whole['plan_ms']} ms on {whole['gpus_touched']} GPUs")
    saved = 1 - sliced["gpus_touched"] / whole["gpus_touched"] if whole["gpus_touched"] else 0.0
    print(f"time slicing uses {saved:.1%} fewer GPUs for the same tasks")
    print("RESULT " + json.dumps({"bench": "inference_packing", "nodes": NODES, "tasks": TASKS,
                                  "budget_ms": BUDGET_MS, "time_sliced": sliced, "whole_gpu": whole,
                                  "gpus_saved_share": round(saved, 4)}))


if __name__ == "__main__":
    main()
