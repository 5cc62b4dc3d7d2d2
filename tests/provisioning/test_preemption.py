"""Higher-priority demand takes capacity from spot work: soft gives a grace period, and spot never preempts."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from cloud.models import GPUModel, Offering
from provisioning.models import Allocation, Reservation
from provisioning.scheduling.scheduler import run_cycle
from provisioning.scheduling.snapshot import request_for
from tests.world import small_fleet

URL = "/api/v1/reservations/"


@pytest.fixture
def spot_offering(world, settings):
    """
    A spot-capable 8-GPU VM offering on a fleet with one 8-GPU shared host and an empty queue;
    no headroom, so spot work may fill the host (the headroom has tests of its own).
    """
    settings.MERIDIAN_HEADROOM = 0
    Reservation.objects.all().delete()
    small_fleet(4)
    return Offering.objects.create(
        slug="vm-h100x8-spot", name="VM 8x H100", kind="vm", gpu_model=GPUModel.objects.get(slug="h100-80gb-sxm"),
        gpus_per_unit=8, price_per_gpu_hour="2.49", spot_available=True, spot_floor_price="1.00",
    )


def reserve(client, offering, **extra):
    body = {"name": "job", "offering": offering.slug, "gpus": 8, "regions": ["us-east-1"], "duration_hours": 4,
            **extra}
    response = client.post(URL, body, format="json")
    assert response.status_code == 201, response.content
    return Reservation.objects.get(pk=response.json()["id"])


def test_on_demand_work_evicts_lower_priority_spot_work_after_its_grace_period(world, spot_offering):
    """The spot holder is released with the preemptor recorded; the new work starts after the grace period."""
    spot = reserve(world.client("t2_member"), spot_offering, billing_term="spot", spot_max_price="1.50",
                   urgency="low", eviction_policy="soft")
    assert spot.state == "scheduled"
    urgent = reserve(world.client("t1_member"), spot_offering, urgency="critical")
    assert urgent.state == "scheduled"
    spot.refresh_from_db()
    assert spot.preempted_by_id == urgent.pk
    assert spot.state in ("releasing", "preempted")
    assert "Preempted" in spot.state_reason
    grace = settings.MERIDIAN_SPOT_GRACE
    assert urgent.starts_at >= spot.submitted_at + grace - timedelta(seconds=5)
    held_until = max(a.ends_at for a in Allocation.objects.filter(reservation=spot))
    assert held_until <= urgent.starts_at


def test_spot_work_never_preempts(world, spot_offering):
    """A second spot request waits instead of evicting the first, whatever its urgency."""
    first = reserve(world.client("t2_member"), spot_offering, billing_term="spot", spot_max_price="1.50",
                    urgency="low")
    second = reserve(world.client("t1_member"), spot_offering, billing_term="spot", spot_max_price="2.00",
                     urgency="critical")
    first.refresh_from_db()
    assert (first.state, second.state) == ("scheduled", "queued")
    assert first.preempted_by_id is None


def test_on_demand_work_never_evicts_on_demand_work(world, spot_offering):
    """Only spot capacity can be taken: a critical request waits behind on-demand work."""
    first = reserve(world.client("t2_member"), spot_offering, urgency="low")
    second = reserve(world.client("t1_member"), spot_offering, urgency="critical")
    first.refresh_from_db()
    assert (first.state, second.state) == ("scheduled", "queued")


def test_a_hard_spot_victim_loses_its_gpus_at_once(world, spot_offering):
    """Hard eviction ends the victim's hold now, not after a grace period."""
    spot = reserve(world.client("t2_member"), spot_offering, billing_term="spot", spot_max_price="1.50",
                   urgency="low", eviction_policy="hard")
    reserve(world.client("t1_member"), spot_offering, urgency="critical")
    held_until = max(a.ends_at for a in Allocation.objects.filter(reservation=spot))
    assert held_until <= timezone.now()


@pytest.mark.parametrize("spot_in_headroom", [False, True])
def test_spot_work_takes_the_headroom_only_when_the_operator_says(world, spot_offering, settings, spot_in_headroom):
    """With a headroom of a whole host, spot work fits only where the setting lets it use the headroom."""
    settings.MERIDIAN_HEADROOM = 1.0
    settings.MERIDIAN_SPOT_IN_HEADROOM = spot_in_headroom
    spot = reserve(world.client("t2_member"), spot_offering, billing_term="spot", spot_max_price="1.50",
                   urgency="low")
    assert spot.state == ("scheduled" if spot_in_headroom else "queued")


def test_reserved_work_waits_for_the_headroom_only_as_long_as_the_operator_says(world, spot_offering, settings):
    """
    With a headroom of a whole host, reserved work waits, and says until when; once it has waited
    MERIDIAN_HEADROOM_MAX_WAIT the scheduler places it in the headroom. On-demand and spot work
    have no such moment.
    """
    settings.MERIDIAN_HEADROOM = 1.0
    settings.MERIDIAN_HEADROOM_MAX_WAIT = timedelta(hours=1)
    reserved = reserve(world.client("t2_member"), spot_offering, billing_term="reserved")
    assert reserved.state == "queued"
    may_from = request_for(reserved, timezone.now()).headroom_from
    assert may_from == reserved.submitted_at + timedelta(hours=1)
    assert run_cycle().placed == 0
    reserved.refresh_from_db()
    assert "may not use the headroom before they have waited for it" in reserved.state_reason

    waited = timezone.now() - timedelta(hours=1, minutes=1)
    Reservation.objects.filter(pk=reserved.pk).update(submitted_at=waited)
    assert run_cycle().placed == 1
    reserved.refresh_from_db()
    assert reserved.state == "scheduled"
    on_demand = reserve(world.client("t1_member"), spot_offering)
    assert request_for(on_demand, timezone.now()).headroom_from is None
    ahead = timezone.now() + timedelta(days=1)  # an advance reservation waits from its requested start
    Reservation.objects.filter(pk=reserved.pk).update(requested_start=ahead)
    reserved.refresh_from_db()
    assert request_for(reserved, timezone.now()).headroom_from == ahead + timedelta(hours=1)


def test_a_zero_wait_keeps_reserved_work_out_of_the_headroom_for_ever(world, spot_offering, settings):
    settings.MERIDIAN_HEADROOM = 1.0
    settings.MERIDIAN_HEADROOM_MAX_WAIT = timedelta(0)
    reserved = reserve(world.client("t2_member"), spot_offering, billing_term="reserved")
    assert request_for(reserved, timezone.now()).headroom_from is None
    waited = timezone.now() - timedelta(days=2)
    Reservation.objects.filter(pk=reserved.pk).update(submitted_at=waited)
    assert run_cycle().placed == 0
