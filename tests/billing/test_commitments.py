"""
Commitments (billing.commitments): N GPUs of an offering in a region for 1-36 months at the
reserved price of the day, held by a committed reservation the scheduler places beyond the usual
30-day cap; billed at the committed rate for every hour it holds the GPUs, overage at on-demand;
binding once started; bad input refused with nothing written.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import invoices
from billing.choices import COMMITTED
from billing.commitments import add_months
from billing.meter import hour_floor, meter_run
from billing.models import Commitment, Price, UsageRecord
from cloud.models import GPU, Region
from provisioning.models import Allocation, Reservation
from provisioning.scheduling.scheduler import run_cycle
from security.models import AuditEvent
from tests.billing.test_meter import ran
from tests.world import small_fleet, vm_offering

pytestmark = pytest.mark.django_db
URL = "/api/v1/commitments/"


@pytest.fixture
def fleet(world):
    small_fleet(4)
    return GPU.objects.filter(model__slug="h100-80gb-sxm", node__pool="shared", node__is_spare=False).count()


def body(**extra):
    return {"name": "training-2027", "offering": vm_offering().slug, "region": "us-east-1", "gpus": 2, "months": 3,
            **extra}


def code(answer) -> str:
    return answer.json()["errors"][0]["code"]


def test_a_tenant_admin_commits_and_the_scheduler_holds_the_gpus_for_the_whole_term(world, fleet):
    Price.objects.create(offering=vm_offering(), term="reserved", per_gpu_hour="1.750000",
                         effective_from=timezone.now() - timedelta(days=1))
    answer = world.client("t1_owner").post(URL, body(months=12), format="json")
    assert answer.status_code == 201, answer.content
    made = answer.json()
    assert made["rate"] == "1.750000" and made["gpus"] == 2 and made["months"] == 12
    assert made["reservation_state"] == "scheduled"  # placed at once: the fleet is free
    reservation = Reservation.objects.get(pk=made["reservation"])
    assert reservation.committed and reservation.billing_term == "reserved"
    assert reservation.duration > timedelta(days=360)  # far beyond the 30-day cap on other reservations
    held = Allocation.objects.filter(reservation=reservation)
    assert held.count() == 2 and all(a.ends_at - a.starts_at > timedelta(days=360) for a in held)
    hours = Decimal((reservation.duration).total_seconds()) / 3600
    assert made["term_cost"] == f"{2 * hours * Decimal('1.75'):.2f}"
    assert AuditEvent.objects.filter(action="commitment.create").count() == 1
    # the tenant's other users read it; the other tenant does not even learn it exists
    assert world.client("t1_viewer").get(f"{URL}{made['id']}/").status_code == 200
    assert world.client("t2_owner").get(f"{URL}{made['id']}/").status_code == 404


@pytest.mark.parametrize(("change", "field", "error"), [
    ({"starts_at": "2020-01-01T00:00:00Z"}, "starts_at", "start_in_past"),
    ({"months": 0}, "months", "min_value"),
    ({"months": 37}, "months", "max_value"),
    ({"gpus": 0}, "gpus", "min_value"),
    ({"gpus": "2"}, "gpus", "invalid"),
    ({"gpus": 2.5}, "gpus", "invalid"),
    ({"gpus": 10_000}, "gpus", "exceeds_fleet"),
    ({"offering": "no-such-offering"}, "offering", "does_not_exist"),
    ({"region": "mars-1"}, "region", "does_not_exist"),
    ({"name": ""}, "name", "blank"),
])
def test_bad_commitments_are_refused_and_nothing_is_written(world, fleet, change, field, error):
    answer = world.client("t1_owner").post(URL, body(**change), format="json")
    assert answer.status_code == 400 and code(answer) == error, answer.content
    assert answer.json()["errors"][0]["attr"] == field
    assert not Commitment.objects.exists() and not Reservation.objects.filter(committed=True).exists()


def test_a_commitment_comes_in_whole_units_of_its_offering(world, fleet):
    answer = world.client("t1_owner").post(URL, body(offering=vm_offering(2).slug, gpus=3), format="json")
    assert answer.status_code == 400 and code(answer) == "not_whole_units", answer.content


def test_commitments_never_hold_more_than_the_regions_fleet(world, fleet):
    first = world.client("t1_owner").post(URL, body(gpus=fleet - 1), format="json")
    assert first.status_code == 201, first.content
    second = world.client("t2_owner").post(URL, body(gpus=2), format="json")
    assert second.status_code == 409 and code(second) == "fleet_committed", second.content
    assert second.json()["errors"][0]["meta"]["committed"] == fleet - 1
    assert Commitment.objects.count() == 1 and Reservation.objects.filter(committed=True).count() == 1


def test_a_started_commitment_is_binding_and_a_future_one_may_be_cancelled(world, fleet):
    owner = world.client("t1_owner")
    started = owner.post(URL, body(), format="json").json()
    reservation = started["reservation"]
    for action in ("release", "cancel"):
        answer = owner.post(f"/api/v1/reservations/{reservation}/{action}/")
        assert answer.status_code == 409 and code(answer) == "commitment_binding", answer.content
    answer = owner.delete(f"{URL}{started['id']}/")
    assert answer.status_code == 409 and code(answer) == "commitment_binding"

    later = owner.post(URL, body(starts_at=(timezone.now() + timedelta(days=10)).isoformat()), format="json")
    assert later.status_code == 201, later.content
    assert owner.delete(f"{URL}{later.json()['id']}/").status_code == 204
    assert Reservation.objects.get(pk=later.json()["reservation"]).state == "cancelled"
    assert owner.delete(f"{URL}{later.json()['id']}/").status_code == 409  # cancelled already
    assert world.client("t1_member").delete(f"{URL}{started['id']}/").status_code == 403


def test_committed_hours_bill_at_the_rate_used_or_not_and_overage_at_on_demand(world, fleet):
    now = hour_floor(timezone.now())
    start = now - timedelta(hours=3)
    committed = ran(world, start=start, end=now + timedelta(days=90), gpus=2, term="reserved")
    committed.committed = True
    committed.save(update_fields=["committed"])
    Commitment.objects.create(tenant=world.t1.tenant, team=world.t1.team, name="c", offering=vm_offering(),
                              region=Region.objects.get(slug="us-east-1"), gpus=2, months=3, starts_at=start,
                              ends_at=add_months(start, 3), rate="1.500000", reservation=committed)
    overage = ran(world, start=start, end=now, gpus=1)
    meter_run(now=now)
    records = UsageRecord.objects.filter(reservation=committed)
    assert {(r.term, r.unit_price) for r in records} == {(COMMITTED, Decimal("1.5"))}
    assert sum(r.amount for r in records) == Decimal("9.000000")  # 2 GPUs x 3 hours x 1.50, whatever ran on them
    over = UsageRecord.objects.filter(reservation=overage)
    assert {(r.term, r.unit_price) for r in over} == {("on_demand", vm_offering().price_per_gpu_hour)}
    lines = invoices.draft(world.t1.tenant.pk, start).lines
    assert any(line.term == COMMITTED and line.amount == Decimal("9.00") for line in lines)


def test_months_are_calendar_months():
    from datetime import UTC, datetime
    assert add_months(datetime(2027, 1, 31, tzinfo=UTC), 1) == datetime(2027, 2, 28, tzinfo=UTC)
    assert add_months(datetime(2027, 11, 15, tzinfo=UTC), 36) == datetime(2030, 11, 15, tzinfo=UTC)


def test_the_scheduler_places_a_commitment_queued_behind_busy_gpus_for_its_whole_term(world, fleet):
    owner = world.client("t1_owner")
    busy = owner.post("/api/v1/reservations/", {"name": "busy", "offering": vm_offering().slug, "gpus": fleet,
                                                "regions": ["us-east-1"], "duration_hours": 2}, format="json")
    assert busy.status_code == 201 and busy.json()["state"] == "scheduled", busy.content
    made = owner.post(URL, body(months=6), format="json").json()
    assert made["reservation_state"] == "queued"  # the fleet is held: it waits, and is not billed meanwhile
    owner.post(f"/api/v1/reservations/{busy.json()['id']}/cancel/")
    run_cycle()
    reservation = Reservation.objects.get(pk=made["reservation"])
    assert reservation.state == "scheduled"
    held = Allocation.objects.filter(reservation=reservation)
    assert held.count() == 2 and all(a.ends_at - a.starts_at > timedelta(days=150) for a in held)
