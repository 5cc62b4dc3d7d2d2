"""
The synthetic multi-team workload of bench/trace_replay.py --workload teams is well-formed: shapes
and pools as documented, gangs half of the booked GPU-hours, the booked load offered as asked,
outcomes at the measured rates, the same jobs for the same seed; and a small replay runs.
"""

import math
import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))  # after the repo: bench/provisioning.py

from team_loop import Replay  # noqa: E402
from team_workload import (  # noqa: E402
    CATEGORIES,
    GANG_GPUS,
    HIGH_PRIORITY,
    HOUR,
    LEAD_H,
    NO_SHOW_HOLD_S,
    NODES_PER_LEAF,
    TEAMS,
    TraceRates,
    generate,
    measure_rates,
)

from provisioning.scheduling.plan_types import BARE_METAL, BARE_METAL_POOL, CONTAINER, SHARED_POOL, VM

RATES = TraceRates(tasks=1000, no_show=0.04, early_release=0.25)
HEADER = "source,job_id,submit_time_s,start_time_s,end_time_s,duration_s,queue_s,gpus_requested,num_gpu," \
         "gpu_milli,cpu_milli,memory_mib,gpu_spec,tenant_class,user,status\n"


@pytest.fixture(scope="module")
def workload():
    return generate(RATES, nodes=256, load=1.2, days=2.0, seed=3)


def test_rates_are_measured_from_the_gpu_tasks_that_ran(tmp_path):
    rows = [
        (1, 1000, "30", "Failed"),  # no-show: failed within its first minute
        (1, 500, "600", "Failed"),  # early release
        (8, 1000, "3600", "Succeeded"),
        (2, 1000, "7200", "Running"),
        (1, 1000, "", "Pending"),  # never ran
        (0, 0, "100", "Failed"),  # CPU only
    ]
    csv = tmp_path / "jobs.csv"
    csv.write_text(HEADER + "".join(f"t,j{i},0,0,0,{d},0,1,{g},{m},0,0,,LS,,{s}\n"
                                    for i, (g, m, d, s) in enumerate(rows)))
    rates = measure_rates(csv)
    assert (rates.tasks, rates.no_show, rates.early_release) == (4, 0.25, 0.25)
    assert rates.used == 0.5


def test_a_trace_without_gpu_tasks_that_ran_is_refused(tmp_path):
    csv = tmp_path / "jobs.csv"
    csv.write_text(HEADER + "t,j0,0,,,,,1,1,1000,0,0,,LS,,Pending\n")
    with pytest.raises(ValueError, match="no GPU task that ran"):
        measure_rates(csv)


def test_jobs_are_ordered_numbered_and_inside_the_horizon(workload):
    jobs = workload.jobs
    assert [j.idx for j in jobs] == list(range(len(jobs)))
    assert all(a.submit <= b.submit for a, b in zip(jobs, jobs[1:], strict=False))
    assert all(0 <= j.submit < workload.horizon_s for j in jobs)
    for j in jobs:
        if j.advance:
            assert LEAD_H[0] * HOUR <= j.start_at - j.submit <= LEAD_H[1] * HOUR
        else:
            assert j.start_at == j.submit


def test_shapes_pools_and_durations_are_as_documented(workload):
    by_name = {c.name: c for c in CATEGORIES}
    for j in workload.jobs:
        assert (j.kind, j.units, j.gpus_per_unit) in {s[:3] for s in j.category.shapes}
        assert j.gpus == j.units * j.gpus_per_unit
        assert j.pool == (BARE_METAL_POOL if j.kind == BARE_METAL else SHARED_POOL)
        lo, hi = by_name[j.category.name].clip_h
        assert lo * HOUR <= j.booked_s <= hi * HOUR
    gangs = [j for j in workload.jobs if j.category.name == "gang"]
    assert {j.units for j in gangs} == {8, 16, 32} and max(j.units for j in gangs) == NODES_PER_LEAF
    assert all(j.gpus >= GANG_GPUS for j in gangs)
    assert all(j.gpus < GANG_GPUS for j in workload.jobs if j.category.name != "gang")
    small = [j for j in workload.jobs if j.category.name == "small"]
    assert {j.kind for j in small} == {VM, CONTAINER} and max(j.gpus for j in small) == 8


