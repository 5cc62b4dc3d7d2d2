"""
What a team is told about its reservations: ready, queued, failed, ending soon, evicted. Each once
per reservation, whatever is retried or ticked again, and only to those who may see it.
"""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from cloud.models import GPUModel, Offering
from provisioning import notices
from provisioning.lifecycle import runner
from provisioning.lifecycle import tick as ticking
from provisioning.models import Reservation
from tenants.models import Notification
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY, reservation
from tests.world import small_fleet

URL = "/api/v1/reservations/"
NOTIFICATIONS = "/api/v1/notifications/"


class WorkerLost(Exception):
    """The worker died before its commit: the message comes again (late acknowledgement)."""


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(4)


def create(world, persona="t1_member", **extra):
    body = {"name": "job", "offering": offering("bare_metal", 8).slug, "regions": ["us-east-1"],
            "duration_hours": 2, "ssh_public_key": SSH_KEY, "nodes": 1, **extra}
    response = world.client(persona).post(URL, body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def told(world, persona, kind) -> list[dict]:
    """The notifications of ``kind`` that ``persona`` reads through the API."""
    response = world.client(persona).get(NOTIFICATIONS, {"kind": kind})
    assert response.status_code == 200, response.content
    return response.json()["results"]


def test_ready_is_told_once_even_when_every_step_is_delivered_twice(world, fleet, steps, monkeypatch):
    real, crashed = runner._steps_succeeded, set()

    def crash_once_before_commit(succeeded, **kwargs):
        names = tuple(run.name for _, run in succeeded)
        if names not in crashed:
            crashed.add(names)
            raise WorkerLost
        return real(succeeded, **kwargs)

    monkeypatch.setattr(runner, "_steps_succeeded", crash_once_before_commit)
    pk = create(world)
    steps.run(redeliver=WorkerLost)
    assert reservation(pk).state == "active"

    ready = told(world, "t1_member", notices.READY)
    assert len(ready) == 1
    assert ready[0]["title"] == "job is ready" and ready[0]["link"] == f"/reservations/{pk}/"
    assert "until" in ready[0]["body"] and "UTC" in ready[0]["body"]
    assert told(world, "t2_member", notices.READY) == []  # another tenant's


def test_telling_the_same_event_again_sends_nothing(world, fleet, steps):
    pk = create(world)
    steps.run()
    active = reservation(pk)

    assert notices.reservations_notify([active], notices.READY) == 0
    assert Notification.objects.filter(kind=notices.READY).count() == 1


@pytest.fixture
def spot_offering(world, settings):
    """One 8-GPU shared host's worth of a spot-capable VM offering, no headroom (as test_preemption)."""
    settings.MERIDIAN_HEADROOM = 0
    Reservation.objects.all().delete()
    small_fleet(4)
    return Offering.objects.create(
        slug="vm-h100x8-spot", name="VM 8x H100", kind="vm", gpu_model=GPUModel.objects.get(slug="h100-80gb-sxm"),
        gpus_per_unit=8, price_per_gpu_hour="2.49", spot_available=True, spot_floor_price="1.00",
    )


def reserve(world, persona, spot_offering, **extra):
    body = {"name": f"{persona}-job", "offering": spot_offering.slug, "gpus": 8, "regions": ["us-east-1"],
            "duration_hours": 4, **extra}
    response = world.client(persona).post(URL, body, format="json")
    assert response.status_code == 201, response.content
    return Reservation.objects.get(pk=response.json()["id"])


def test_a_create_that_cannot_be_placed_now_is_told_queued_once(world, spot_offering):
    reserve(world, "t2_member", spot_offering, billing_term="spot", spot_max_price="1.50")
    waiting = reserve(world, "t1_member", spot_offering, billing_term="spot", spot_max_price="2.00")
    assert waiting.state == "queued"

    queued = told(world, "t1_member", notices.QUEUED)
    assert [n["title"] for n in queued] == ["t1_member-job is queued"]
    assert "you are told here when it is ready" in queued[0]["body"]
    assert told(world, "t2_member", notices.QUEUED) == []  # placed at once: nothing to tell


def test_a_reservation_for_later_is_not_told_queued(world, fleet):
    create(world, start=(timezone.now() + timedelta(hours=3)).isoformat())
    assert told(world, "t1_member", notices.QUEUED) == []


def test_spot_work_evicted_for_higher_priority_work_is_told_once(world, spot_offering):
    spot = reserve(world, "t2_member", spot_offering, billing_term="spot", spot_max_price="1.50", urgency="low")
    reserve(world, "t1_member", spot_offering, urgency="critical")
    spot.refresh_from_db()
    assert spot.preempted_by_id is not None

    evicted = told(world, "t2_member", notices.EVICTED)
    assert [n["title"] for n in evicted] == ["t2_member-job was preempted"]
    assert "higher-priority work" in evicted[0]["body"]
    assert told(world, "t1_member", notices.EVICTED) == []


def test_a_reservation_that_fails_is_told_once_with_the_reason(world, fleet, steps, settings):
    settings.MERIDIAN_PROVISION_FAILURES = 1
    settings.MERIDIAN_SIMULATION = {"seed": 0, "latency_s": {}, "failure_rate": {},
                                    "broken_rate": {"insert_media": 1.0}}
    pk = create(world)
    steps.run()
    assert reservation(pk).state == "failed"

    failed = told(world, "t1_member", notices.FAILED)
    assert [n["title"] for n in failed] == ["job failed"]
    assert "Simulated hardware fault" in failed[0]["body"] and "given back" in failed[0]["body"]


def test_a_requeued_reservation_is_not_told_failed(world, fleet, steps, settings):
    """A failure on one node places the reservation again: it has not failed, nothing is said yet."""
    settings.MERIDIAN_SIMULATION = {"seed": 0, "latency_s": {}, "failure_rate": {"write_image": 1.0},
                                    "broken_rate": {}}
    pk = create(world)
    steps.run()
    assert reservation(pk).state in ("queued", "scheduled", "provisioning", "active")
    assert told(world, "t1_member", notices.FAILED) == []


def test_ending_soon_is_told_once_by_the_tick_before_the_end(world, fleet, steps, settings):
    settings.MERIDIAN_RESERVATION_ENDING_NOTICE = timedelta(minutes=30)
    pk = create(world)
    steps.run()
    active = reservation(pk)

    with time_machine.travel(active.ends_at - timedelta(minutes=45), tick=False):
        assert ticking.tick()["ending_soon"] == 0  # not yet
    with time_machine.travel(active.ends_at - timedelta(minutes=20), tick=False):
        assert ticking.tick()["ending_soon"] == 1
        assert ticking.tick()["ending_soon"] == 0  # the next tick says nothing again
    with time_machine.travel(active.ends_at - timedelta(minutes=5), tick=False):
        assert ticking.tick()["ending_soon"] == 0

    soon = told(world, "t1_member", notices.ENDING_SOON)
    assert [n["title"] for n in soon] == ["job ends in 20 minutes"]
    assert f"{active.ends_at:%Y-%m-%d %H:%M} UTC" in soon[0]["body"] and "extend" in soon[0]["body"]


def test_an_extended_reservation_is_told_again_before_its_new_end(world, fleet, steps, settings):
    settings.MERIDIAN_RESERVATION_ENDING_NOTICE = timedelta(minutes=30)
    pk = create(world)
    steps.run()
    first_end = reservation(pk).ends_at
    with time_machine.travel(first_end - timedelta(minutes=20), tick=False):
        assert ticking.tick()["ending_soon"] == 1
        response = world.client("t1_member").post(f"{URL}{pk}/extend/", {"hours": 1}, format="json")
        assert response.status_code == 200, response.content
    with time_machine.travel(first_end + timedelta(minutes=40), tick=False):
        assert ticking.tick()["ending_soon"] == 1
    assert len(told(world, "t1_member", notices.ENDING_SOON)) == 2
