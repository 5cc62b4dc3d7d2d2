"""The Django admin is for platform admins only, and never shows BMC credentials."""

from django.test import Client

from cloud.models import Node
from tests.world import small_fleet


def test_platform_admin_uses_the_admin_and_never_sees_bmc_passwords(world):
    """Staff browse nodes in the admin; the node page has no BMC password, not even encrypted."""
    node = small_fleet(4)[0]
    client = Client()
    client.force_login(world.users["platform_admin"])
    assert client.get("/admin/").status_code == 200
    page = client.get(f"/admin/cloud/node/{node.pk}/change/")
    assert page.status_code == 200
    stored = Node.objects.get(pk=node.pk).bmc_password
    assert stored and stored.encode() not in page.content
    assert b"bmc_password" not in page.content


def test_tenant_owners_and_approvers_are_sent_to_the_admin_login(world):
    """Tenant roles and the approver role give no admin access."""
    for persona in ("t1_owner", "platform_approver"):
        client = Client()
        client.force_login(world.users[persona])
        response = client.get("/admin/")
        assert response.status_code == 302, persona
        assert "/admin/login/" in response["Location"]
