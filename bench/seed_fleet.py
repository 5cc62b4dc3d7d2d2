"""
How long building the benchmark fleet takes: one region, 1,280 nodes x 8 GPUs (10,240 GPUs),
leaf switches of 32 nodes, 4 % spares, a quarter shared hosts. Target: under a minute.
BENCH_FABRICS=8: the 10,240-node fleet (81,920 GPUs, one region of eight 1,280-node fabrics, pods
of eight leaves); target under five minutes.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/meridian .venv/bin/python bench/seed_fleet.py
"""

import json
import os
import time

from common import drop_database, setup_django

DB = "meridian_bench_seed"
FABRICS = int(os.environ.get("BENCH_FABRICS", "1"))
RUNS = int(os.environ.get("BENCH_RUNS", "3" if FABRICS == 1 else "1"))


def main(runs: int = RUNS) -> None:
    setup_django(DB)
    from cloud.fleet import FleetSpec, build_fleet
    from cloud.models import GPU, Fabric, Node, Region, Switch

    timings = []
    for run in range(runs):
        for model in (GPU, Node, Switch, Fabric, Region):
            model.objects.all().delete()
        started = time.perf_counter()
        report = build_fleet(FleetSpec(regions=1, nodes_per_fabric=1280, fabrics_per_region=FABRICS))
        timings.append(time.perf_counter() - started)
        print(f"run {run + 1}: {report.nodes} nodes, {report.gpus} GPUs, {report.switches} switches "
              f"in {timings[-1]:.2f} s")
    result = {"bench": "seed_fleet", "nodes": report.nodes, "gpus": report.gpus,
              "best_s": round(min(timings), 2), "worst_s": round(max(timings), 2),
              "target_s": 60 if FABRICS == 1 else 300}
    print("RESULT " + json.dumps(result))
    drop_database(DB)


if __name__ == "__main__":
    main()
