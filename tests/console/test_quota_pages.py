"""Quotas and usage: every limit of the tenant and the principal's teams, counted as admission counts."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from provisioning.models import VPC, Reservation
from tenants.choices import QuotaResource
from tenants.models import Quota
from tests.world import h100, unique, vm_offering

pytestmark = pytest.mark.django_db


def lines(response, title_part: str) -> dict:
    """The usage lines of the section whose title names ``title_part``, by resource (and GPU model)."""
    section = next(s for s in response.context["sections"] if title_part in s["title"])
    return {(line["resource"], line["gpu_model"]): line for line in section["lines"]}


def reserve(world, *, gpus: int, state: str, team=None, window=True) -> Reservation:
    now = timezone.now()
    return Reservation.objects.create(
        tenant=world.t1.tenant, team=team, name=unique("r"), offering=vm_offering(), gpu_model=h100(), units=gpus,
        gpus=gpus, regions=["us-east-1"], duration=timedelta(hours=2), state=state,
        starts_at=now - timedelta(hours=1) if window else None, ends_at=now + timedelta(hours=1) if window else None,
    )


def test_viewer_sees_the_tenants_limits_and_defaults(console, world):
    response = console("t1_viewer").get(reverse("quota-list"))
    assert response.status_code == 200
    tenant = lines(response, "(tenant)")
    gpus = tenant[("GPUs", "All models")]
    assert (gpus["limit"], gpus["used"], gpus["is_default"]) == (64, 1, True)  # the world's queued reservation
    assert ("VPCs", "") in tenant and ("Concurrent instances", "") in tenant
    # The team's own quota is for the team's members (and admins), not for a viewer outside it.
    assert not any("(team)" in s["title"] for s in response.context["sections"])
    body = response.content.decode().split('<main id="content"')[1]
    assert "<form" not in body and 'role="progressbar"' in body


def test_usage_counts_held_and_waiting_gpus_per_tenant_and_team(console, world):
    reserve(world, gpus=4, state="active", team=world.t1.team)
    reserve(world, gpus=2, state="scheduled")
    reserve(world, gpus=8, state="released", team=world.t1.team)  # ended: counts no more
    response = console("t1_member").get(reverse("quota-list"))
    assert lines(response, "(tenant)")[("GPUs", "All models")]["used"] == 1 + 4 + 2
    team = lines(response, "(team)")[("GPUs", "All models")]
    assert (team["limit"], team["used"], team["left"], team["percent"]) == (16, 4, 12, 25)


def test_per_model_and_vpc_limits_show_their_usage(console, world):
    Quota.objects.create(tenant=world.t1.tenant, resource=QuotaResource.GPUS, gpu_model=h100(), limit=2)
    Quota.objects.create(tenant=world.t1.tenant, resource=QuotaResource.VPCS, limit=1)
    world.t1.objects[VPC]  # one VPC, tenant-wide
    response = console("t1_admin").get(reverse("quota-list"))
    tenant = lines(response, "(tenant)")
    model = tenant[("GPUs", h100().name)]
    assert (model["used"], model["level"], model["percent"]) == (1, "", 50)
    vpcs = tenant[("VPCs", "")]
    assert (vpcs["limit"], vpcs["used"], vpcs["is_default"], vpcs["level"]) == (1, 1, False, "over")
    assert 'class="over"' in response.content.decode()


def test_nobody_in_the_tenant_may_post(console):
    for persona in ("t1_viewer", "t1_member", "t1_owner"):
        assert console(persona).post(reverse("quota-list"), {"limit": "1000"}).status_code == 403


def test_another_tenant_sees_only_its_own(console, world):
    reserve(world, gpus=6, state="active", team=world.t1.team)
    response = console("t2_member").get(reverse("quota-list"))
    assert [s["title"] for s in response.context["sections"]] == [f"{world.t2.tenant.name} (tenant)",
                                                                   f"{world.t2.team.name} (team)"]
    assert lines(response, "(tenant)")[("GPUs", "All models")]["used"] == 1
    assert world.t1.tenant.name not in response.content.decode()


def test_storage_limits_show_the_gib_the_tenants_volumes_hold(console, world):
    from tests.world import world_volume

    world_volume(world.t1.tenant)  # a 100 GiB shared file system
    Quota.objects.create(tenant=world.t1.tenant, resource=QuotaResource.SHARED_FS_GIB, limit=400)
    tenant = lines(console("t1_viewer").get(reverse("quota-list")), "(tenant)")
    assert tenant[("Storage (GiB)", "")]["used"] == 100
    shared = tenant[("Shared file systems (GiB)", "")]
    assert (shared["limit"], shared["used"], shared["percent"]) == (400, 100, 25)
    assert tenant[("Block volumes (GiB)", "")]["used"] == 0
