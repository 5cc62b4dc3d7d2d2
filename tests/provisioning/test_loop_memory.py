"""
What the scheduler loop keeps between cycles (provisioning.scheduling.scheduler.LoopMemory) never makes a
cycle see other than what a fresh read would: the kept fleet shape gives load_snapshot's
snapshot, and the kept queue follows reservations that leave, join and come back.
"""

from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from cloud.models import GPU, Node
from provisioning.choices import OperationKind, OperationState
from provisioning.models import Allocation, Operation, Reservation
from provisioning.scheduling.fleet_shape import FleetShape
from provisioning.scheduling.scheduler import LoopMemory, QueueMirror, run_cycle
from provisioning.scheduling.snapshot import load_snapshot
from provisioning.services import reservation_cancel
from tests.provisioning.factories import held, make_reservation, offering
from tests.world import h100, small_fleet


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(8)


def view(snapshot):
    """A snapshot as plain sorted data (busy lists compared as sets of tuples)."""
    return [(n.node_id, n.region, n.fabric_id, n.leaf_id, n.pod, n.pool, n.gpu_model_id,
             [(g.gpu_id, g.index, g.memory_mib, sorted(tuple(b) for b in g.busy)) for g in n.gpus])
            for n in snapshot.nodes]


def hold(world, gpus, *, start, end, term="on_demand", score=0.3):
    holder = make_reservation(world, state="scheduled", billing_term=term, score=score)
    held(holder, gpus, start=start, end=end)
    return holder


def sellable_nodes():
    return list(Node.objects.filter(is_spare=False, state__in=["available", "in_service"], health="healthy")
                .order_by("hostname"))


def test_the_kept_shape_gives_what_a_fresh_read_gives(world, fleet):
    now = timezone.now()
    until = now + timedelta(hours=6)
    nodes = sellable_nodes()
    assert len(nodes) >= 6
    # Everything load_snapshot leaves out or marks: an out-of-service node, a quarantined GPU, an
    # unhealthy one, a node under attestation, spot and on-demand work, work outside the window.
    Node.objects.filter(pk=nodes[0].pk).update(state="maintenance")
    GPU.objects.filter(pk=nodes[1].gpus.first().pk).update(state="quarantined")
    GPU.objects.filter(pk=nodes[2].gpus.last().pk).update(health="failed")
    Operation.objects.create(node=nodes[3], kind=OperationKind.ATTEST, state=OperationState.RUNNING)
    hold(world, nodes[4].gpus.all()[:2], start=now - timedelta(hours=1), end=now + timedelta(hours=1),
         term="spot", score=0.2)
    hold(world, nodes[4].gpus.all()[2:3], start=now + timedelta(hours=2), end=now + timedelta(hours=3))
    hold(world, nodes[5].gpus.all()[:1], start=now - timedelta(hours=3), end=now - timedelta(hours=2))
    hold(world, nodes[5].gpus.all()[1:2], start=until + timedelta(hours=1), end=until + timedelta(hours=2))
    shape = FleetShape(refresh_s=3600)
    for where in ({}, {"regions": {"us-east-1"}, "gpu_model_ids": {h100().pk}}, {"regions": {"nowhere"}}):
        for _ in range(2):  # read, then kept
            assert view(shape.snapshot(now=now, until=until, **where)) == view(
                load_snapshot(now=now, until=until, **where))
    fresh = view(shape.snapshot(now=now, until=until))
    ids = {n[0] for n in fresh}
    assert nodes[0].pk not in ids and nodes[3].pk not in ids
    assert not any(n.is_spare for n in Node.objects.filter(pk__in=ids))


def test_what_moves_between_cycles_is_seen_by_the_next(world, fleet):
    now = timezone.now()
    until = now + timedelta(hours=6)
    shape = FleetShape(refresh_s=3600)
    shape.snapshot(now=now, until=until)  # the shape is kept from here on
    nodes = sellable_nodes()
    Node.objects.filter(pk=nodes[0].pk).update(state="faulty")
    holder = hold(world, nodes[1].gpus.all()[:1], start=now, end=now + timedelta(hours=1))
    seen = {n.node_id: n for n in shape.snapshot(now=now, until=until).nodes}
    assert nodes[0].pk not in seen
    assert [b.reservation_id for g in seen[nodes[1].pk].gpus for b in g.busy] == [holder.pk]
    assert view(shape.snapshot(now=now, until=until)) == view(load_snapshot(now=now, until=until))


def test_the_shape_is_read_again_when_hardware_is_removed(world, fleet):
    now = timezone.now()
    shape = FleetShape(refresh_s=3600)
    shape.snapshot(now=now, until=now + timedelta(hours=1))
    gone = sellable_nodes()[0]
    gone.delete()
    assert gone.pk not in {n.node_id for n in shape.snapshot(now=now, until=now + timedelta(hours=1)).nodes}


