"""
The scheduler loop's cycle budget (MERIDIAN_SCHEDULER_CYCLE_BUDGET_MS, like Slurm's
max_sched_time): a cycle plans only as many placements as the time left can commit, learnt
from the cycles before, and stops committing when its own pace falls behind; what it does not
plan or commit waits for the next cycle, queued as it was.
"""

import time
from unittest import mock

import pytest

from provisioning.models import Reservation
from provisioning.scheduling import scheduler
from provisioning.scheduling.scheduler import CycleBudget, LoopMemory, run_cycle
from tests.provisioning.factories import make_reservation, offering
from tests.world import small_fleet


def test_no_budget_plans_up_to_the_ceiling():
    assert CycleBudget(0, ceiling=400).placements(spent_ms=10_000) == 400


def test_the_time_left_over_the_commit_time_per_placement_sets_how_many():
    budget = CycleBudget(300, ceiling=400, floor=5, share=0)
    budget.plan_ms, budget.commit_ms_each = 50.0, 0.5
    assert budget.placements(spent_ms=150) == 200  # (300 - 150 - 50) / 0.5
    assert budget.placements(spent_ms=0) == 400  # room for 500: the ceiling holds
    assert budget.placements(spent_ms=290) == 5  # over already: the floor still moves the queue


def test_placing_keeps_its_share_when_the_fixed_part_fills_the_budget():
    budget = CycleBudget(300, ceiling=400, floor=5, share=0.4)
    budget.plan_ms, budget.commit_ms_each = 50.0, 0.5
    # Within the budget the share changes nothing: 150 ms fixed leaves 150 ms, half the cycle.
    assert budget.placements(spent_ms=100) == 300
    # 200 ms fixed would leave 100 ms, a third of the cycle: placing gets 133 ms, 40 % of 333.
    assert budget.placements(spent_ms=150) == 266
    # Ranking and the snapshot took 250 ms and planning takes 50: 300 ms fixed, so placing gets
    # 200 ms (40 % of a 500-ms cycle), not the floor.
    assert budget.placements(spent_ms=250) == 400  # 200 / 0.5, at the ceiling
    budget.commit_ms_each = 2.0
    assert budget.placements(spent_ms=250) == 100
    budget.share = 0.0
    assert budget.placements(spent_ms=250) == 5


def test_the_estimates_follow_the_cycles_measured():
    budget = CycleBudget(300, ceiling=400)
    first = budget.placements(spent_ms=100)
    for _ in range(20):  # commits turn out to cost 0.25 ms each and planning 20 ms
        budget.learn(plan_ms=20.0, apply_ms=0.25 * 200, placed=200)
    assert budget.commit_ms_each == pytest.approx(0.25, rel=0.01)
    assert budget.plan_ms == pytest.approx(20.0, rel=0.01)
    assert budget.placements(spent_ms=100) > first
    budget.learn(plan_ms=20.0, apply_ms=500.0, placed=5)  # too few to learn a per-placement cost from
    assert budget.commit_ms_each == pytest.approx(0.25, rel=0.01)
    for _ in range(10):  # a slow database: cycles shorten
        budget.learn(plan_ms=20.0, apply_ms=2.0 * 100, placed=100)
    assert budget.placements(spent_ms=100) < 100


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(8)


def test_a_cycle_over_budget_places_its_floor_and_leaves_the_rest_queued(world, fleet):
    chosen = offering("vm", 1)
    waiting = [make_reservation(world, state="queued", offering=chosen) for _ in range(6)]
    memory = LoopMemory(record_refresh_s=3600, shape_refresh_s=3600, budget_ms=0.001)
    memory.budget.floor, memory.budget.share = 2, 0.0

    report = run_cycle(memory=memory)

    assert report.placed == 2 and report.waiting == 4
    states = list(Reservation.objects.filter(pk__in=[r.pk for r in waiting]).values_list("state", flat=True))
    assert sorted(states) == ["queued"] * 4 + ["scheduled"] * 2
    memory.budget.budget_ms = 0  # no budget: the rest in one cycle
    assert run_cycle(memory=memory).placed == 4


def test_a_budgeted_cycle_makes_requests_only_for_what_it_tries(world, fleet):
    chosen = offering("vm", 1)
    for _ in range(6):
        make_reservation(world, state="queued", offering=chosen)
    memory = LoopMemory(record_refresh_s=3600, shape_refresh_s=3600, budget_ms=0.001)
    memory.budget.floor, memory.budget.share = 2, 0.0

    with mock.patch.object(scheduler, "request_for", wraps=scheduler.request_for) as made:
        report = run_cycle(memory=memory)

    assert report.placed == 2 and report.cut_short
    assert made.call_count == 3  # two placed, and the one that found the budget spent


def test_a_cycle_that_commits_slower_than_planned_leaves_the_rest_of_its_plan_to_the_next(world, fleet):
    chosen = offering("vm", 1)
    waiting = [make_reservation(world, state="queued", offering=chosen) for _ in range(6)]
    memory = LoopMemory(record_refresh_s=3600, shape_refresh_s=3600, budget_ms=200, rerank_s=60)
    memory.budget.plan_ms, memory.budget.commit_ms_each = 1.0, 0.01  # it expects every commit to be quick
    memory.budget.share = 0.0  # its end is the budget, however long ranking took on a slow host
    apply_batch = scheduler._apply_batch

    def slow_batch(*args):
        settled = apply_batch(*args)
        time.sleep(0.3)  # but each batch takes longer than the whole budget
        return settled

    with mock.patch.object(scheduler, "APPLY_BATCH", 2), mock.patch.object(scheduler, "_apply_batch", slow_batch):
        report = run_cycle(memory=memory)

    assert report.placed == 2 and report.waiting == 4 and report.cut_short
    states = Reservation.objects.filter(pk__in=[r.pk for r in waiting]).values_list("state", flat=True)
    assert sorted(states) == ["queued"] * 4 + ["scheduled"] * 2
    follow = run_cycle(memory=memory)  # from the kept ranking, at the usual pace
    assert follow.placed == 4 and not follow.ranked_afresh
    assert not Reservation.objects.filter(pk__in=[r.pk for r in waiting], state="queued").exists()


def test_without_a_budget_a_slow_cycle_commits_its_whole_plan(world, fleet):
    chosen = offering("vm", 1)
    for _ in range(6):
        make_reservation(world, state="queued", offering=chosen)
    memory = LoopMemory(record_refresh_s=3600, shape_refresh_s=3600, budget_ms=0)
    apply_batch = scheduler._apply_batch

    def slow_batch(*args):
        settled = apply_batch(*args)
        time.sleep(0.05)
        return settled

    with mock.patch.object(scheduler, "APPLY_BATCH", 2), mock.patch.object(scheduler, "_apply_batch", slow_batch):
        report = run_cycle(memory=memory)

    assert report.placed == 6 and not report.cut_short
