"""
The usage ledger (billing.meter): every allocation-second of a closed window recorded once and
rated at the price of its time; the meter run twice, killed mid-run or racing another writes
nothing twice; an allocation found to have ended earlier is corrected by a new record, never an
edit; storage samples are rated at their class's price; the reconcile check proves it all.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from billing import invoices, meter
from billing.meter import hour_floor, meter_recheck, meter_run
from billing.models import MeterState, Price, UsageRecord, UsageRollup
from billing.reconcile import reconcile
from cloud.models import GPU, Region
from provisioning.models import AddressAssignment, Allocation, Instance, Reservation
from storage.catalogue import default_storage_classes
from storage.models import StorageUsageSample
from tests.world import fleet_node, h100, small_fleet, unique, vm_offering

pytestmark = pytest.mark.django_db


@pytest.fixture
def now():
    return hour_floor(timezone.now())


def ran(world, *, start, end, gpus=2, term="on_demand") -> Reservation:
    """A reservation of t1 that held ``gpus`` GPUs of one node over ``[start, end)``."""
    if not GPU.objects.exists():
        small_fleet(4)
    reservation = Reservation.objects.create(
        tenant=world.t1.tenant, team=world.t1.team, name=unique("ran"), offering=vm_offering(), gpu_model=h100(),
        units=gpus, gpus=gpus, regions=["us-east-1"], duration=end - start, state="released", billing_term=term,
        region=Region.objects.get(slug="us-east-1"), starts_at=start, ends_at=end)
    taken = set(Allocation.objects.values_list("gpu_id", flat=True))
    for gpu in GPU.objects.filter(node__pool="shared").exclude(pk__in=taken).select_related("node")[:gpus]:
        Allocation.objects.create(reservation=reservation, gpu=gpu, node=gpu.node, mem_lo=0, mem_hi=80,
                                  starts_at=start, ends_at=end)
    return reservation


def test_every_allocation_second_of_closed_windows_is_recorded_once_at_its_price(world, now):
    start, end = now - timedelta(hours=3, minutes=30), now - timedelta(minutes=50)
    reservation = ran(world, start=start, end=end)
    list_price = reservation.offering.price_per_gpu_hour
    done = meter_run(now=now)
    assert done["windows"] == 4  # 3:30 ago to the hour now: four windows, the last one closed
    records = UsageRecord.objects.filter(reservation=reservation)
    held = Decimal((end - start).total_seconds()) * 2
    assert sum(r.quantity for r in records) == held and records.count() == 8  # 2 GPUs x 4 windows
    assert {r.unit_price for r in records} == {list_price}
    assert sum(r.amount for r in records) == (held * list_price / 3600).quantize(Decimal("0.000001"))
    day = UsageRollup.objects.filter(period="day").values_list("amount", flat=True)
    assert sum(day) == sum(r.amount for r in records)

    assert meter_run(now=now)["windows"] == 0  # nothing new closed
    MeterState.objects.update(metered_until=None)  # the mark lost: every window again, nothing twice
    meter_run(now=now)
    assert UsageRecord.objects.count() == 8
    assert reconcile(now - timedelta(days=1), now) == []


def test_a_meter_killed_mid_run_loses_nothing_and_the_next_run_writes_it_once(world, now, monkeypatch):
    ran(world, start=now - timedelta(hours=3), end=now)
    real, calls = meter.rollup_hours, []

    def killed_in_the_second_window(hours):
        calls.append(hours)
        if len(calls) == 2:
            raise SystemExit("worker killed")
        real(hours)

    monkeypatch.setattr(meter, "rollup_hours", killed_in_the_second_window)
    with pytest.raises(SystemExit):
        meter_run(now=now)
    monkeypatch.undo()
    assert MeterState.objects.get().metered_until == now - timedelta(hours=2)  # one window written
    assert UsageRecord.objects.count() == 2
    meter_run(now=now)
    assert UsageRecord.objects.count() == 6 and reconcile(now - timedelta(days=1), now) == []


@pytest.mark.django_db(transaction=True)
def test_two_meters_at_once_write_every_record_once(world, now):
    from django.db import connections

    ran(world, start=now - timedelta(hours=6), end=now)
    errors = []

    def one():
        try:
            meter_run(now=now)
        except Exception as exc:  # noqa: BLE001 -- any failure fails the test
            errors.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert UsageRecord.objects.count() == 12 and reconcile(now - timedelta(days=1), now) == []


def test_a_price_applies_from_its_start_and_a_later_one_reprices_nothing(world, now):
    reservation = ran(world, start=now - timedelta(hours=2), end=now)
    Price.objects.create(offering=reservation.offering, term="on_demand", per_gpu_hour=Decimal("1.50"),
                         effective_from=now - timedelta(hours=1))
    meter_run(now=now)
    by_window = {r.starts_at: r.unit_price for r in UsageRecord.objects.all()}
    assert by_window == {now - timedelta(hours=2): reservation.offering.price_per_gpu_hour,
                         now - timedelta(hours=1): Decimal("1.50")}
    Price.objects.create(offering=reservation.offering, term="on_demand", per_gpu_hour=Decimal("9.99"),
                         effective_from=now - timedelta(minutes=30))  # (staff cannot: the API refuses the past)
    meter_run(now=now + timedelta(hours=1))
    assert {r.starts_at: r.unit_price for r in UsageRecord.objects.filter(starts_at__lt=now)} == by_window


def test_an_allocation_found_to_have_ended_earlier_is_corrected_by_a_new_record(world, now):
    reservation = ran(world, start=now - timedelta(hours=3), end=now, gpus=1)
    meter_run(now=now)
    original = {r.pk: (r.quantity, r.amount) for r in UsageRecord.objects.all()}
    Allocation.objects.filter(reservation=reservation).update(ends_at=now - timedelta(hours=1, minutes=30))
    assert meter_recheck(now=now) == 2  # half of one window, all of the last
    assert meter_recheck(now=now) == 0  # corrected already
    assert {r.pk: (r.quantity, r.amount) for r in UsageRecord.objects.filter(pk__in=original)} == original
    corrections = UsageRecord.objects.filter(adjusts__isnull=False)
    assert sorted(r.quantity for r in corrections) == [Decimal(-3600), Decimal(-1800)]
    assert sum(UsageRecord.objects.values_list("quantity", flat=True)) == Decimal(5400)
    assert reconcile(now - timedelta(days=1), now) == []
    call_command("billing_reconcile", since=(now - timedelta(days=1)).isoformat(), until=now.isoformat())


def test_storage_samples_are_rated_at_their_class_price(world, now):
    small_fleet(4)
    shared = next(c for c in default_storage_classes(Region.objects.get(slug="us-east-1")) if c.kind == "shared_fs")
    StorageUsageSample.objects.create(tenant=world.t1.tenant, team=world.t1.team, storage_class=shared, gib=730,
                                      seconds=3600, at=now - timedelta(minutes=10))
    meter_run(now=now)
    record = UsageRecord.objects.get(resource="storage")
    assert record.quantity == 730 * 3600 and record.amount == shared.price_per_gib_month.quantize(Decimal("0.000001"))
    # Taken 10 minutes into its window, it covers 50 minutes of the hour before: both hours are rolled up.
    assert sum(UsageRollup.objects.filter(period="hour", resource="storage").values_list("amount", flat=True)) == \
        record.amount
    assert sum(UsageRollup.objects.filter(period="day", resource="storage").values_list("amount", flat=True)) == \
        record.amount


def test_public_addresses_are_billed_for_each_second_held_and_private_ones_not(world, now):
    reservation = ran(world, start=now - timedelta(hours=2), end=now, gpus=1)
    instance = Instance.objects.create(tenant=world.t1.tenant, reservation=reservation, node=fleet_node(), index=0,
                                       kind="vm", state="active", name=unique("vm"))
    for kind, address in (("public", "198.18.0.7"), ("private", "10.64.0.7")):
        AddressAssignment.objects.create(tenant=world.t1.tenant, instance=instance, region="us-east-1", kind=kind,
                                         address=address)
    AddressAssignment.objects.update(assigned_at=now - timedelta(hours=1, minutes=30),
                                     released_at=now - timedelta(minutes=15))
    meter_run(now=now)
    records = UsageRecord.objects.filter(resource="address").order_by("starts_at")
    assert [r.quantity for r in records] == [1800, 2700]  # 30 minutes of one window, 45 of the next
    assert {r.unit_price for r in records} == {Decimal("0.005")} and records[0].reservation_id == reservation.pk
    assert sum(r.amount for r in records) == Decimal("0.006250")  # 1.25 address-hours at 0.005
    lines = invoices.draft(world.t1.tenant.pk, records[1].starts_at, now).lines
    assert any(line.description == "Public IPv4 addresses" and line.unit == "address-hour" for line in lines)
    meter_run(now=now + timedelta(hours=1))
    assert UsageRecord.objects.filter(resource="address").count() == 2  # released: nothing more


def test_the_reconcile_command_names_a_second_missing_from_the_ledger(world, now):
    reservation = ran(world, start=now - timedelta(hours=2), end=now, gpus=1)
    meter_run(now=now)
    UsageRecord.objects.filter(reservation=reservation).order_by("starts_at").first().delete()  # lost by hand
    problems = reconcile(now - timedelta(days=1), now)
    assert problems[0].endswith("held 3600.000000 GPU-seconds, recorded 0")
    # In the hour after midnight the window is whole days, and the rollups are checked against it too.
    assert [p.startswith("the daily rollups") for p in problems[1:]] == ([True] if now.hour == 0 else [])

    with pytest.raises(CommandError, match="difference"):
        call_command("billing_reconcile", since=(now - timedelta(days=1)).isoformat(), until=now.isoformat())
