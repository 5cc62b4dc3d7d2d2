"""The VPC pages: scoped like the API, writes for members and up, refusals shown on the form."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from provisioning.choices import VPCState
from provisioning.models import VPC, Instance, PortMembership
from security.models import AuditEvent
from tests.world import world_vpc

pytestmark = pytest.mark.django_db


@pytest.fixture
def vpc(world) -> VPC:
    return world.t1.objects[VPC]


def create_form(vpc: VPC, **overrides) -> dict:
    return {"name": "training-net", "fabric": str(vpc.fabric_id), "cidr": "10.30.0.0/24", "team": "",
            "mtu": "4096", "service_level": "0", **overrides}


def test_list_shows_the_tenants_vpcs_with_their_fabric_and_members(console, world, vpc):
    body = console("t1_viewer").get(reverse("vpc-list")).content.decode()
    assert vpc.name in body and vpc.cidr in body and vpc.fabric.name in body
    assert 'class="badge state-active"' in body


def test_viewer_sees_no_write_buttons_and_gets_403_on_every_post(console, vpc):
    client = console("t1_viewer")
    assert "New VPC</a>" not in client.get(reverse("vpc-list")).content.decode()
    assert "Delete VPC" not in client.get(reverse("vpc-detail", args=[vpc.pk])).content.decode()
    assert client.get(reverse("vpc-new")).status_code == 403
    assert client.post(reverse("vpc-new"), create_form(vpc)).status_code == 403
    assert client.post(reverse("vpc-delete", args=[vpc.pk])).status_code == 403
    assert not VPC.objects.filter(name="training-net").exists()
    assert VPC.objects.get(pk=vpc.pk).state == VPCState.ACTIVE


def test_member_sees_the_write_buttons(console, vpc):
    client = console("t1_member")
    assert "New VPC</a>" in client.get(reverse("vpc-list")).content.decode()
    assert "Delete VPC" in client.get(reverse("vpc-detail", args=[vpc.pk])).content.decode()


def test_another_tenants_vpc_is_a_404_everywhere(console, world, vpc):
    client = console("t2_member")
    assert vpc.name not in client.get(reverse("vpc-list")).content.decode()
    for name in ("vpc-detail", "vpc-isolation"):
        assert client.get(reverse(name, args=[vpc.pk])).status_code == 404
    assert client.post(reverse("vpc-delete", args=[vpc.pk])).status_code == 404
    assert VPC.objects.get(pk=vpc.pk).state == VPCState.ACTIVE


def test_member_creates_then_deletes_a_vpc(console, world, vpc):
    client = console("t1_member")
    response = client.post(reverse("vpc-new"), create_form(vpc))
    created = VPC.objects.get(tenant=world.t1.tenant, name="training-net")
    assert response.status_code == 302 and response["Location"] == reverse("vpc-detail", args=[created.pk])
    assert created.cidr == "10.30.0.0/24" and created.state == VPCState.PENDING
    assert AuditEvent.objects.filter(action="vpc.create", target_id=str(created.pk)).exists()
    page = client.get(response["Location"]).content.decode()
    assert "training-net" in page and "is created with subnet 10.30.0.0/24" in page

    response = client.post(reverse("vpc-delete", args=[created.pk]))
    assert response.status_code == 302 and response["Location"] == reverse("vpc-list")
    assert VPC.objects.get(pk=created.pk).state == VPCState.DELETING


def test_member_creates_a_vpc_for_their_team_with_a_drawn_subnet(console, world, vpc):
    response = console("t1_member").post(reverse("vpc-new"), create_form(vpc, cidr="", team=str(world.t1.team.pk)))
    assert response.status_code == 302
    created = VPC.objects.get(name="training-net")
    assert created.team == world.t1.team and created.cidr.startswith("10.")


@pytest.mark.parametrize(("overrides", "message"), [
    ({"cidr": "10.30.0.1/24"}, "has host bits set: the network is 10.30.0.0/24"),
    ({"cidr": "8.8.8.0/24"}, "is not a private range"),
    ({"cidr": "10.20.0.0/25"}, "overlaps 10.20.0.0/24 of your VPC"),
    ({"name": "Bad Name!"}, "Use lower-case letters, digits and dashes"),
    ({"name": "default-mine"}, "are kept for the default VPCs"),
    ({"service_level": "16"}, "less than or equal to 15"),
])
def test_bad_input_is_shown_on_the_form_and_nothing_is_created(console, vpc, overrides, message):
    before = VPC.objects.count()
    response = console("t1_member").post(reverse("vpc-new"), create_form(vpc, **overrides))
    assert response.status_code == 200
    assert message in response.content.decode()
    assert VPC.objects.count() == before


def test_a_taken_name_is_refused_with_the_services_words(console, vpc):
    response = console("t1_member").post(reverse("vpc-new"), create_form(vpc, name=vpc.name))
    assert response.status_code == 200
    assert f"You already have a VPC named &#x27;{vpc.name}&#x27;" in response.content.decode()


def test_member_cannot_make_a_vpc_for_another_tenants_team(console, world, vpc):
    other = world.t2.team
    response = console("t1_member").post(reverse("vpc-new"), create_form(vpc, team=str(other.pk)))
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    assert not VPC.objects.filter(name="training-net").exists()


def test_deleting_a_vpc_in_use_says_why(console, world, vpc):
    instance = world.t1.objects[Instance]
    PortMembership.objects.create(vpc=vpc, instance=instance, guid="0002c90300a1b2c3", address="10.20.0.1")
    client = console("t1_member")
    response = client.post(reverse("vpc-delete", args=[vpc.pk]), follow=True)
    assert "The VPC is in use: 1 instance(s) in it" in response.content.decode()
    assert VPC.objects.get(pk=vpc.pk).state == VPCState.ACTIVE


def test_detail_lists_the_instances_in_the_vpc(console, world, vpc):
    instance = world.t1.objects[Instance]
    PortMembership.objects.create(vpc=vpc, instance=instance, guid="0002c90300a1b2c3", address="10.20.0.1")
    PortMembership.objects.create(vpc=vpc, instance=instance, guid="0002c90300a1b2c4", address="10.20.0.2")
    body = console("t1_viewer").get(reverse("vpc-detail", args=[vpc.pk])).content.decode()
    assert instance.name in body and "10.20.0.1" in body and "10.20.0.2" in body
    assert "0002c90300a1b2c3" not in body  # members are instances, never raw port GUIDs
    assert reverse("vpc-isolation", args=[vpc.pk]) in body


def test_isolation_report_renders_as_a_page_a_fragment_and_json(console, vpc):
    client = console("t1_viewer")
    page = client.get(reverse("vpc-isolation", args=[vpc.pk]))
    assert page.status_code == 200 and "<h1>Isolation report" in page.content.decode()
    fragment = client.get(reverse("vpc-isolation", args=[vpc.pk]), HTTP_HX_REQUEST="true")
    assert fragment.status_code == 200 and "<html" not in fragment.content.decode()
    assert "Isolation report" in fragment.content.decode()
    report = client.get(reverse("vpc-isolation", args=[vpc.pk]), {"format": "json"})
    assert report.status_code == 200 and report.json()["pkey"] == f"{vpc.pkey:#06x}"


def test_the_isolation_report_lists_the_tenants_file_systems_and_who_they_let_in(console, world, vpc):
    from tests.world import world_volume

    volume = world_volume(world.t1.tenant)
    page = console("t1_viewer").get(reverse("vpc-isolation", args=[vpc.pk])).content.decode()
    assert "Storage exports" in page and volume.name in page and "state-passed\">OK" in page


def test_list_query_count_does_not_grow_with_vpcs(console, world, vpc, django_assert_max_num_queries):
    client = console("t1_member")
    client.get(reverse("vpc-list"))  # warm the session and caches
    with CaptureQueriesContext(connection) as few:
        assert client.get(reverse("vpc-list")).status_code == 200
    for i in range(6):
        extra = world_vpc(world.t1.tenant)
        VPC.objects.filter(pk=extra.pk).update(cidr=f"10.{40 + i}.0.0/24", team=world.t1.team)
    with django_assert_max_num_queries(len(few)):
        body = client.get(reverse("vpc-list")).content.decode()
    assert body.count('href="/vpcs/') >= 7


def test_a_bad_name_and_a_bad_subnet_are_named_together(console, vpc):
    """Both mistakes at the first submit, not the subnet's only after the name is fixed."""
    response = console("t1_member").post(reverse("vpc-new"), create_form(vpc, name="Bad Name", cidr="10.0.0.1/33"))
    body = response.content.decode()
    assert "Use lower-case letters" in body and "is not an IPv4 network in CIDR form" in body
    assert not VPC.objects.filter(name="Bad Name").exists()
