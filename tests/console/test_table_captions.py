"""Every table of every console page has a caption (WCAG 1.3.1): a screen reader names it before reading its rows."""

import re

import pytest

from cloud.models import Node
from provisioning.models import VPC, Reservation
from tenants.models import Notification
from tenants.notifications import notify
from tests.world import small_fleet, vm_offering, world_vpc

pytestmark = pytest.mark.django_db

TABLE = re.compile(r"<table\b[^>]*>(\s*)(<caption\b)?")


@pytest.fixture
def fleet(world):
    return small_fleet(4)


def uncaptioned(body: str) -> int:
    return sum(1 for match in TABLE.finditer(body) if not match.group(2))


def test_every_table_has_a_caption(console, world, fleet):
    member = console("t1_member")
    response = member.post("/reservations/new/", {
        "name": "captioned", "mode": "offering", "offering": vm_offering().slug, "count": 1, "region": "us-east-1",
        "start_mode": "now", "duration_hours": 2, "billing_term": "on_demand", "eviction_policy": "soft",
        "urgency": "normal"})
    assert response.status_code == 302, response.content.decode()[:1000]
    reservation = Reservation.objects.get(name="captioned")
    vpc = VPC.objects.filter(tenant=world.t1.tenant).first() or world_vpc(world.t1.tenant)
    notify(world.t1.tenant, kind="test.note", title="A note", body="")
    assert Notification.objects.filter(tenant=world.t1.tenant).exists()
    node = Node.objects.order_by("hostname").first()
    pages = {
        "t1_member": ["/", "/reservations/", f"/reservations/{reservation.pk}/", "/vpcs/", f"/vpcs/{vpc.pk}/",
                      f"/vpcs/{vpc.pk}/isolation/", "/teams/", "/quotas/", "/sla/", "/high-priority/", "/tokens/",
                      "/notifications/", "/tenants/"],
        "t1_admin": ["/audit/", "/teams/"],
        "platform_admin": ["/staff/fleet/", f"/staff/fleet/nodes/{node.pk}/", "/staff/queue/", "/staff/quotas/",
                           "/staff/sla/", "/staff/high-priority/", "/audit/"],
    }
    missing = {}
    for persona, paths in pages.items():
        client = member if persona == "t1_member" else console(persona)
        for path in paths:
            response = client.get(path)
            assert response.status_code == 200, (persona, path, response.status_code)
            if n := uncaptioned(response.content.decode()):
                missing[path] = n
    assert missing == {}, f"tables without a caption: {missing}"
