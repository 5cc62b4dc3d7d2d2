"""In-app notifications: who sees which, marking them read (audited), and tenant isolation."""

import pytest

from security.models import AuditEvent
from tenants.models import Notification, Team, TeamMembership
from tenants.notifications import notify
from tests.world import unique

URL = "/api/v1/notifications/"


def titles(world, persona, **params) -> set[str]:
    response = world.client(persona).get(URL, params)
    assert response.status_code == 200, response.content
    return {row["title"] for row in response.json()["results"]}


@pytest.fixture
def notices(world):
    """One notification of each audience in t1, and one in t2."""
    t1, t2 = world.t1, world.t2
    Notification.objects.filter(tenant__in=[t1.tenant, t2.tenant]).delete()
    return {
        "member": notify(t1.tenant, user=world.users["t1_member"], kind="test", title="for the member", body="."),
        "admin": notify(t1.tenant, user=world.users["t1_admin"], kind="test", title="for the admin", body="."),
        "team": notify(t1.tenant, team=t1.team, kind="test", title="for the team", body="."),
        "tenant": notify(t1.tenant, kind="test", title="for the tenant", body=".", link="/reservations/"),
        "other": notify(t2.tenant, kind="test", title="for tenant two", body="."),
    }


def test_each_principal_sees_its_own_its_teams_and_the_tenants(world, notices):
    """Personal ones to their user only; team ones to the team and tenant admins; tenant-wide to all."""
    assert titles(world, "t1_member") == {"for the member", "for the team", "for the tenant"}
    assert titles(world, "t1_admin") == {"for the admin", "for the team", "for the tenant"}
    assert titles(world, "t1_owner") == {"for the team", "for the tenant"}
    assert titles(world, "t1_viewer") == {"for the tenant"}  # not in the team
    assert titles(world, "t2_member") == {"for tenant two"}


def test_other_tenant_gets_404_on_a_notification(world, notices):
    client = world.client("t2_member")
    for notice in notices.values():
        if notice.tenant_id == world.t1.tenant.pk:
            assert client.get(f"{URL}{notice.pk}/").status_code == 404
            assert client.post(f"{URL}{notice.pk}/read/").status_code == 404
    assert Notification.objects.filter(tenant=world.t1.tenant, read_at__isnull=False).count() == 0


def test_another_members_personal_notification_is_404(world, notices):
    response = world.client("t1_admin").post(f"{URL}{notices['member'].pk}/read/")
    assert response.status_code == 404
    notices["member"].refresh_from_db()
    assert notices["member"].read_at is None


def test_marking_read_is_audited_once_and_shared(world, notices):
    """Read marks the row (for every reader of a shared one); marking it again changes nothing."""
    tenant_wide = notices["tenant"]
    client = world.client("t1_member")

    response = client.post(f"{URL}{tenant_wide.pk}/read/")

    assert response.status_code == 200
    assert response.json()["read_at"] is not None
    assert AuditEvent.objects.filter(action="notification.read", target_id=str(tenant_wide.pk)).count() == 1
    assert client.post(f"{URL}{tenant_wide.pk}/read/").status_code == 200
    assert AuditEvent.objects.filter(action="notification.read", target_id=str(tenant_wide.pk)).count() == 1
    assert titles(world, "t1_viewer", unread="true") == set()


def test_read_all_marks_only_what_the_principal_sees(world, notices):
    response = world.client("t1_member").post(f"{URL}read-all/")

    assert response.status_code == 200
    assert response.json() == {"marked_read": 3}
    unread = set(Notification.objects.filter(read_at__isnull=True).values_list("title", flat=True))
    assert {"for the admin", "for tenant two"} <= unread
    assert titles(world, "t1_member", unread="true") == set()
    assert titles(world, "t1_member", unread="false") == {"for the member", "for the team", "for the tenant"}
    assert AuditEvent.objects.filter(action="notification.read_all").count() == 1
    assert world.client("t1_member").post(f"{URL}read-all/").json() == {"marked_read": 0}
    assert AuditEvent.objects.filter(action="notification.read_all").count() == 1


def test_staff_read_every_tenants_notifications_but_mark_none(world, notices):
    assert {"for the member", "for tenant two"} <= titles(world, "platform_admin")
    assert world.client("platform_admin").post(f"{URL}{notices['tenant'].pk}/read/").status_code == 403
    assert world.client("platform_approver").post(f"{URL}read-all/").status_code == 403


def test_read_only_token_cannot_mark_read(world, notices):
    from tests.world import issue_token

    client = world.client("anon")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issue_token(world.users['t1_member'], world.t1.tenant, 'read')}")
    response = client.post(f"{URL}{notices['tenant'].pk}/read/")
    assert response.status_code == 403
    assert response.json()["errors"][0]["code"] == "token_read_only"


def test_team_bound_token_sees_its_team_not_the_users_other_teams(world, notices):
    from tenants import services
    from tenants.principals import load_team_roles
    from tenants.scoping import Principal

    member, tenant = world.users["t1_member"], world.t1.tenant
    other = Team.objects.create(tenant=tenant, name="Other", slug=unique("other"))
    TeamMembership.objects.create(team=other, user=member)
    notify(tenant, team=other, kind="test", title="for the other team", body=".")
    principal = Principal(user=member, tenant=tenant, role="member", team_roles=load_team_roles(member, tenant.pk))
    token = services.token_issue(actor=principal, name="team", scope="read_write", team=world.t1.team).secret
    client = world.client("anon")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    seen = {row["title"] for row in client.get(URL).json()["results"]}

    assert seen == {"for the member", "for the team", "for the tenant"}
    assert "for the other team" in titles(world, "t1_member")
    assert client.post(f"{URL}{notices['tenant'].pk}/read/").status_code == 200


def test_notify_refuses_a_team_of_another_tenant(world):
    with pytest.raises(ValueError, match="not in tenant"):
        notify(world.t1.tenant, team=world.t2.team, kind="test", title="x", body="x")


def test_long_titles_are_cut_to_fit(world):
    notice = notify(world.t1.tenant, kind="test", title="x" * 500, body="")
    assert len(notice.title) == 200
