"""
Allocations that ended long ago are archived: their rows stay as history, but they leave the
no-overlap constraint, so its index holds what can still clash rather than every allocation ever
made. Only what ended before any new allocation can start is archived.
"""

from datetime import timedelta
from unittest import mock

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from cloud.models import GPU
from provisioning import allocations
from provisioning.allocations import CapacityTaken, allocation_bind, allocation_extend, allocations_archive
from provisioning.lifecycle.tick import tick
from provisioning.models import Allocation
from tests.provisioning.factories import held, make_reservation
from tests.provisioning.test_allocations import whole
from tests.world import small_fleet

HOUR = timedelta(hours=1)


@pytest.fixture
def gpus(world):
    small_fleet(4)
    return list(GPU.objects.filter(node__pool="shared").order_by("node__hostname", "index")[:4])


def hold(world, gpu, start, end):
    with transaction.atomic():  # a clash undoes only itself
        return held(make_reservation(world), [gpu], start=start, end=end)[0]


def bind(world, gpu, start, end):
    reservation = make_reservation(world)
    with transaction.atomic():
        allocation_bind(reservation=reservation, assignments=[whole(gpu)], starts_at=start, ends_at=end)
    return Allocation.objects.get(reservation=reservation)


def test_only_what_ended_before_the_horizon_is_archived(world, gpus, settings):
    settings.MERIDIAN_ALLOCATION_ARCHIVE_AFTER = HOUR
    now = timezone.now()
    old = hold(world, gpus[0], now - 5 * HOUR, now - 2 * HOUR)
    lately = hold(world, gpus[1], now - 3 * HOUR, now - HOUR / 2)
    running = hold(world, gpus[2], now - HOUR, now + HOUR)
    ahead = hold(world, gpus[3], now + HOUR, now + 2 * HOUR)

    assert allocations_archive(now=now) == 1
    assert allocations_archive(now=now) == 0  # once
    states = dict(Allocation.objects.filter(pk__in=[a.pk for a in (old, lately, running, ahead)])
                  .values_list("pk", "archived"))
    assert states == {old.pk: True, lately.pk: False, running.pk: False, ahead.pk: False}
    assert Allocation.objects.filter(pk=old.pk, ends_at=old.ends_at, starts_at=old.starts_at).exists()  # history


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the exclusion constraint is PostgreSQL's")
def test_an_archived_allocation_leaves_the_constraint_and_a_live_one_does_not(world, gpus, settings):
    settings.MERIDIAN_ALLOCATION_ARCHIVE_AFTER = HOUR
    now = timezone.now()
    old = hold(world, gpus[0], now - 5 * HOUR, now - 2 * HOUR)
    with pytest.raises(IntegrityError):  # not yet archived: the same stretch of the past is refused
        hold(world, gpus[0], now - 4 * HOUR, now - 3 * HOUR)
    allocations_archive(now=now)
    # Only history could ever meet it now (nothing is bound to start in the past); written by hand.
    assert hold(world, gpus[0], now - 4 * HOUR, now - 3 * HOUR).archived is False
    assert Allocation.objects.get(pk=old.pk).archived
    bind(world, gpus[1], now, now + HOUR)
    with pytest.raises(CapacityTaken):
        bind(world, gpus[1], now + HOUR / 2, now + 2 * HOUR)


def test_nothing_is_bound_to_start_before_half_the_horizon(world, gpus, settings):
    """
    A plan kept waiting for its commit could otherwise overlap an allocation that was archived
    meanwhile, which the constraint no longer sees: it is refused as stale, and writes nothing.
    """
    settings.MERIDIAN_ALLOCATION_ARCHIVE_AFTER = timedelta(seconds=20)
    now = timezone.now()
    old = hold(world, gpus[0], now - timedelta(seconds=90), now - timedelta(seconds=30))
    assert allocations_archive(now=now) == 1
    stale = make_reservation(world)
    with pytest.raises(CapacityTaken, match="too old"), transaction.atomic():
        allocation_bind(reservation=stale, assignments=[whole(gpus[0])], starts_at=now - timedelta(seconds=40),
                        ends_at=now + HOUR)
    assert not Allocation.objects.filter(reservation=stale).exists()
    assert Allocation.objects.get(pk=old.pk).archived
    # A plan made a moment ago binds (the scheduler's cycle and the fast path take their time).
    assert bind(world, gpus[0], timezone.now() - timedelta(seconds=5), now + HOUR).reservation_id


