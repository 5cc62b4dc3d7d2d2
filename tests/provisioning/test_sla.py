"""
SLA accounting: a month with known incidents matches a hand calculation; overlapping incidents
count once; thresholds are exact; the API scopes the figures like every other read.

The hand calculation (November 2026, 30 days; price 2.49 per GPU-hour, on demand):

    reservation A: 8 GPUs all month             8 x 43,200 min = 345,600 GPU-min   8 x 720 h x 2.49 = 14,342.40
    reservation B: 2 GPUs, Nov 10 - Nov 20      2 x 14,400 min =  28,800 GPU-min   2 x 240 h x 2.49 =  1,195.20
    reserved                                                     374,400 GPU-min   spend            15,537.60

    I1  A, GPUs g1+g2, Nov 3 10:00-16:00                 2 x 360 = 720
    I2  A, GPU g2, Nov 3 14:00-18:00 (overlaps I1 on g2)  only 16:00-18:00 is new: 1 x 120 = 120   (alone: 240)
    I3  A, 8 GPUs (unnamed), Oct 31 22:00 - Nov 1 08:00  clipped to the month: 8 x 480 = 3,840
    I4  B, 4 GPUs, Nov 19 23:00 - Nov 20 03:00           clipped to B's window, capped at B's 2 GPUs: 2 x 60 = 120
    I5  B, 1 GPU, Nov 12 00:00, resolved (not restored) 01:00                                 1 x 60 = 60
    (an incident naming no reservation, one on another tenant's, and one in October do not count)
    unavailable                                                                               4,860 GPU-min

    availability = 100 x (1 - 4,860 / 374,400) = 98.70192...%  -> below 99 %: credit 10 % x 15,537.60 = 1,553.76
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest
import time_machine
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test.utils import CaptureQueriesContext

from cloud.models import Offering
from provisioning import usage
from provisioning.models import Allocation, Reservation
from provisioning.sla import accounting as sla
from security.models import Incident
from tenants.models import Tenant
from tests.world import h100, unique, vm_offering

URL = "/api/v1/sla/"
NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def at(day: int, hour: int = 0, month: int = 11) -> datetime:
    return datetime(2026, month, day, hour, tzinfo=UTC)


def reservation(tenant, *, gpus: int, start: datetime, end: datetime, state="active", released=None, team=None,
                **extra) -> Reservation:
    """A reservation as it stands, with the allocations it held (one per GPU or slot) unless it never held any."""
    fields = {"units": gpus, "offering": vm_offering()} | extra
    made = Reservation.objects.create(
        tenant=tenant, team=team, name=unique("r"), gpu_model=h100(), gpus=gpus, regions=["us-east-1"],
        duration=end - start, state=state, starts_at=start, ends_at=end, released_at=released, **fields)
    if state not in usage.NEVER_HELD:
        # Spend is what the allocations held; GPUs and nodes of their own (the arithmetic needs no fleet).
        Allocation.objects.bulk_create(
            Allocation(reservation=made, gpu_id=uuid.uuid4(), node_id=uuid.uuid4(), mem_lo=0, mem_hi=81_920,
                       starts_at=start, ends_at=min(end, released or end)) for _ in range(gpus or made.units))
    return made


def incident(r: Reservation | None, *, gpus: int, start: datetime, restored=None, resolved=None, gpu_ids=(),
             tenant=None) -> Incident:
    return Incident.objects.create(
        kind="gpu_failure", summary="test", tenant_id=tenant.pk if tenant else (r.tenant_id if r else None),
        reservation_id=r.pk if r else None, gpus_affected=gpus, gpu_ids=list(gpu_ids), impact_started_at=start,
        restored_at=restored, resolved_at=resolved)


@pytest.fixture
def november(world):
    """The hand-calculated month of the module docstring, for tenant t1 (and noise around it)."""
    t1 = world.t1.tenant
    a = reservation(t1, gpus=8, start=at(20, month=10), end=at(10, month=12))
    b = reservation(t1, gpus=2, start=at(10), end=at(20), state="released", released=at(20))
    for state in ("queued", "cancelled", "pending"):  # never held: nothing reserved, nothing spent
        reservation(t1, gpus=8, start=at(5), end=at(6), state=state)
    g1, g2 = str(uuid.uuid4()), str(uuid.uuid4())
    incidents = {
        "I1": incident(a, gpus=2, gpu_ids=[g1, g2], start=at(3, 10), restored=at(3, 16)),
        "I2": incident(a, gpus=1, gpu_ids=[g2], start=at(3, 14), restored=at(3, 18)),
        "I3": incident(a, gpus=8, start=datetime(2026, 10, 31, 22, tzinfo=UTC), restored=at(1, 8)),
        "I4": incident(b, gpus=4, start=at(19, 23), restored=at(20, 3)),
        "I5": incident(b, gpus=1, start=at(12, 0), resolved=at(12, 1)),
    }
    incident(None, gpus=8, start=at(4), restored=at(5), tenant=t1)  # names no reservation
    incident(a, gpus=8, start=at(25, month=10), restored=at(26, month=10))  # October
    other = reservation(world.t2.tenant, gpus=8, start=at(1), end=at(30))
    incident(other, gpus=8, start=at(2), restored=at(9))  # another tenant's
    return {"a": a, "b": b, "other": other, **incidents}


def get(world, persona, path=URL, **params):
    with time_machine.travel(NOW, tick=False):
        return world.client(persona).get(path, params)


#
# The hand calculation, through the API
#


def test_a_month_with_known_incidents_matches_the_hand_calculation(world, november):
    response = get(world, "t1_owner", month="2026-11")

    assert response.status_code == 200, response.content
    (row,) = response.json()["results"]
    assert row["id"] == str(world.t1.tenant.pk) and row["month"] == "2026-11" and row["complete"] is True
    assert row["reserved_gpu_minutes"] == 374_400
    assert row["unavailable_gpu_minutes"] == 4_860
    assert row["availability_pct"] == 98.7019  # 98.70192..., shown rounded down
    assert (row["target_pct"], row["target_met"]) == (99.0, False)
    assert (row["spend"], row["credit_pct"], row["credit"]) == ("15537.60", "10.00", "1553.76")
    assert {(r["id"], r["reserved_gpu_minutes"], r["unavailable_gpu_minutes"]) for r in row["reservations"]} == {
        (str(november["a"].pk), 345_600, 840 + 3_840), (str(november["b"].pk), 28_800, 120 + 60)}
    alone = {i["id"]: i["gpu_minutes"] for i in row["incidents"]}
    assert alone == {str(november[k].pk): m for k, m in
                     {"I1": 720, "I2": 240, "I3": 3_840, "I4": 120, "I5": 60}.items()}
    assert row["period_start"].startswith("2026-11-01T00:00:00") and row["period_end"].startswith("2026-12-01")
    assert row["whole_tenant"] is True


def test_staff_read_any_tenants_month_and_tenants_only_their_own(world, november):
    listed = get(world, "platform_approver", month="2026-11")
    by_id = {row["id"]: row for row in listed.json()["results"]}
    assert by_id[str(world.t1.tenant.pk)]["unavailable_gpu_minutes"] == 4_860
    # t2's incident: 8 GPUs out for 7 days of a reservation of 29 days.
    assert by_id[str(world.t2.tenant.pk)]["availability_pct"] == pytest.approx(100 * (1 - 7 / 29), abs=1e-4)
    one = get(world, "platform_admin", f"{URL}{world.t1.tenant.pk}/", month="2026-11")
    assert one.status_code == 200 and one.json()["credit"] == "1553.76"
    narrowed = get(world, "platform_admin", month="2026-11", tenant=str(world.t2.tenant.pk))
    assert [row["id"] for row in narrowed.json()["results"]] == [str(world.t2.tenant.pk)]

    assert [row["id"] for row in get(world, "t2_member", month="2026-11").json()["results"]] == [
        str(world.t2.tenant.pk)]
    assert get(world, "t2_member", f"{URL}{world.t1.tenant.pk}/", month="2026-11").status_code == 404


def test_a_member_outside_the_team_sees_only_what_they_can_see(world, november):
    """Figures cover the caller's visible reservations: a viewer outside t1's team misses the team's ones."""
    reservation(world.t1.tenant, gpus=4, start=at(1), end=at(2), team=world.t1.team)
    viewer = get(world, "t1_viewer", month="2026-11").json()["results"][0]
    owner = get(world, "t1_owner", month="2026-11").json()["results"][0]
    assert viewer["whole_tenant"] is False and owner["whole_tenant"] is True
    assert owner["reserved_gpu_minutes"] - viewer["reserved_gpu_minutes"] == 4 * 24 * 60


