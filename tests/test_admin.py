"""The Django admin is for platform admins only, and never shows BMC credentials."""

from django.test import Client

from cloud.models import Node
from provisioning.models import Instance
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


def test_lifecycle_pages_show_steps_but_never_a_node_key(world):
    """Operations with their steps, instances, agents' keys (without the secret) are browsable, read-only."""
    from operations.node_api.agents import credential_issue
    from provisioning.models import StepRun

    node = small_fleet(4)[0]
    operation = world.t1.objects[Instance].reservation.operations.first()
    StepRun.objects.create(operation=operation, name="write_image", attempt=1, state="failed", error="BMC timeout")
    credential, secret = credential_issue(actor=None, node=node)
    client = Client()
    client.force_login(world.users["platform_admin"])
    page = client.get(f"/admin/provisioning/operation/{operation.pk}/change/")
    assert page.status_code == 200 and b"BMC timeout" in page.content
    for path in ("instance", "agentcommand", "agentstate", "nodecredential", "reservation"):
        assert client.get(f"/admin/provisioning/{path}/").status_code == 200
    key_page = client.get(f"/admin/provisioning/nodecredential/{credential.pk}/change/")
    assert key_page.status_code == 200 and secret.encode() not in key_page.content
    assert client.post(f"/admin/provisioning/operation/{operation.pk}/delete/").status_code == 403


def test_staff_add_prices_for_the_future_only_in_the_admin(world):
    from datetime import timedelta

    from django.utils import timezone

    from billing.models import Price
    from security.models import AuditEvent
    from tests.world import vm_offering

    client = Client()
    client.force_login(world.users["platform_admin"])
    form = {"offering": vm_offering().pk, "term": "on_demand", "per_gpu_hour": "2.20", "currency": "USD"}
    past = {**form, "effective_from_0": "2020-01-01", "effective_from_1": "00:00:00"}
    page = client.post("/admin/billing/price/add/", past)
    assert page.status_code == 200 and b"starts in the future" in page.content and not Price.objects.exists()
    later = timezone.now() + timedelta(days=3)
    future = {**form, "effective_from_0": f"{later:%Y-%m-%d}", "effective_from_1": "00:00:00"}
    assert client.post("/admin/billing/price/add/", future).status_code == 302
    assert Price.objects.count() == 1 and AuditEvent.objects.filter(action="price.add").count() == 1


def test_staff_grant_prepaid_credit_in_the_admin_through_the_audited_service(world):
    from billing.models import CreditGrant
    from security.models import AuditEvent

    client = Client()
    client.force_login(world.users["platform_admin"])
    answer = client.post("/admin/billing/creditgrant/add/", {"tenant": world.t1.tenant.pk, "amount": "500.00",
                                                               "note": "Prepayment"})
    assert answer.status_code == 302, answer.content[:500]
    assert CreditGrant.objects.get().amount == 500 and AuditEvent.objects.filter(action="credit.grant").count() == 1
    assert client.get("/admin/billing/commitment/").status_code == 200
