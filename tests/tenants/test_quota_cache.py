"""
The quota limits a create is checked against, kept per process (tenants/quotas.py): a repeat
create reads no quota rows, and a limit set, lowered or removed is applied by the very next
create -- in this process and in another that kept the old limits.
"""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from provisioning.models import Reservation
from tenants import quotas, services
from tenants.choices import QuotaResource
from tenants.models import Quota
from tests.world import small_fleet, vm_offering

URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(8)


def create(world, gpus=1):
    return world.client("t1_member").post(URL, {
        "name": "job", "offering": vm_offering(1).slug, "gpus": gpus, "regions": ["us-east-1"],
        "duration_hours": 1}, format="json")


def quota_reads(world) -> int:
    vm_offering(1)  # the test's own lookup, before counting
    with CaptureQueriesContext(connection) as queries:
        response = create(world)
    assert response.status_code == 201, response.content
    return sum('FROM "tenants_quota"' in q["sql"] for q in queries.captured_queries)


def set_limit(world, limit):
    services.quota_set(actor=world.principal("platform_admin"), tenant=world.t1.tenant,
                       resource=QuotaResource.GPUS, limit=limit)


def test_a_repeat_create_reads_no_quota_rows(world, fleet, settings):
    assert quota_reads(world) >= 1  # the limits (and, once, the team's record)
    assert quota_reads(world) == 0
    settings.MERIDIAN_QUOTA_CACHE_SECONDS = 0
    assert quota_reads(world) == 1  # the limits again


@pytest.mark.parametrize("where", ["this process", "another process"])
def test_a_lowered_limit_refuses_the_next_create(world, fleet, where, django_capture_on_commit_callbacks):
    set_limit(world, 100)
    assert create(world).status_code == 201
    kept = dict(quotas.KEPT_LIMITS._kept)
    with django_capture_on_commit_callbacks(execute=True):
        set_limit(world, 1)
    if where == "another process":
        quotas.KEPT_LIMITS._kept = dict(kept)
    response = create(world)
    assert response.status_code == 409, response.content
    assert response.json()["errors"][0]["meta"]["limit"] == 1


@pytest.mark.parametrize("where", ["this process", "another process"])
def test_a_removed_limit_gives_way_to_the_default_at_once(world, fleet, where, settings,
                                                         django_capture_on_commit_callbacks):
    settings.MERIDIAN_DEFAULT_QUOTAS = {**settings.MERIDIAN_DEFAULT_QUOTAS, "gpus": 2}
    set_limit(world, 100)
    assert create(world, gpus=1).status_code == 201
    kept = dict(quotas.KEPT_LIMITS._kept)
    quota = Quota.objects.get(tenant=world.t1.tenant, team=None, resource=QuotaResource.GPUS)
    with django_capture_on_commit_callbacks(execute=True):
        services.quota_delete(actor=world.principal("platform_admin"), quota=quota)
    if where == "another process":
        quotas.KEPT_LIMITS._kept = dict(kept)
    response = create(world, gpus=2)
    assert response.status_code == 409, response.content
    assert response.json()["errors"][0]["meta"]["limit"] == 2
