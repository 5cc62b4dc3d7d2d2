"""
The capacity change feed (provisioning.scheduling.change_feed): the database's triggers write a row for
every change the scheduler's kept index follows, in the changing transaction, and a reader misses
none of them whatever order transactions commit in; what changes nothing the index holds (an
allocation archived, a node's telemetry) writes nothing.
"""

from datetime import timedelta
from unittest import mock

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from cloud.models import GPU, Node
from core.db import copy_rows
from provisioning.allocations import INSERTED_COLUMNS
from provisioning.choices import OperationKind, OperationState
from provisioning.feed_models import CapacityChange
from provisioning.models import Allocation, Operation, Reservation
from provisioning.scheduling import change_feed
from provisioning.scheduling.change_feed import ChangeFeed
from provisioning.scheduling.fleet_shape import FleetShape
from provisioning.scheduling.kept_capacity import KeptCapacity
from provisioning.scheduling.scheduler import LoopMemory, run_cycle
from tests.provisioning.factories import make_reservation, offering
from tests.provisioning.test_kept_capacity import fresh_index, index_view
from tests.provisioning.test_loop_memory import hold, sellable_nodes
from tests.world import small_fleet

pytestmark = pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the feed's triggers are PostgreSQL's")

ALLOCATIONS, RIGHTS, SHAPE = CapacityChange.ALLOCATIONS, CapacityChange.RIGHTS, CapacityChange.SHAPE


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(8)


def written(action) -> set:
    """The (kind, node) rows ``action`` made the triggers write."""
    last = CapacityChange.objects.order_by("-id").values_list("id", flat=True).first() or 0
    action()
    return set(CapacityChange.objects.filter(id__gt=last).values_list("kind", "node_id"))


def test_every_change_the_index_follows_writes_its_node_and_nothing_else_does(world, fleet):
    now = timezone.now()
    a, b, c = sellable_nodes()[:3]
    holder = None

    def place():
        nonlocal holder
        holder = hold(world, a.gpus.all()[:2], start=now, end=now + timedelta(hours=1))

    assert written(place) == {(ALLOCATIONS, a.pk)}
    assert written(lambda: Allocation.objects.filter(reservation=holder).update(
        ends_at=now + timedelta(minutes=5))) == {(ALLOCATIONS, a.pk)}
    assert written(lambda: Allocation.objects.filter(reservation=holder).update(archived=True)) == set()
    assert written(lambda: Allocation.objects.filter(reservation=holder).delete()) == {(ALLOCATIONS, a.pk)}
    assert written(lambda: Node.objects.filter(pk=b.pk).update(state="maintenance")) == {(RIGHTS, b.pk)}
    assert written(lambda: Node.objects.filter(pk=b.pk).update(cpu_cores=b.cpu_cores + 1)) == set()
    assert written(lambda: GPU.objects.filter(pk=c.gpus.first().pk).update(health="failed")) == {(RIGHTS, c.pk)}
    attest = []
    assert written(lambda: attest.append(Operation.objects.create(
        node=c, kind=OperationKind.ATTEST, state=OperationState.RUNNING))) == {(RIGHTS, c.pk)}
    assert written(lambda: Operation.objects.filter(pk=attest[0].pk).update(
        state=OperationState.SUCCEEDED)) == {(RIGHTS, c.pk)}
    assert written(lambda: Node.objects.filter(pk=a.pk).update(pool="shared" if a.pool == "bare_metal"
                                                                 else "bare_metal")) == {(SHAPE, a.pk)}
    assert written(lambda: GPU.objects.filter(pk=b.gpus.first().pk).update(numa_node=7)) == {(SHAPE, None)}
    assert written(lambda: GPU.objects.filter(pk=b.gpus.last().pk).delete()) == {(SHAPE, None)}


def test_a_batch_copied_in_writes_each_node_once(world, fleet):
    now = timezone.now()
    nodes = sellable_nodes()[:2]
    holder = hold(world, [], start=now, end=now + timedelta(hours=1))
    rows = [(holder.pk, g.pk, n.pk, 0, g.memory_mib, now, now + timedelta(hours=1), "")
            for n in nodes for g in n.gpus.all()]
    before = CapacityChange.objects.count()
    assert written(lambda: copy_rows(Allocation, INSERTED_COLUMNS, rows)) == {(ALLOCATIONS, n.pk) for n in nodes}
    assert CapacityChange.objects.count() - before == 2


