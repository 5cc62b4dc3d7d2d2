"""
No two allocations of the same GPU memory ever overlap in time: the database decides, under
real concurrency (PostgreSQL's exclusion constraint) and in the embedded default's check.
"""

import random
import threading
from datetime import timedelta
from unittest import mock

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from cloud.models import GPU
from provisioning.allocations import CapacityTaken, allocation_bind, allocation_end
from provisioning.models import Allocation, Reservation
from provisioning.scheduling.plan_types import Assignment
from tests.provisioning.factories import make_reservation
from tests.world import small_fleet

WHOLE = 81920

OVERLAPPING_PAIRS = """
    SELECT count(*) FROM provisioning_allocation a JOIN provisioning_allocation b
      ON a.gpu_id = b.gpu_id AND a.id < b.id
     AND a.mem_lo < b.mem_hi AND b.mem_lo < a.mem_hi
     AND a.starts_at < b.ends_at AND b.starts_at < a.ends_at
"""


def whole(gpu) -> Assignment:
    return Assignment(node_id=gpu.node_id, gpu_id=gpu.pk, mem_lo=0, mem_hi=gpu.memory_mib)


@pytest.fixture
def gpus(world):
    small_fleet(4)
    node = GPU.objects.filter(node__pool="bare_metal", node__is_spare=False).first().node
    return list(GPU.objects.filter(node=node).order_by("index"))


def test_overlapping_window_on_the_same_gpu_is_refused(world, gpus):
    """A second hold on a GPU for an overlapping window is CapacityTaken; back-to-back is fine."""
    now = timezone.now()
    first, second, third = (make_reservation(world) for _ in range(3))
    with transaction.atomic():
        allocation_bind(reservation=first, assignments=[whole(gpus[0])], starts_at=now,
                        ends_at=now + timedelta(hours=2))
    with pytest.raises(CapacityTaken), transaction.atomic():
        allocation_bind(reservation=second, assignments=[whole(gpus[0])], starts_at=now + timedelta(hours=1),
                        ends_at=now + timedelta(hours=3))
    with transaction.atomic():
        allocation_bind(reservation=third, assignments=[whole(gpus[0])], starts_at=now + timedelta(hours=2),
                        ends_at=now + timedelta(hours=3))
    assert Allocation.objects.filter(gpu=gpus[0]).count() == 2


def test_slots_of_one_gpu_coexist_but_never_overlap_in_memory(world, gpus):
    """Two slots side by side share a GPU; a slot over a whole-GPU hold is refused."""
    now, end = timezone.now(), timezone.now() + timedelta(hours=1)
    a, b, c = (make_reservation(world) for _ in range(3))
    gpu = gpus[1]
    with transaction.atomic():
        allocation_bind(reservation=a, assignments=[Assignment(gpu.node_id, gpu.pk, 0, 10240)], starts_at=now,
                        ends_at=end)
        allocation_bind(reservation=b, assignments=[Assignment(gpu.node_id, gpu.pk, 10240, 20480)], starts_at=now,
                        ends_at=end)
    with pytest.raises(CapacityTaken), transaction.atomic():
        allocation_bind(reservation=c, assignments=[whole(gpu)], starts_at=now, ends_at=end)


@pytest.mark.parametrize("state", ["maintenance", "quarantined", "faulty", "validating", "suspect"])
def test_nodes_not_available_are_never_allocated(world, gpus, state):
    """A node held, failed or unproven takes no allocation."""
    gpus[0].node.__class__.objects.filter(pk=gpus[0].node_id).update(state=state)
    with pytest.raises(CapacityTaken), transaction.atomic():
        allocation_bind(reservation=make_reservation(world), assignments=[whole(gpus[0])],
                        starts_at=timezone.now(), ends_at=timezone.now() + timedelta(hours=1))


def test_spares_are_never_allocated(world):
    """Spares are kept for replacements; binding one is refused."""
    small_fleet(8)
    spare = GPU.objects.filter(node__is_spare=True).first()
    with pytest.raises(CapacityTaken), transaction.atomic():
        allocation_bind(reservation=make_reservation(world), assignments=[whole(spare)],
                        starts_at=timezone.now(), ends_at=timezone.now() + timedelta(hours=1))