def test_the_current_month_runs_to_now_and_its_spend_is_the_dashboards(world):
    """Mid-month: figures up to now, and the spend is provisioning.usage's month-to-date spend."""
    now = datetime(2026, 11, 16, 6, 30, tzinfo=UTC)
    reservation(world.t1.tenant, gpus=3, start=at(1), end=at(30))
    discounted = Offering.objects.create(slug=unique("reserved"), name="Reserved", kind="vm", gpu_model=h100(),
                                         gpus_per_unit=1, price_per_gpu_hour="3.10", reserved_discount_pct=20)
    reservation(world.t1.tenant, gpus=1, start=at(10), end=at(11), billing_term="reserved", offering=discounted)
    fractional = Offering.objects.create(slug=unique("slices"), name="Slices", kind="container", gpu_model=h100(),
                                         gpus_per_unit=1, slots_per_gpu=8, price_per_gpu_hour="2.00")
    reservation(world.t1.tenant, gpus=0, units=4, start=at(14), end=at(25), offering=fractional)  # half a GPU
    with time_machine.travel(now, tick=False):
        row = world.client("t1_owner").get(URL).json()["results"][0]
    expected = usage.month_to_date(Reservation.objects.filter(tenant=world.t1.tenant), now)
    assert row["month"] == "2026-11" and row["complete"] is False
    assert row["period_end"].startswith("2026-11-16T06:30")
    assert Decimal(row["spend"]) == expected.amount
    assert row["reserved_gpu_minutes"] == pytest.approx(expected.gpu_hours * 60, abs=0.01)
    assert (row["availability_pct"], row["credit"]) == (100.0, "0.00")


