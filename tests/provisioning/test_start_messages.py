"""
The start message of a reservation placed at once goes out after the commit; a broker that
refuses it costs a few seconds (the lifecycle tick starts the reservation), never an error for a
create whose reservation exists.
"""

from unittest import mock

import pytest

from provisioning import lifecycle
from provisioning.models import Reservation
from tests.world import small_fleet, vm_offering

URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(8)


def create(world):
    return world.client("t1_member").post(URL, {
        "name": "now", "offering": vm_offering(1).slug, "gpus": 1, "regions": ["us-east-1"], "duration_hours": 1,
    }, format="json")


def test_the_start_goes_out_after_the_commit(world, fleet, django_capture_on_commit_callbacks):
    sent = []
    with mock.patch.object(lifecycle, "_publish_starts", sent.append):
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            response = create(world)
        assert sent == []  # not before the commit
        for callback in callbacks:
            callback()
    assert response.status_code == 201 and response.json()["state"] == "scheduled"
    assert sent == [[response.json()["id"]]]


def test_a_broker_that_refuses_the_start_is_not_an_error_and_the_tick_starts_it(
        world, fleet, django_capture_on_commit_callbacks, caplog):
    def refused(ids):
        raise ConnectionError("the broker is down")

    with mock.patch.object(lifecycle, "_publish_starts", refused), django_capture_on_commit_callbacks(execute=True):
        response = create(world)
    assert response.status_code == 201, response.content
    assert "the lifecycle tick starts them" in caplog.text
    reservation = Reservation.objects.get(pk=response.json()["id"])
    assert reservation.state == "scheduled"
    report = lifecycle.tick()
    assert report["started"] == 1
    assert Reservation.objects.get(pk=reservation.pk).state == "provisioning"