def test_the_lifecycle_tick_archives_by_the_clock(world, gpus, settings):
    settings.MERIDIAN_ALLOCATION_ARCHIVE_AFTER = HOUR
    now = timezone.now()
    hold(world, gpus[0], now - 5 * HOUR, now - 2 * HOUR)
    running = hold(world, gpus[1], now - HOUR, now + HOUR)
    report = tick(now=now + 3 * HOUR)  # a tick told a later time archives by the clock all the same
    assert report["archived"] == 1
    assert not Allocation.objects.get(pk=running.pk).archived


def test_what_holds_capacity_now_leaves_the_history_out(world, gpus, settings):
    settings.MERIDIAN_ALLOCATION_ARCHIVE_AFTER = HOUR
    now = timezone.now()
    hold(world, gpus[0], now - 5 * HOUR, now - 2 * HOUR)
    running = hold(world, gpus[1], now - HOUR, now + HOUR)
    hold(world, gpus[2], now + HOUR, now + 2 * HOUR)
    allocations_archive(now=now)
    assert list(Allocation.objects.holding(now)) == [running]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the partial index is read by PostgreSQL's planner")
def test_what_holds_capacity_now_is_read_from_the_index_of_live_allocations(world, gpus):
    """
    Capacity, metrics and node checks ask what holds GPUs now: without ``NOT archived`` in the
    query PostgreSQL cannot use the partial index and reads every allocation ever made.
    """
    hold(world, gpus[0], timezone.now() - HOUR, timezone.now() + HOUR)
    sql, params = Allocation.objects.holding(timezone.now()).query.sql_with_params()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a tiny table would be scanned whatever the indexes
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "allocation_live_end_idx" in plan, plan


def test_an_insert_that_waited_past_half_the_horizon_is_refused_after_it(world, gpus, settings):
    """
    An insert that waits on another's clashing row checks the constraint after the wait, when an
    allocation it overlaps may have been archived: freshness is checked again once it is in.
    """
    settings.MERIDIAN_ALLOCATION_ARCHIVE_AFTER = timedelta(seconds=20)
    planned = timezone.now()
    stale = make_reservation(world)
    clock = [planned]
    insert = allocations._insert

    def waited_long(rows):
        insert(rows)
        clock[0] = planned + timedelta(seconds=15)

    with (mock.patch("provisioning.allocations.timezone.now", side_effect=lambda: clock[0]),
          mock.patch.object(allocations, "_insert", waited_long),
          pytest.raises(CapacityTaken, match="too old"), transaction.atomic()):
        allocation_bind(reservation=stale, assignments=[whole(gpus[0])], starts_at=planned, ends_at=planned + HOUR)
    assert not Allocation.objects.filter(reservation=stale).exists()


def test_extending_never_touches_an_archived_allocation(world, gpus, settings):
    """Archived rows are out of the constraint: lengthened, they could overlap what it lets in."""
    settings.MERIDIAN_ALLOCATION_ARCHIVE_AFTER = timedelta(seconds=20)
    now = timezone.now()
    old = hold(world, gpus[0], now - HOUR, now + HOUR)  # archived by hand: as if a clock had run far ahead
    Allocation.objects.filter(pk=old.pk).update(archived=True)
    with pytest.raises(CapacityTaken, match="no capacity to extend"), transaction.atomic():
        allocation_extend(reservation=old.reservation, new_end=now + 2 * HOUR)
    assert Allocation.objects.get(pk=old.pk).ends_at == now + HOUR