#
# The calculation itself
#


NOV_1, DEC_1, NOV_2 = at(1), at(1, month=12), at(2)


def hold(gpus=1, start=NOV_1, end=DEC_1, price="1.00") -> sla.Hold:
    return sla.Hold(reservation_id=uuid.UUID(int=1), name="r", gpus=Fraction(gpus), start=start, end=end,
                    price=Decimal(price))


def outage(gpus=1, start=NOV_2, minutes=60, ids=()) -> sla.Outage:
    return sla.Outage(incident_id=uuid.uuid4(), reservation_id=uuid.UUID(int=1), kind="k", gpus=gpus,
                      gpu_ids=frozenset(ids), start=start, end=start + timedelta(minutes=minutes))


def compute(holds, outages, credits=sla.DEFAULT_CREDITS):
    table = [(Fraction(str(t)), Decimal(str(c))) for t, c in credits]
    return sla.sla_compute(holds=holds, outages=outages, since=at(1), until=at(1, month=12),
                           target=Fraction(99), credits=table)


def test_exactly_the_threshold_owes_nothing_and_a_minute_less_owes_the_credit():
    """1 GPU all November is 43,200 GPU-minutes: 432 lost is exactly 99 %, 433 is below it."""
    at_99 = compute([hold(price="10.00")], [outage(minutes=432)])
    assert at_99.availability == 99 and at_99.met and at_99.credit_percent == 0 and at_99.credit == 0
    below = compute([hold(price="10.00")], [outage(minutes=433)])
    assert below.availability < 99 and not below.met
    assert (below.spend, below.credit_percent, below.credit) == (Decimal("7200.00"), 10, Decimal("720.00"))


@pytest.mark.parametrize(("lost_minutes", "credit"), [(0, 0), (2_160, 10), (2_161, 25), (4_320, 25), (4_321, 50),
                                                      (43_200, 50)])
def test_the_deepest_row_of_the_credit_table_applies(lost_minutes, credit):
    """Below 99 % 10 %, below 95 % (2,160 min lost is exactly 95 %) 25 %, below 90 % 50 %."""
    figures = compute([hold()], [outage(minutes=lost_minutes)] if lost_minutes else [])
    assert figures.credit_percent == credit


