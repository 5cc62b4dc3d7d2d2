"""The staff incidents pages: open ones by node name, the response buttons, staff only, platform admins act."""

from datetime import timedelta

import pytest
from django.utils import timezone

from security.models import AuditEvent, Incident
from tenants.choices import PlatformRole
from tests.world import fleet_node, make_user, unique

pytestmark = pytest.mark.django_db
LIST = "/staff/incidents/"


@pytest.fixture
def node(world):
    return fleet_node()


def made(**fields) -> Incident:
    return Incident.objects.create(**{"kind": "gpu_reset", "summary": "GPU 2 reset after XID 79", **fields})


@pytest.mark.parametrize("persona", ["t1_viewer", "t1_owner", "t2_member"])
def test_tenant_users_get_404(console, persona):
    incident = made()
    client = console(persona)
    assert client.get(LIST).status_code == 404
    assert client.get(f"{LIST}{incident.pk}/").status_code == 404
    assert client.post(f"{LIST}{incident.pk}/acknowledge/").status_code == 404
    assert Incident.objects.get(pk=incident.pk).acknowledged_at is None


def test_the_list_shows_open_incidents_oldest_first_by_node_name(console, node):
    newer = made(node_id=node.pk, detected_at=timezone.now() - timedelta(minutes=5))
    older = made(kind="node_suspect", node_id=node.pk, detected_at=timezone.now() - timedelta(hours=3))
    made(kind="node_drain", resolved_at=timezone.now())
    page = console("platform_approver").get(LIST)
    body = page.content.decode()
    assert page.status_code == 200
    assert body.index(f"/staff/incidents/{older.pk}/") < body.index(f"/staff/incidents/{newer.pk}/")
    assert node.hostname in body
    assert "Node drain" not in body.split("<tbody>")[1]  # resolved: not open (the kind filter still offers it)
    assert "3\xa0hours" in body or "3 hours" in body
    assert "Respond" not in body  # approvers read, only platform admins act
    everything = console("platform_approver").get(LIST, {"show": "all"}).content.decode()
    assert "Node drain" in everything.split("<tbody>")[1]
    drains = console("platform_approver").get(LIST, {"show": "all", "kind": "node_drain"}).content.decode()
    assert f"/staff/incidents/{older.pk}/" not in drains and '<option value="node_drain" selected>' in drains


def test_a_tenant_s_incident_says_whose_work_it_hit(console, world):
    made(kind="gpu_failure", tenant_id=world.t1.tenant.pk)
    body = console("platform_approver").get(LIST).content.decode()
    assert world.t1.tenant.name in body.split("<tbody>")[1]


def test_the_buttons_acknowledge_assign_and_resolve(console, world, node):
    incident = made(node_id=node.pk)
    admin = world.users["platform_admin"]
    other = make_user(f"{unique('oncall')}@meridian.example", platform_role=PlatformRole.ADMIN)
    client = console("platform_admin")
    page = client.get(LIST).content.decode()
    for verb in ("acknowledge", "assign-me", "assign", "resolve"):
        assert f"/staff/incidents/{incident.pk}/{verb}/" in page
    assert other.email in page  # a choice of "Assign to"

    back = client.post(f"{LIST}{incident.pk}/acknowledge/", {"next": LIST})
    assert back.status_code == 302 and back["Location"] == LIST
    client.post(f"{LIST}{incident.pk}/assign-me/")
    incident.refresh_from_db()
    assert incident.acknowledged_by == admin and incident.assignee == admin
    client.post(f"{LIST}{incident.pk}/assign/", {"assignee": other.email})
    incident.refresh_from_db()
    assert incident.assignee == other

    refused = client.post(f"{LIST}{incident.pk}/assign/", {"assignee": world.users["t1_owner"].email}, follow=True)
    assert "not a platform admin" in refused.content.decode()
    empty = client.post(f"{LIST}{incident.pk}/resolve/", {"note": " "}, follow=True)
    assert "Say what was done" in empty.content.decode()
    client.post(f"{LIST}{incident.pk}/resolve/", {"note": "Reseated the GPU."})
    incident.refresh_from_db()
    assert incident.resolved_by == admin and incident.resolution_note == "Reseated the GPU."
    actions = set(AuditEvent.objects.filter(target_id=str(incident.pk)).values_list("action", flat=True))
    assert actions == {"incident.acknowledge", "incident.assign", "incident.resolve"}

    detail = client.get(f"{LIST}{incident.pk}/").content.decode()
    assert "Reseated the GPU." in detail and node.hostname in detail
    late = client.post(f"{LIST}{incident.pk}/acknowledge/", follow=True).content.decode()
    assert "resolved already" in late


def test_approvers_cannot_act(console):
    incident = made()
    response = console("platform_approver").post(f"{LIST}{incident.pk}/acknowledge/")
    assert response.status_code == 403
    assert Incident.objects.get(pk=incident.pk).acknowledged_at is None


def test_unknown_action_is_404(console):
    incident = made()
    assert console("platform_admin").post(f"{LIST}{incident.pk}/delete/").status_code == 404


def test_the_node_page_links_to_its_incidents(console, node):
    incident = made(node_id=node.pk)
    body = console("platform_admin").get(f"/staff/fleet/nodes/{node.pk}/").content.decode()
    assert f"/staff/incidents/?show=all&amp;node={node.pk}" in body
    assert f"/staff/incidents/{incident.pk}/" in body
    listed = console("platform_admin").get(LIST, {"node": str(node.pk), "show": "all"}).content.decode()
    assert f"/staff/incidents/{incident.pk}/" in listed
    assert console("platform_admin").get(LIST, {"node": "not-an-id"}).status_code == 200


def test_the_staff_navigation_names_incidents(console):
    assert 'href="/staff/incidents/"' in console("platform_approver").get("/staff/").content.decode()
