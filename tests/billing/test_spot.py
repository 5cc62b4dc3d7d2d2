"""
The spot market (billing.spot): the price follows the stated rule from how much of a region's GPUs
of the model are held, every price is kept, spot work priced out is evicted with the grace and told
why, a spot reservation whose max price is below the price now is refused, and spot time is billed
at the time-weighted market price of each hour it ran.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import spot
from billing.meter import hour_floor, meter_run
from billing.models import SpotPrice, UsageRecord
from billing.spot import SpotHistory, market_price, spot_update
from cloud.models import GPU, Region
from provisioning.models import Reservation
from tests.billing.test_meter import ran
from tests.world import vm_offering

pytestmark = pytest.mark.django_db


def spot_offering():
    offering = vm_offering()
    type(offering).objects.filter(pk=offering.pk).update(spot_available=True, spot_floor_price="1.00",
                                                         price_per_gpu_hour="3.00")
    offering.refresh_from_db()
    return offering


@pytest.mark.parametrize(("held", "price"), [("0", "1.0000"), ("0.5", "1.0000"), ("0.75", "2.0000"),
                                             ("1", "3.0000")])
def test_the_rule_floor_to_the_knee_then_straight_to_on_demand(held, price):
    assert market_price(Decimal("1.00"), Decimal("3.00"), Decimal(held)) == Decimal(price)


def test_prices_follow_what_is_held_and_priced_out_spot_work_is_evicted_with_the_grace(world, monkeypatch):
    offering = spot_offering()
    now = timezone.now()
    reservation = ran(world, start=now - timedelta(hours=1), end=now + timedelta(hours=5), term="spot", gpus=2)
    Reservation.objects.filter(pk=reservation.pk).update(state="active", spot_max_price="1.50")
    region = Region.objects.get(slug="us-east-1")
    sellable = GPU.objects.filter(node__region=region, model=offering.gpu_model).count()
    done = spot_update(now=now)
    share = Decimal(2) / Decimal(sellable)
    assert done == {"prices": 1, "evicted": 0}
    row = SpotPrice.objects.get(offering=offering, region=region)
    assert row.utilization == share.quantize(Decimal("0.0001"))
    assert row.per_gpu_hour == market_price(Decimal("1.00"), Decimal("3.00"), share) == Decimal("1.0000")

    busy = {(region.pk, offering.gpu_model_id): Decimal("0.9")}  # a busy hour: 90 % of the region's H100s held
    monkeypatch.setattr(spot, "utilization", lambda at: busy)
    done = spot_update(now=now + timedelta(minutes=5))
    assert done["evicted"] == 1 and SpotPrice.objects.filter(offering=offering).count() == 2
    reservation.refresh_from_db()
    assert reservation.state == "releasing" and "rose to 2.6000/GPU-hour, above your max price of 1.5" in \
        reservation.state_reason
    assert reservation.allocations.first().ends_at > now + timedelta(minutes=5)  # the grace, not at once


def test_a_spot_reservation_priced_out_now_is_refused_with_the_price(world):
    offering = spot_offering()
    ran(world, start=timezone.now() - timedelta(hours=1), end=timezone.now(), gpus=1)  # a fleet to price
    SpotPrice.objects.create(offering=offering, region=Region.objects.get(slug="us-east-1"), at=timezone.now(),
                             per_gpu_hour="2.5000", utilization="0.8000")
    body = {"name": "cheap", "offering": offering.slug, "gpus": 1, "regions": ["us-east-1"], "duration_hours": 1,
            "billing_term": "spot", "spot_max_price": "1.2000"}
    refused = world.client("t1_owner").post("/api/v1/reservations/", body, format="json")
    assert refused.status_code == 409 and refused.json()["errors"][0]["code"] == "spot_price_above_max"
    assert refused.json()["errors"][0]["meta"]["price"] == "2.5000"
    assert world.client("t1_owner").post("/api/v1/reservations/", {**body, "spot_max_price": "2.6000"},
                                         format="json").status_code == 201


def test_spot_time_is_billed_at_the_time_weighted_market_price_of_each_hour(world):
    offering = spot_offering()
    now = hour_floor(timezone.now())
    start = now - timedelta(hours=2)
    ran(world, start=start, end=now, gpus=1, term="spot")
    region = Region.objects.get(slug="us-east-1")
    for minutes, price in ((-30, "1.0000"), (30, "2.0000"), (90, "3.0000")):  # before, half of hour 1, hour 2
        SpotPrice.objects.create(offering=offering, region=region, at=start + timedelta(minutes=minutes),
                                 per_gpu_hour=price, utilization="0.7")
    meter_run(now=now)
    prices = dict(UsageRecord.objects.values_list("starts_at", "unit_price"))
    assert prices == {start: Decimal("1.5"), start + timedelta(hours=1): Decimal("2.5")}
    assert SpotHistory(since=start).average(offering.pk, region.pk, start, start + timedelta(hours=2)) == \
        Decimal("2.000000")