def test_overlapping_incidents_count_each_gpu_once_and_never_more_than_the_hold():
    same_gpu = compute([hold(gpus=4)], [outage(2, minutes=60, ids=["a", "b"]), outage(1, minutes=60, ids=["b"])])
    assert same_gpu.unavailable_gpu_minutes == 120  # b counted once
    different = compute([hold(gpus=4)], [outage(1, minutes=60, ids=["a"]), outage(1, minutes=60, ids=["b"])])
    assert different.unavailable_gpu_minutes == 120
    unnamed = compute([hold(gpus=4)], [outage(3, minutes=60), outage(3, minutes=60)])
    assert unnamed.unavailable_gpu_minutes == 4 * 60  # 6 out, capped at the 4 held
    assert [o.gpu_minutes for o in unnamed.outages] == [180, 180]  # each alone, before merging


def test_nothing_reserved_is_full_availability_and_no_credit():
    figures = compute([], [])
    assert (figures.availability, figures.met, figures.credit, figures.spend) == (100, True, 0, 0)


def test_an_ongoing_incident_counts_until_now():
    figures = sla.sla_compute(holds=[hold()], outages=[outage(minutes=10**6)], since=at(1), until=at(2, 1),
                              target=Fraction(99), credits=[])
    assert figures.unavailable_gpu_minutes == 60  # from Nov 2 00:00 to "now", Nov 2 01:00


def test_the_credit_table_setting_is_checked(settings):
    settings.MERIDIAN_SLA_CREDITS = [[99.0, 10], [95.0, 250]]
    with pytest.raises(ImproperlyConfigured, match="MERIDIAN_SLA_CREDITS"):
        sla.credit_table()
    settings.MERIDIAN_SLA_CREDITS = [[99.5, 5]]
    assert sla.credit_table() == ((Fraction("99.5"), Decimal(5)),)


def test_a_custom_credit_table_and_target_are_applied(world, november, settings):
    settings.MERIDIAN_SLA_TARGET = 98.5
    settings.MERIDIAN_SLA_CREDITS = [[99.9, 5], [98.0, 20]]
    row = get(world, "t1_owner", month="2026-11").json()["results"][0]
    assert (row["target_pct"], row["target_met"], row["credit_pct"], row["credit"]) == (98.5, True, "5.00", "776.88")


#
# Months and cost
#


@pytest.mark.parametrize("month", ["2026-13", "2026-00", "26-11", "2026/11", "2026-1", "november", "1999-12",
                                  "2027-01", "2026-11-01", "２０２６-１１", "2026-11\x00", "x" * 5000])
def test_a_bad_month_is_a_400_naming_it(world, month):
    response = get(world, "t1_owner", month=month)
    assert response.status_code == 400, response.content
    assert {(e["attr"], e["code"]) for e in response.json()["errors"]} & {("month", "invalid"), ("month", "blank"),
                                                                         ("month", "max_length"),
                                                                         ("month", "null_characters_not_allowed")}


def test_no_month_or_an_empty_one_is_this_month(world):
    for params in ({}, {"month": ""}):
        assert get(world, "t1_owner", **params).json()["results"][0]["month"] == "2026-12"


def test_a_month_before_any_reservation_is_empty_not_an_error(world, november):
    row = get(world, "t1_owner", month="2025-01").json()["results"][0]
    assert (row["reserved_gpu_minutes"], row["availability_pct"], row["incidents"]) == (0, 100.0, [])


def test_listing_every_tenant_costs_the_same_queries_however_many_rows(world, november):
    """Staff list of all tenants: reservations and incidents are read in one query each."""
    client = world.client("platform_admin")

    def count():
        with time_machine.travel(NOW, tick=False):
            client.get(URL, {"month": "2026-11"})  # new tenants: the token's principal is read again here
        with time_machine.travel(NOW, tick=False), CaptureQueriesContext(connection) as queries:
            response = client.get(URL, {"month": "2026-11"})
        assert response.status_code == 200
        return len(queries)

    with time_machine.travel(NOW, tick=False):
        client.get(URL)  # the token's last_used_at write happens here
    few = count()
    for i in range(6):
        tenant = Tenant.objects.create(name=f"Extra {i}", slug=unique("extra"))
        r = reservation(tenant, gpus=2, start=at(1), end=at(20))
        incident(r, gpus=1, start=at(3), restored=at(4))
        incident(r, gpus=2, start=at(5), restored=at(6))
    assert count() == few
