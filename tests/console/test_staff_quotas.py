"""The staff quotas page: every tenant's and team's quotas with usage; platform admins set, edit and delete."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from provisioning.models import Reservation
from security.models import AuditEvent
from tenants.models import Quota, Team, Tenant
from tests.world import h100, small_fleet, unique, vm_offering

pytestmark = pytest.mark.django_db

TENANT_PERSONAS = ["t1_viewer", "t1_member", "t1_admin", "t1_owner", "t2_member"]


def quota_of(world, side="t1") -> Quota:
    return world.side(side).objects[Quota]


@pytest.mark.parametrize("persona", TENANT_PERSONAS)
def test_tenant_users_get_404_on_every_quota_url(console, world, persona):
    client = console(persona)
    quota = quota_of(world)
    assert client.get("/staff/quotas/").status_code == 404
    assert client.post("/staff/quotas/", {"tenant": world.t1.tenant.slug, "resource": "gpus",
                                          "limit": 999}).status_code == 404
    assert client.post(f"/staff/quotas/{quota.pk}/", {"limit": 999}).status_code == 404
    assert client.post(f"/staff/quotas/{quota.pk}/delete/").status_code == 404
    quota.refresh_from_db()
    assert quota.limit == 16


def test_approver_reads_but_gets_403_on_posts(console, world):
    client = console("platform_approver")
    quota = quota_of(world)
    page = client.get("/staff/quotas/")
    body = page.content.decode()
    assert page.status_code == 200 and world.t1.tenant.name in body and world.t2.tenant.name in body
    assert "Set a quota" not in body and "Remove" not in body
    assert client.post("/staff/quotas/", {"tenant": world.t1.tenant.slug, "resource": "vpcs",
                                          "limit": 3}).status_code == 403
    assert client.post(f"/staff/quotas/{quota.pk}/", {"limit": 999}).status_code == 403
    assert client.post(f"/staff/quotas/{quota.pk}/delete/").status_code == 403
    quota.refresh_from_db()
    assert quota.limit == 16 and Quota.objects.count() == 2


def test_admin_sets_a_tenant_quota_and_a_team_quota(console, world):
    small_fleet(2)  # H100s: a GPU model the fleet has
    client = console("platform_admin")
    response = client.post("/staff/quotas/", {"tenant": world.t1.tenant.slug, "resource": "gpus",
                                              "gpu_model": "h100-80gb-sxm", "limit": 24}, follow=True)
    quota = Quota.objects.get(tenant=world.t1.tenant, team=None, resource="gpus")
    assert quota.limit == 24 and quota.gpu_model == h100()
    assert "Quota set" in response.content.decode()
    assert AuditEvent.objects.filter(action="quota.set", target_id=str(quota.pk)).exists()
    # Setting the same quota again changes it (the team's here).
    client.post("/staff/quotas/", {"tenant": world.t1.tenant.slug, "team": world.t1.team.slug, "resource": "gpus",
                                   "limit": 4})
    assert Quota.objects.get(pk=quota_of(world).pk).limit == 4


@pytest.mark.parametrize("data, field, message", [
    ({"limit": -5}, "limit", "greater than or equal to 0"),
    ({"limit": "lots"}, "limit", "Enter a whole number"),
    ({"tenant": "no-such-tenant"}, "tenant", "Choose one of the tenants listed"),
    ({"team": "not-a-team"}, "team", "has no team"),
    ({"resource": "vpcs", "gpu_model": "h100-80gb-sxm"}, "gpu_model", "Only a GPU quota may name a GPU model"),
    ({"resource": "bananas"}, "resource", "Select a valid choice"),
])
def test_bad_input_shows_errors_and_saves_nothing(console, world, data, field, message):
    small_fleet(2)
    before = list(Quota.objects.values_list("pk", "limit"))
    audit = AuditEvent.objects.count()
    form = {"tenant": world.t1.tenant.slug, "resource": "gpus", "limit": 8} | data
    response = console("platform_admin").post("/staff/quotas/", form)
    assert response.status_code == 400
    body = response.content.decode()
    assert message in body
    assert 'aria-invalid="true"' in body or field == "tenant"
    assert list(Quota.objects.values_list("pk", "limit")) == before and AuditEvent.objects.count() == audit


def test_another_tenants_team_is_refused(console, world):
    """A team slug is looked up in the tenant named: tenant B's team cannot get a quota through tenant A."""
    Team.objects.filter(pk=world.t2.team.pk).update(slug="only-in-t2")
    response = console("platform_admin").post("/staff/quotas/", {
        "tenant": world.t1.tenant.slug, "team": "only-in-t2", "resource": "gpus", "limit": 8})
    assert response.status_code == 400 and "has no team" in response.content.decode()
    assert not Quota.objects.filter(team=world.t2.team).exclude(pk=quota_of(world, "t2").pk).exists()