def test_gangs_hold_half_the_booked_gpu_hours_and_the_load_is_as_asked(workload):
    capacity = workload.gpus * workload.horizon_s
    for category in CATEGORIES:
        work = [j.gpus * j.booked_s for j in workload.jobs if j.category is category]
        target = category.share * workload.load * capacity
        assert target <= sum(work) < target + max(work)  # drawn until the target is reached
    booked = workload.info["offered_booked"]
    assert booked["fleet"] == pytest.approx(1.2, rel=0.1)
    assert booked[BARE_METAL_POOL] > 1.2 > booked[SHARED_POOL]  # the shared pool has more than its share
    gang_share = sum(j.gpus * j.booked_s for j in workload.jobs if j.category.name == "gang") / \
        sum(j.gpus * j.booked_s for j in workload.jobs)
    assert gang_share == pytest.approx(0.5, abs=0.05)


def test_outcomes_follow_the_rates_and_use_no_more_than_booked(workload):
    jobs = workload.jobs
    no_show = [j for j in jobs if j.outcome == "no_show"]
    early = [j for j in jobs if j.outcome == "early"]
    n = len(jobs)
    for share, rate in ((len(no_show) / n, RATES.no_show), (len(early) / n, RATES.early_release)):
        assert abs(share - rate) < 4 * math.sqrt(rate * (1 - rate) / n)
    assert all(j.used_s == 0 and 0 < j.held_s <= min(j.booked_s, NO_SHOW_HOLD_S) for j in no_show)
    assert all(0 <= j.used_s <= j.booked_s and j.held_s == pytest.approx(max(1.0, j.used_s)) for j in early)
    assert all(j.used_s == j.held_s == j.booked_s for j in jobs if j.outcome == "used")


def test_teams_gangs_come_from_training_teams_and_quotas_are_set(workload):
    teams = workload.teams
    assert len(teams) == TEAMS
    assert {t.index for t in teams if t.high_priority} == set(HIGH_PRIORITY)
    assert {t.trains for t in teams if t.high_priority} == {True, False}
    assert all(teams[j.team].trains for j in workload.jobs if j.category.name == "gang")
    assert all(t.quota_gpus >= 8 for t in teams)
    assert sum(t.weight for t in teams) == pytest.approx(1.0)


def test_the_same_seed_gives_the_same_jobs_and_another_seed_others():
    def key(w):
        return [(j.submit, j.team, j.kind, j.units, j.gpus_per_unit, j.booked_s, j.outcome, j.start_at)
                for j in w.jobs]

    first = generate(RATES, nodes=128, days=1.0, seed=5)
    assert key(first) == key(generate(RATES, nodes=128, days=1.0, seed=5))
    assert key(first) != key(generate(RATES, nodes=128, days=1.0, seed=6))


def test_the_pools_split_by_whole_leaves():
    w = generate(RATES, nodes=1280, days=0.05, seed=1)
    assert (w.bare_metal_leaves, w.pool_gpus(BARE_METAL_POOL), w.pool_gpus(SHARED_POOL)) == (20, 5120, 5120)
    assert generate(RATES, nodes=1280, days=0.05, seed=1, shared_share=0.4).bare_metal_leaves == 24
    with pytest.raises(ValueError, match="two leaves"):
        generate(RATES, nodes=32, days=0.05)


def test_a_small_replay_places_work_through_the_planner_and_reports_the_goal_figures():
    w = generate(RATES, nodes=2 * NODES_PER_LEAF, days=3.0, seed=2)
    result = Replay(w, cycle_s=30.0).run()
    started = [j for j in w.jobs if j.start is not None]
    assert started and all(j.start >= j.start_at - 1e-3 for j in started)
    assert all(len(j.placement.assignments) == j.gpus for j in started)
    assert 0 < result["useful_utilization"] <= result["held_utilization"] <= 1
    assert 0 <= result["advance_on_time"] <= 1 and 0 <= result["gangs_one_leaf"] <= 1
    assert result["wait_under_64_s"]["max"] <= result["wait_s"]["max"]