@pytest.mark.django_db(transaction=True)
def test_a_transaction_that_commits_after_the_readers_snapshot_is_read_next_time(world, fleet):
    """A writer holding an earlier transaction id commits after the reader looked: the next read has it."""
    now = timezone.now()
    node = sellable_nodes()[0]
    holder = hold(world, [], start=now, end=now + timedelta(hours=1))
    feed = ChangeFeed()
    with transaction.atomic():
        feed.read(now)
    settings = connection.settings_dict
    with psycopg.connect(host=settings["HOST"], port=settings["PORT"] or 5432, user=settings["USER"],
                         dbname=settings["NAME"], autocommit=False) as writer:
        gpu = node.gpus.first()
        writer.execute("INSERT INTO provisioning_allocation (reservation_id, gpu_id, node_id, mem_lo, mem_hi, "
                       "starts_at, ends_at, share_class) VALUES (%s, %s, %s, 0, 1024, %s, %s, '')",
                       [holder.pk, gpu.pk, node.pk, now, now + timedelta(hours=1)])
        with transaction.atomic():
            assert node.pk not in feed.read(now).allocations  # not committed yet: not visible
        later = CapacityChange.objects.create(xid=0, kind=ALLOCATIONS, node_id=sellable_nodes()[1].pk)
        writer.commit()  # after a later transaction's row was committed and could have been read
    with transaction.atomic():
        changes = feed.read(now)
    assert node.pk in changes.allocations
    assert later.node_id not in changes.allocations  # xid 0 is older than any snapshot: never asked for
    with transaction.atomic():
        assert feed.read(now).allocations == set()  # seen once, not again


def test_a_reader_silent_too_long_builds_afresh(world, fleet):
    now = timezone.now()
    clock = [1000.0]
    with mock.patch.object(change_feed.time, "monotonic", lambda: clock[0]):
        kept = KeptCapacity(FleetShape(refresh_s=3600), rebuild_s=3600, rebuild_share=1)
        kept.for_cycle(now)
        hold(world, sellable_nodes()[0].gpus.all()[:1], start=now, end=now + timedelta(hours=1))
        clock[0] += change_feed.STALE_S / 2
        kept.for_cycle(now)
        assert (kept.rebuilds, kept.caught_up) == (1, 1)
        clock[0] += change_feed.STALE_S + 1  # rows it never read may have been pruned by another reader
        capacity = kept.for_cycle(now)
        assert kept.rebuilds == 2
        assert index_view(capacity) == index_view(fresh_index(now))


def test_rows_read_long_ago_are_pruned(world, fleet):
    clock = [1000.0]
    with mock.patch.object(change_feed.time, "monotonic", lambda: clock[0]):
        feed = ChangeFeed()
        old = CapacityChange.objects.create(xid=1, kind=ALLOCATIONS, node_id=sellable_nodes()[0].pk)
        future = CapacityChange.objects.create(xid=2**62, kind=ALLOCATIONS, node_id=sellable_nodes()[0].pk)
        feed.read(timezone.now())
        clock[0] += change_feed.RETAIN_S / 2
        assert feed.prune() == 0  # nothing read long enough ago
        clock[0] += change_feed.RETAIN_S
        feed.read(timezone.now())
        assert feed.prune() >= 1
        assert not CapacityChange.objects.filter(pk=old.pk).exists()
        assert CapacityChange.objects.filter(pk=future.pk).exists()  # not older than what was read


def test_what_a_cycle_committed_as_planned_is_not_read_again(world, fleet):
    """The loop's own placements are in its index already: neither the plan's nodes nor its feed rows are read."""
    on_demand = [make_reservation(world, state="queued", offering=offering("vm", 2)) for _ in range(3)]
    memory = LoopMemory(record_refresh_s=3600, shape_refresh_s=3600, index_rebuild_s=3600)
    assert run_cycle(memory=memory).placed == 3
    kept, later = memory.capacity, timezone.now() + timedelta(seconds=1)
    read, built = kept.caught_up, kept.rebuilds
    assert index_view(kept.for_cycle(later)) == index_view(fresh_index(later))
    assert (kept.caught_up, kept.rebuilds) == (read, built)

    spot = make_reservation(world, state="queued", offering=offering("vm", 1), billing_term="spot")
    assert run_cycle(memory=memory).placed == 1
    capacity = kept.for_cycle(later + timedelta(seconds=1))
    assert (kept.caught_up, kept.rebuilds) == (read + 1, built)  # spot work is a victim once read from the database
    assert spot.pk in capacity.victim_priority and on_demand[0].pk not in capacity.victim_priority
