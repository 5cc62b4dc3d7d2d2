"""
Scheduling quality on a saturated multi-tenant workload: the synthetic teams of
``bench/team_workload.py`` through Meridian's loop, priority scorer and planner in simulated time
(``bench/team_loop.py``), and through the proposed change beside it (``bench/team_proposal.py``),
each figure against its goal.

    .venv/bin/python bench/trace_replay.py --workload teams      # the same as: .venv/bin/python bench/team_replay.py

Environment: BENCH_NODES (1280), BENCH_LOAD (1.2: booked GPU-hours offered over capacity),
BENCH_DAYS (6: 1 day of warm-up, 4 measured, 1 more so the measured work can start), BENCH_SEED (1),
BENCH_CYCLE_S (2, simulated seconds between loop cycles), BENCH_SHARED_SHARE (0.5, the shared
pool's share of the leaves), BENCH_POLICIES (``meridian,proposal``), for the proposal BENCH_HOLDS (2),
BENCH_STARVE_H (1), BENCH_LEAF_WAIT_H (48), BENCH_CLASSES (1) and BENCH_PROPOSAL_HP_WEIGHT (0.4),
BENCH_HP_WEIGHT (the scorer's high_priority weight for Meridian as is; 0.15 as shipped),
MERIDIAN_TRACE_DIR (the trace the no-show and early-release rates are measured from,
``../shared/traces`` beside the repo by default).

Figures are over the jobs submitted in the measured days; a job still waiting at the end counts
its wait so far (``unstarted``). An advance reservation's wait is not a wait (it asked to start
later): it is on time when it starts at its window's start. Useful utilization: GPU-seconds
actually used (no-shows' held time excluded) over the fleet's GPU-seconds in the measured days.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.append(str(Path(__file__).resolve().parent))  # after the repo: bench/provisioning.py is a script

from team_loop import Replay  # noqa: E402
from team_proposal import HoldingReplay  # noqa: E402
from team_workload import (  # noqa: E402
    GPUS_PER_NODE,
    HOUR,
    NODES_PER_LEAF,
    SHARED_SHARE,
    Workload,
    generate,
    measure_rates,
)

from provisioning.scheduling.plan_types import BARE_METAL_POOL, SHARED_POOL  # noqa: E402
from provisioning.scheduling.priority import DEFAULT_WEIGHTS, Weights  # noqa: E402

TRACE_DIR = Path(os.environ.get("MERIDIAN_TRACE_DIR") or Path(__file__).resolve().parents[2] / "shared" / "traces")
JOBS_CSV = "alibaba_openb_v2023_jobs.csv"

# The proposal's high_priority weight (MERIDIAN_PRIORITY_WEIGHTS; 0.15 as shipped): above what urgency
# (0.4 x (0.8 - 0.2)) and the fair-share penalty (0.15) can put between two requests, so an approved
# team's request outranks other teams' whatever urgency they ask.
PROPOSED_HP_WEIGHT = 0.4

# The goals of issue 41, part 5.
GOALS = {
    "max_wait_under_64_h": 2.0,
    "gangs_one_leaf": 0.90,
    "advance_on_time": 0.99,
    "hp_p90_ratio": 0.25,
    "useful_utilization": 0.80,
}


def verdicts(r: dict) -> list[tuple[str, str, str, bool]]:
    """(figure, value, goal, met) for each goal."""
    g = GOALS
    return [
        ("max wait, work under 64 GPUs", f"{r['wait_under_64_s']['max'] / HOUR:.2f} h",
         f"<= {g['max_wait_under_64_h']:.0f} h", r["wait_under_64_s"]["max"] <= g["max_wait_under_64_h"] * HOUR),
        ("gangs placed inside one leaf", f"{r['gangs_one_leaf']:.1%}", f">= {g['gangs_one_leaf']:.0%}",
         r["gangs_one_leaf"] >= g["gangs_one_leaf"]),
        ("advance reservations started on time", f"{r['advance_on_time']:.1%}", f">= {g['advance_on_time']:.0%}",
         r["advance_on_time"] >= g["advance_on_time"]),
        ("high-priority p90 wait / others', all", f"{r['hp_p90_ratio']:.2f}", f"<= {g['hp_p90_ratio']:.2f}",
         r["hp_p90_ratio"] <= g["hp_p90_ratio"]),
        ("the same, work that queued", f"{r['hp_queued_p90_ratio']:.2f}", f"<= {g['hp_p90_ratio']:.2f}",
         r["hp_queued_p90_ratio"] <= g["hp_p90_ratio"]),
        ("useful utilization", f"{r['useful_utilization']:.3f}", f">= {g['useful_utilization']:.2f}",
         r["useful_utilization"] >= g["useful_utilization"]),
    ]


def report(r: dict, label: str) -> None:
    h = HOUR
    q, u = r["wait_s"], r["wait_under_64_s"]
    print(f"[{label}] {r['jobs_measured']} jobs submitted in the measured days ({r['now_work']} start-now, "
          f"{r['advance_reservations']} advance); {r['unstarted']} still waiting at the end "
          f"({r['unstarted_under_64']} under 64 GPUs)")
    print(f"  wait, all: mean {q['mean'] / h:.2f} h, p90 {q['p90'] / 60:.1f} min, max {q['max'] / h:.1f} h; "
          f"under 64 GPUs: mean {u['mean'] / 60:.1f} min, p99 {u['p99'] / 60:.1f} min, max {u['max'] / h:.2f} h")
    print("  wait by GPUs: " + "; ".join(f"{int(k)}: mean {v['mean'] / h:.2f} h max {v['max'] / h:.1f} h"
                                         for k, v in r["wait_by_gpus_s"].items()))
    print(f"  p90 wait: high-priority teams {r['hp_p90_s'] / 60:.1f} min, others {r['others_p90_s'] / 60:.1f} min; "
          f"under 64 GPUs {r['hp_under_64_p90_s'] / 60:.1f} vs {r['others_under_64_p90_s'] / 60:.1f} min; "
          f"of the {r['queued']} that queued (waited over a cycle; {r['queued_hp']} high-priority) "
          f"{r['hp_queued_p90_s'] / h:.2f} vs {r['others_queued_p90_s'] / h:.2f} h")
    one_leaf = r["gangs_one_leaf_by_nodes"]
    print("  gangs in one leaf by nodes: " + ", ".join(f"{n}: {s:.0%}" for n, s in one_leaf.items())
          + f"; 2-4 node work {r['mid_one_leaf']:.0%}; late advance reservations {r['advance_late']}, "
          f"late by {r['advance_late_mean_s'] / h:.2f} h on mean")
    if r["late_under_64"]:
        why = r["late_under_64_blocked"]
        print(f"  {r['late_under_64']} under 64 GPUs waited over 2 h (by GPUs: "
              + ", ".join(f"{g}: {n}" for g, n in r["late_under_64_by_gpus"].items())
              + f"); in the cycles they did not fit: free now but booked ahead {why['booked_ahead']:.0%}, "
              f"enough GPUs free but not on one node (bare metal: not whole nodes) {why['fragmented']:.0%}, "
              f"too few free {why['full']:.0%}")
    print(f"  GPUs held {r['held_utilization']:.3f} of capacity; {r['cycles']} cycles, {r['place_calls']} place "
          f"calls, {r['wall_s']:.0f} s")
    for figure, value, goal, met in verdicts(r):
        print(f"  {figure:<40} {value:>9}  goal {goal:<8} {'met' if met else 'MISSED'}")


def replays(workload: Workload, cycle_s: float, weights: Weights) -> dict[str, Replay]:
    """The policies BENCH_POLICIES names; the proposal ranks with its own high-priority weight."""
    proposed = Weights.from_mapping({**vars(weights), "high_priority": float(
        os.environ.get("BENCH_PROPOSAL_HP_WEIGHT", str(PROPOSED_HP_WEIGHT)))})
    holds = int(os.environ.get("BENCH_HOLDS", "2"))
    leaf_wait = float(os.environ.get("BENCH_LEAF_WAIT_H", "48")) * HOUR
    starve = float(os.environ.get("BENCH_STARVE_H", "1")) * HOUR
    chosen = os.environ.get("BENCH_POLICIES", "meridian,proposal").split(",")
    made = {
        "meridian": lambda: Replay(workload, cycle_s, weights),
        "proposal": lambda: HoldingReplay(workload, cycle_s, proposed, holds=holds, starve_s=starve,
                                          leaf_wait_s=leaf_wait,
                                          classes=os.environ.get("BENCH_CLASSES", "1") == "1"),
    }
    unknown = [c for c in chosen if c not in made]
    if unknown:
        sys.exit(f"BENCH_POLICIES: unknown {', '.join(unknown)}; known: {', '.join(made)}")
    return {name: made[name]() for name in chosen}


def main() -> None:
    t0 = time.perf_counter()
    nodes = int(os.environ.get("BENCH_NODES", "1280"))
    load = float(os.environ.get("BENCH_LOAD", "1.2"))
    days = float(os.environ.get("BENCH_DAYS", "6"))
    seed = int(os.environ.get("BENCH_SEED", "1"))
    cycle_s = float(os.environ.get("BENCH_CYCLE_S", "2"))
    hp_weight = os.environ.get("BENCH_HP_WEIGHT")
    weights = Weights.from_mapping({"high_priority": float(hp_weight)}) if hp_weight else DEFAULT_WEIGHTS
    path = TRACE_DIR / JOBS_CSV
    if not path.is_file():
        sys.exit(f"trace file {path} not found (set MERIDIAN_TRACE_DIR to the folder holding {JOBS_CSV})")
    rates = measure_rates(path)
    shared_share = float(os.environ.get("BENCH_SHARED_SHARE", str(SHARED_SHARE)))
    workload = generate(rates, nodes=nodes, load=load, days=days, seed=seed, shared_share=shared_share)
    print(f"trace rates ({rates.tasks} GPU tasks that ran): no-show {rates.no_show:.1%}, "
          f"early release {rates.early_release:.1%}")
    bm = workload.pool_gpus(BARE_METAL_POOL)
    print(f"fleet: {nodes} nodes x {GPUS_PER_NODE} GPUs, {NODES_PER_LEAF} to a leaf; bare metal "
          f"{bm // GPUS_PER_NODE} nodes ({workload.bare_metal_leaves} leaves), shared "
          f"{(workload.gpus - bm) // GPUS_PER_NODE} nodes")
    ob, oh = workload.info["offered_booked"], workload.info["offered_held"]
    print(f"workload: {len(workload.jobs)} jobs of {len(workload.teams)} teams over {days:g} days; offered, "
          f"booked: {ob['fleet']:.2f} (bare metal {ob[BARE_METAL_POOL]:.2f}, shared {ob[SHARED_POOL]:.2f}); "
          f"as held (early releases and no-shows reclaimed): {oh['fleet']:.2f}; "
          f"used: {workload.info['offered_used']['fleet']:.2f}")
    results = {}
    for name, replay in replays(workload, cycle_s, weights).items():
        results[name] = replay.run()
        report(results[name], name)
    wall = time.perf_counter() - t0
    print(f"wall time {wall:.0f} s")
    print("RESULT " + json.dumps({
        "bench": "trace_replay", "workload": "teams", "nodes": nodes, "load": load, "days": days, "seed": seed,
        "cycle_s": cycle_s, "weights": vars(weights), "rates": vars(rates), "info": workload.info, **results,
        "goals": {name: {figure: {"value": value, "goal": goal, "met": met}
                         for figure, value, goal, met in verdicts(r)} for name, r in results.items()},
        "wall_s": wall,
    }, sort_keys=True))


if __name__ == "__main__":
    main()
