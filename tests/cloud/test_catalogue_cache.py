"""
Offerings and regions named by slug in a create, remembered per process (cloud/catalogue_cache.py):
a repeat create reads neither again, and an offering taken off sale or a region retired is refused
by the very next create -- in this process and in another that remembered them before the change.
"""

from unittest import mock

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from cloud import services
from cloud.catalogue_cache import CATALOGUE
from cloud.models import Region
from core import epochs
from provisioning.models import Reservation
from tests.world import small_fleet, vm_offering

URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(8)


def create(world, **overrides):
    body = {"name": "job", "gpus": 1, "regions": ["us-east-1"], "duration_hours": 1, **overrides}
    if "offering" not in body:
        body["offering"] = vm_offering(1).slug
    return world.client("t1_member").post(URL, body, format="json")


def catalogue_reads(world) -> int:
    """SELECTs of offering or region rows by slug during one create."""
    slug = vm_offering(1).slug  # the test's own lookup, before counting
    with CaptureQueriesContext(connection) as queries:
        response = create(world, offering=slug)
    assert response.status_code == 201, response.content
    return sum(q["sql"].startswith("SELECT") and ('"cloud_offering"."slug" =' in q["sql"]
                                                  or '"cloud_region"."slug" =' in q["sql"])
               for q in queries.captured_queries)


def test_a_repeat_create_reads_no_catalogue_rows(world, fleet):
    assert catalogue_reads(world) == 2  # the offering and the region
    assert catalogue_reads(world) == 0


def test_turned_off_or_without_the_shared_cache_every_create_reads_them(world, fleet, settings):
    settings.MERIDIAN_CATALOGUE_CACHE_SECONDS = 0
    assert catalogue_reads(world) == 2
    assert catalogue_reads(world) == 2
    settings.MERIDIAN_CATALOGUE_CACHE_SECONDS = 30
    with mock.patch.object(epochs, "cache", mock.Mock(**{"get.side_effect": ConnectionError("redis is down")})):
        assert catalogue_reads(world) == 2
        assert catalogue_reads(world) == 2


def off_sale(world):
    services.offering_update(actor=world.principal("platform_admin"), offering=vm_offering(1), is_active=False)
    return "offering"


def retire_region(world):
    region = Region.objects.get(slug="us-east-1")
    region.is_active = False
    region.save(update_fields=["is_active"])
    return "regions"


@pytest.mark.parametrize("change", [off_sale, retire_region])
@pytest.mark.parametrize("where", ["this process", "another process"])
def test_a_change_is_seen_by_the_next_create(world, fleet, change, where, django_capture_on_commit_callbacks):
    assert catalogue_reads(world) == 2
    remembered = dict(CATALOGUE._kept._kept)
    with django_capture_on_commit_callbacks(execute=True):
        field = change(world)
    if where == "another process":
        CATALOGUE._kept._kept = dict(remembered)
    response = create(world)
    assert response.status_code == 400, response.content
    assert response.json()["errors"][0]["attr"].startswith(field)


def test_an_unknown_slug_is_a_400_and_each_create_gets_its_own_row(world, fleet):
    response = create(world, offering="no-such-offering")
    assert response.status_code == 400 and response.json()["errors"][0]["code"] == "does_not_exist"
    slug = vm_offering(1).slug
    queryset = vm_offering(1).__class__.objects.filter(is_active=True)
    first = CATALOGUE.get(queryset, "slug", slug, asked="test")
    second = CATALOGUE.get(queryset, "slug", slug, asked="test")
    assert first == second and first is not second
    first.name = "changed by one request"
    assert CATALOGUE.get(queryset, "slug", slug, asked="test").name != "changed by one request"