def test_admin_edits_and_deletes_a_quota(console, world):
    client = console("platform_admin")
    quota = quota_of(world)
    client.post(f"/staff/quotas/{quota.pk}/", {"limit": 40})
    quota.refresh_from_db()
    assert quota.limit == 40
    response = client.post(f"/staff/quotas/{quota.pk}/", {"limit": -1})
    assert response.status_code == 400 and "greater than or equal to 0" in response.content.decode()
    quota.refresh_from_db()
    assert quota.limit == 40
    response = client.post(f"/staff/quotas/{quota.pk}/delete/", {"back_tenant": world.t1.tenant.slug})
    assert response.status_code == 302 and world.t1.tenant.slug in response["Location"]
    assert not Quota.objects.filter(pk=quota.pk).exists()
    assert client.get(f"/staff/quotas/{quota.pk}/").status_code == 405


def test_usage_counts_held_and_waiting_gpus(console, world):
    tenant = world.t1.tenant
    Quota.objects.create(tenant=tenant, resource="gpus", limit=4)
    now = timezone.now()
    Reservation.objects.create(
        tenant=tenant, team=world.t1.team, name=unique("active"), offering=vm_offering(), gpu_model=h100(), units=3,
        gpus=3, regions=["us-east-1"], duration=timedelta(hours=2), state="active",
        starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=1))
    # The world's queued reservation (1 GPU, no team) waits: tenant-wide 3 now + 1 waiting.
    body = console("platform_admin").get("/staff/quotas/", {"tenant": tenant.slug}).content.decode()
    body = body[body.index('id="all-quotas"'):]  # the table (the form above lists every tenant)
    assert world.t2.tenant.name not in body
    tenant_row = body[body.index('<span class="muted">whole tenant</span>'):]
    tenant_row = tenant_row[:tenant_row.index("</tr>")]
    assert '<td class="num">3</td>' in tenant_row and '<td class="num">1</td>' in tenant_row
    team_row = body[body.index(world.t1.team.name):]
    team_row = team_row[:team_row.index("</tr>")]
    assert '<td class="num">3</td>' in team_row and '<td class="num">0</td>' in team_row
    assert body.count("over the limit") == 0
    Quota.objects.filter(tenant=tenant, team=None).update(limit=3)
    body = console("platform_admin").get("/staff/quotas/").content.decode()
    assert body.count("over the limit") == 1


def test_query_count_does_not_grow_with_quotas(console, world, django_assert_max_num_queries):
    client = console("platform_admin")
    client.get("/staff/quotas/")
    with CaptureQueriesContext(connection) as few:
        client.get("/staff/quotas/")
    for _ in range(15):
        tenant = Tenant.objects.create(name=unique("Tenant"), slug=unique("tenant"))
        team = Team.objects.create(tenant=tenant, name="Research", slug="research")
        Quota.objects.create(tenant=tenant, resource="gpus", limit=8)
        Quota.objects.create(tenant=tenant, team=team, resource="vpcs", limit=2)
        Quota.objects.create(tenant=tenant, resource="instances", limit=5)
    with django_assert_max_num_queries(len(few)):
        body = client.get("/staff/quotas/").content.decode()
    assert body.count('action="/staff/quotas/') >= 47  # one edit form per quota, and the set form


def options(body: str, select_id: str) -> list[tuple[str, str]]:
    """The (value, text) of each option of the select with ``select_id``."""
    import re

    select = re.search(r'<select[^>]*id="' + select_id + r'"[^>]*>(.*?)</select>', body, re.S)
    assert select, f"no select #{select_id}"
    return [(value, text.strip()) for value, text in re.findall(r'<option value="([^"]*)"[^>]*>([^<]*)</option>',
                                                                 select[1])]


def test_the_tenant_and_team_are_picked_from_lists_not_typed(console, world):
    body = console("platform_admin").get("/staff/quotas/").content.decode()

    tenants = options(body, "quota-tenant")
    for side in (world.t1, world.t2):
        assert (side.tenant.slug, side.tenant.name) in tenants
    assert 'list="tenant-slugs"' not in body
    teams = options(body, "quota-team")
    assert ("", "Whole tenant") in teams and (world.t1.team.slug, world.t1.team.name) in teams
    assert f'<optgroup label="{world.t1.tenant.name}">' in body


def test_only_gpu_models_of_the_fleet_are_offered(console, world):
    from cloud.models import GPUModel

    small_fleet(2)  # H100s only
    unsold = GPUModel.objects.exclude(gpus__isnull=False).first()
    assert unsold is not None, "the catalogue has a model the fleet lacks"

    models = options(console("platform_admin").get("/staff/quotas/").content.decode(), "quota-gpu_model")

    assert ("h100-80gb-sxm", h100().name) in models
    assert unsold.slug not in [value for value, _ in models]