def test_embedded_check_refuses_an_overlap_before_inserting(world, gpus):
    """On SQLite the overlap is found by the check inside the write transaction, not by a constraint."""
    now, end = timezone.now(), timezone.now() + timedelta(hours=1)
    with transaction.atomic():
        allocation_bind(reservation=make_reservation(world), assignments=[whole(gpus[2])], starts_at=now, ends_at=end)
    with (mock.patch.object(connection, "vendor", "sqlite"),
          mock.patch.object(Allocation.objects, "bulk_create", side_effect=AssertionError("reached the insert")),
          pytest.raises(CapacityTaken), transaction.atomic()):
        allocation_bind(reservation=make_reservation(world), assignments=[whole(gpus[2])], starts_at=now, ends_at=end)


def test_ending_early_frees_the_rest_of_the_window(world, gpus):
    """After release at t, the GPU is free from t on; allocations not yet begun disappear."""
    now = timezone.now()
    held = make_reservation(world)
    with transaction.atomic():
        allocation_bind(reservation=held, assignments=[whole(gpus[3])], starts_at=now - timedelta(seconds=5),
                        ends_at=now + timedelta(hours=5))
        allocation_end(reservation=held, at=now)
        allocation_bind(reservation=make_reservation(world), assignments=[whole(gpus[3])], starts_at=now,
                        ends_at=now + timedelta(hours=1))
    assert Allocation.objects.get(reservation=held).ends_at == now


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_200_racing_requests_for_8_gpus_allocate_exactly_8(world):
    """200 threads (40 at a time) race for the 8 GPUs of one node: 8 win, the rest are refused cleanly."""
    small_fleet(4)
    node = GPU.objects.filter(node__pool="bare_metal", node__is_spare=False).first().node
    gpus = list(GPU.objects.filter(node=node))
    reservations = [make_reservation(world).pk for _ in range(200)]
    now = timezone.now()
    start, end = now + timedelta(minutes=5), now + timedelta(hours=2)
    outcomes, errors = [], []
    gate = threading.Semaphore(40)  # PostgreSQL allows 100 connections

    def claim(reservation_id):
        with gate:
            try:
                reservation = Reservation.objects.get(pk=reservation_id)
                for gpu in random.sample(gpus, len(gpus)):
                    try:
                        with transaction.atomic():
                            allocation_bind(reservation=reservation, assignments=[whole(gpu)], starts_at=start,
                                            ends_at=end)
                        outcomes.append("won")
                        return
                    except CapacityTaken:
                        continue
                outcomes.append("refused")
            except Exception as exc:  # noqa: BLE001 -- any other outcome fails the test below
                errors.append(repr(exc))
            finally:
                connections.close_all()

    threads = [threading.Thread(target=claim, args=(r,)) for r in reservations]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert outcomes.count("won") == 8
    assert outcomes.count("refused") == 192
    with connection.cursor() as cursor:
        cursor.execute(OVERLAPPING_PAIRS)
        assert cursor.fetchone()[0] == 0


def test_the_orm_keeps_what_the_dropped_foreign_keys_kept(world, gpus):
    """
    The allocation table has no foreign-key constraints (they cost as much as the insert): a GPU
    or node that holds allocations still cannot be deleted, and a deleted reservation takes its
    allocations with it.
    """
    from django.db.models import ProtectedError

    now = timezone.now()
    reservation = make_reservation(world)
    with transaction.atomic():
        allocation_bind(reservation=reservation, assignments=[whole(gpus[0])], starts_at=now,
                        ends_at=now + timedelta(hours=1))
    with pytest.raises(ProtectedError):
        gpus[0].delete()
    with pytest.raises(ProtectedError):
        gpus[0].node.delete()
    reservation.delete()
    assert not Allocation.objects.filter(gpu=gpus[0]).exists()
    assert GPU.objects.filter(pk=gpus[0].pk).exists()