def test_the_kept_queue_follows_what_leaves_joins_and_comes_back(world, fleet):
    chosen = offering()
    first = [make_reservation(world, state="queued", offering=chosen) for _ in range(3)]
    mirror = QueueMirror()
    assert {row[0] for row in mirror.queued()} == {r.pk for r in first}
    reservation_cancel(actor=None, reservation=first[0])
    late = make_reservation(world, state="queued", offering=chosen)
    assert {row[0] for row in mirror.queued()} == {first[1].pk, first[2].pk, late.pk}
    Reservation.objects.filter(pk=first[1].pk).update(state="scheduled")
    assert first[1].pk not in {row[0] for row in mirror.queued()}
    Reservation.objects.filter(pk=first[1].pk).update(state="queued")  # back, e.g. after a failed provision
    assert first[1].pk in {row[0] for row in mirror.queued()}


def test_cycles_with_memory_place_what_comes_back_to_the_queue(world, fleet):
    """A placed reservation's kept row is forgotten: requeued, it is placed again from its fresh row."""
    memory = LoopMemory(record_refresh_s=3600, shape_refresh_s=3600)
    placed = make_reservation(world, state="queued")
    assert run_cycle(memory=memory).placed == 1
    placed.refresh_from_db()
    assert placed.state == "scheduled"
    placed.allocations.all().delete()
    Reservation.objects.filter(pk=placed.pk).update(state="queued", region=None, starts_at=None, ends_at=None)
    other = make_reservation(world, state="queued")
    assert run_cycle(memory=memory).placed == 2
    assert set(Reservation.objects.filter(pk__in=[placed.pk, other.pk]).values_list("state", flat=True)) == {
        "scheduled"}
    assert not memory.queue.rows  # nothing is kept of what left the queue


def test_kept_rows_see_an_offering_edited_since(world, fleet):
    chosen = offering("vm", 1)
    waiting = make_reservation(world, state="queued", offering=chosen)
    mirror = QueueMirror()
    mirror.queued()
    assert mirror.whole([waiting.pk])[waiting.pk].offering.gpus_per_unit == 1
    type(chosen).objects.filter(pk=chosen.pk).update(gpus_per_unit=2)
    assert mirror.whole([waiting.pk])[waiting.pk].offering.gpus_per_unit == 2


def test_the_kept_queue_reads_a_burst_by_one_scan(world, fleet, monkeypatch):
    from provisioning.scheduling import scheduler

    monkeypatch.setattr(scheduler, "MIRROR_BY_IDS", 1)
    chosen = offering()
    made = [make_reservation(world, state="queued", offering=chosen) for _ in range(3)]
    make_reservation(world, state="cancelled", offering=chosen)
    mirror = QueueMirror()
    assert sorted(row[0] for row in mirror.queued()) == sorted(r.pk for r in made)
    assert set(mirror.ranking) == {str(r.pk) for r in made}


def test_a_primed_memory_holds_the_queue_and_writes_nothing(world, fleet, django_assert_max_num_queries):
    chosen = offering("vm", 1)
    waiting = [make_reservation(world, state="queued", offering=chosen) for _ in range(4)]
    memory = LoopMemory(record_refresh_s=3600, shape_refresh_s=3600)

    memory.prime()

    assert set(memory.queue.ranking) == {str(r.pk) for r in waiting}
    assert set(memory.queue.rows) == {r.pk for r in waiting}
    assert memory.shape.nodes
    assert set(Reservation.objects.filter(pk__in=[r.pk for r in waiting]).values_list("state", flat=True)) == {
        "queued"}
    # The first cycle then reads only what changed: the queue's ids, not its rows again.
    with django_assert_max_num_queries(1):
        assert len(memory.queue.queued()) == 4
    with django_assert_max_num_queries(1):  # the offerings, which staff may edit
        memory.queue.whole([r.pk for r in waiting])
    assert run_cycle(memory=memory).placed == 4


def test_the_scheduler_command_primes_its_memory_and_places_the_queue(world, fleet):
    from django.core.management import call_command

    waiting = [make_reservation(world, state="queued", offering=offering("vm", 1)) for _ in range(3)]
    with mock.patch.object(LoopMemory, "prime", autospec=True, side_effect=LoopMemory.prime) as prime:
        call_command("run_scheduler", "--once")
    assert prime.call_count == 1
    assert set(Reservation.objects.filter(pk__in=[r.pk for r in waiting]).values_list("state", flat=True)) == {
        "scheduled"}


