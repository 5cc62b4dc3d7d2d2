"""
Fair share reads each team's decayed usage from its allocations: GPU-hours used so far, each
allocation's halved per half-life of age, a slot counting as its share of the GPU's memory.
PostgreSQL sums it in one grouped query; it must give what the row-by-row sum gives. The
scheduler loop rereads it less often than the rest of a record.
"""

from datetime import timedelta
from unittest import mock

import pytest
from django.db import connection
from django.utils import timezone

from cloud.models import GPU
from provisioning.models import Allocation
from provisioning.scheduling import team_record
from provisioning.scheduling.priority import Weights
from provisioning.scheduling.team_record import TeamRecords, decayed_usage_many
from tests.provisioning.factories import make_reservation
from tests.world import small_fleet

DAY = 24 * 3600.0
WEIGHTS = Weights(usage_half_life_s=7 * DAY)


@pytest.fixture
def gpus(world):
    small_fleet(4)
    return list(GPU.objects.order_by("node__hostname", "index")[:4])


def allocate(world, gpu, *, start, end, side="t1", team=False, mem=None):
    owner = world.side(side)
    reservation = make_reservation(world, side=side, state="released", team=owner.team if team else None)
    lo, hi = mem or (0, gpu.memory_mib)
    Allocation.objects.create(reservation=reservation, gpu=gpu, node=gpu.node, mem_lo=lo, mem_hi=hi,
                              starts_at=start, ends_at=end)
    return reservation


def test_usage_is_gpu_hours_halved_per_half_life_of_age(world, gpus):
    now = timezone.now()
    week_ago = now - timedelta(days=7)
    # Two whole GPUs for 2 h that ended a half-life ago: 4 GPU-hours, counted half.
    for gpu in gpus[:2]:
        allocate(world, gpu, start=week_ago - timedelta(hours=2), end=week_ago)
    # Half of a GPU's memory for the last 3 h, still running: 1.5 GPU-hours, not decayed.
    allocate(world, gpus[2], start=now - timedelta(hours=3), end=now + timedelta(hours=5),
             mem=(0, gpus[2].memory_mib // 2))
    # The team's work is its own; another tenant's counts for it alone.
    allocate(world, gpus[3], start=now - timedelta(hours=1), end=now, team=True)
    allocate(world, gpus[3], start=now - timedelta(hours=4), end=now - timedelta(hours=2), side="t2")
    # Ended more than four half-lives ago: no longer counted.
    allocate(world, gpus[0], start=now - timedelta(days=40), end=now - timedelta(days=30))
    t1, t2 = world.t1.tenant.pk, world.t2.tenant.pk
    owners = {(t1, None), (t1, world.t1.team.pk), (t2, None), (t2, world.t2.team.pk)}

    usage = decayed_usage_many(owners, now=now, weights=WEIGHTS)

    assert usage[(t1, None)] == pytest.approx(4 * 0.5 + 1.5, rel=1e-6)
    assert usage[(t1, world.t1.team.pk)] == pytest.approx(1.0, rel=1e-6)
    assert usage[(t2, None)] == pytest.approx(2.0 * 0.5 ** (2 / (7 * 24)), rel=1e-6)  # ended 2 h ago
    assert usage[(t2, world.t2.team.pk)] == 0.0


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the grouped sum is PostgreSQL's")
def test_the_grouped_sum_gives_the_row_by_row_sum(world, gpus):
    now = timezone.now()
    for i, gpu in enumerate(gpus):
        for day in (0, 3, 9, 20):
            start = now - timedelta(days=day, hours=i + 2)
            allocate(world, gpu, start=start, end=start + timedelta(hours=1 + i), team=bool(i % 2),
                     side="t1" if day % 2 else "t2", mem=(0, gpu.memory_mib // (1 + i % 3)))
    held = Allocation.objects.filter(starts_at__lt=now)

    in_sql = dict(team_record._decayed_usage_postgresql(held, now, WEIGHTS.usage_half_life_s))
    row_by_row = dict(team_record._decayed_usage_python(held, now, WEIGHTS.usage_half_life_s))

    assert in_sql.keys() == row_by_row.keys() and len(in_sql) == 4
    for owner, total in row_by_row.items():
        assert in_sql[owner] == pytest.approx(total, rel=1e-9)


def test_the_loop_rereads_usage_only_after_its_own_period():
    now = timezone.now()
    a, b = ("tenant-a", None, "model"), ("tenant-b", "team", "model")
    records = TeamRecords(refresh_s=0, usage_refresh_s=3600)
    with mock.patch.object(team_record, "decayed_usage_many", side_effect=lambda owners, **_: dict.fromkeys(owners, 1.0)
                           ) as usage, mock.patch.object(team_record, "team_inputs_many",
                                                         side_effect=lambda keys, **kw: {k: kw["usage"] for k in keys}
                                                         ) as read:
        records.get({a}, now, WEIGHTS)
        records.get({a}, now, WEIGHTS)  # the record is read again (refresh 0), its usage is not
        assert read.call_count == 2 and usage.call_count == 1
        assert read.call_args.kwargs["usage"] == {("tenant-a", None): 1.0}
        records.get({a, b}, now, WEIGHTS)  # an owner new to the queue: its usage alone is read
        assert usage.call_count == 2 and usage.call_args.args[0] == {("tenant-b", "team")}
        records.usage_refresh_s = 0
        records.get({a, b}, now, WEIGHTS)
        assert usage.call_count == 3 and usage.call_args.args[0] == {("tenant-a", None), ("tenant-b", "team")}