def test_a_cycle_cut_short_by_its_budget_is_followed_at_once(world, fleet, settings):
    """With more placeable work than a cycle may place, the loop does not wait out its interval."""
    from django.core.management import call_command

    from provisioning.management.commands import run_scheduler

    settings.MERIDIAN_SCHEDULER_MAX_PLACEMENTS = 1
    waiting = [make_reservation(world, state="queued", offering=offering("vm", 1)) for _ in range(3)]
    sleeps = []

    class Stop(Exception):
        pass

    def sleep(seconds):
        sleeps.append(seconds)
        raise Stop  # the first wait ends the loop

    with mock.patch.object(run_scheduler.time, "sleep", sleep), pytest.raises(Stop):
        call_command("run_scheduler", "--interval", "30")
    # Three cycles back to back (one placement each; the third placed the last), then the wait.
    assert set(Reservation.objects.filter(pk__in=[r.pk for r in waiting]).values_list("state", flat=True)) == {
        "scheduled"}
    assert len(sleeps) == 1 and sleeps[0] > 25


def cut_short_memory(rerank_s=3600.0) -> LoopMemory:
    """A memory whose cycles place two each (a budget already spent, no placing share) and keep their ranking."""
    memory = LoopMemory(record_refresh_s=3600, shape_refresh_s=3600, budget_ms=0.001, rerank_s=rerank_s)
    memory.budget.floor, memory.budget.share = 2, 0.0
    return memory


def test_the_cycles_after_one_cut_short_plan_from_its_ranking(world, fleet):
    chosen = offering("vm", 1)
    waiting = [make_reservation(world, state="queued", offering=chosen, urgency=0.1 * i) for i in range(6)]
    memory = cut_short_memory()

    first = run_cycle(memory=memory)
    assert first.cut_short and first.ranked_afresh and first.placed == 2
    # Joined since: the most urgent of all, but not in the ranking the next cycle plans from.
    urgent = make_reservation(world, state="queued", offering=chosen, urgency=1.0)
    second = run_cycle(memory=memory)
    assert not second.ranked_afresh and second.placed == 2 and second.queued == 4
    urgent.refresh_from_db()
    assert urgent.state == "queued"
    scheduled = set(Reservation.objects.filter(state="scheduled").values_list("pk", flat=True))
    assert scheduled == {r.pk for r in waiting[2:]}  # the four most urgent of the first ranking

    memory.kept_ranking.at -= 3600  # the ranking has served its time: the next cycle ranks afresh
    third = run_cycle(memory=memory)
    assert third.ranked_afresh and third.queued == 3
    urgent.refresh_from_db()
    assert urgent.state == "scheduled"


def test_a_kept_ranking_never_places_what_left_the_queue(world, fleet):
    chosen = offering("vm", 1)
    waiting = [make_reservation(world, state="queued", offering=chosen, urgency=0.1 * i) for i in range(6)]
    memory = cut_short_memory()
    assert run_cycle(memory=memory).placed == 2
    # The next two of the ranking: one cancelled by its tenant, one placed elsewhere meanwhile.
    reservation_cancel(actor=None, reservation=waiting[3])
    Reservation.objects.filter(pk=waiting[2].pk).update(state="scheduled")

    report = run_cycle(memory=memory)

    assert not report.ranked_afresh and report.placed == 0 and report.conflicts == 2
    assert not Allocation.objects.filter(reservation__in=waiting[2:4]).exists()
    assert Reservation.objects.get(pk=waiting[3].pk).state == "cancelled"
    # Refused like a lost race, they are out of the kept ranking: the cycle after places the next two.
    assert run_cycle(memory=memory).placed == 2
    assert set(Reservation.objects.filter(pk__in=[r.pk for r in waiting[:2]]).values_list("state", flat=True)) == {
        "scheduled"}


def test_a_cycle_that_reaches_all_its_work_leaves_no_ranking(world, fleet):
    chosen = offering("vm", 1)
    make_reservation(world, state="queued", offering=chosen)
    memory = LoopMemory(record_refresh_s=3600, shape_refresh_s=3600, rerank_s=3600)
    report = run_cycle(memory=memory)
    assert report.placed == 1 and not report.cut_short
    assert memory.kept_ranking is None
    late = make_reservation(world, state="queued", offering=chosen)
    assert run_cycle(memory=memory).ranked_afresh
    late.refresh_from_db()
    assert late.state == "scheduled"


def test_without_a_rerank_interval_every_cycle_ranks_afresh(world, fleet):
    chosen = offering("vm", 1)
    for i in range(6):
        make_reservation(world, state="queued", offering=chosen, urgency=0.1 * i)
    memory = cut_short_memory(rerank_s=0.0)
    reports = [run_cycle(memory=memory) for _ in range(3)]
    assert all(r.ranked_afresh and r.placed == 2 for r in reports)
