"""Teams and members: roles changed through the services, invitations shown once, scoped like the API."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tenants.choices import TeamRole, TenantRole
from tenants.models import Invitation, Membership, Team, TeamMembership
from tenants.views import INVITATION_LINK
from tests.world import make_user

pytestmark = pytest.mark.django_db


def membership(world, persona) -> Membership:
    return Membership.objects.get(user=world.users[persona])


def act_urls(world) -> list[str]:
    """Every post of the page, each on a t1 object."""
    t1 = world.t1
    tm = t1.objects[TeamMembership]
    return [
        reverse("team-create"),
        reverse("membership-role", args=[membership(world, "t1_member").pk]),
        reverse("membership-remove", args=[membership(world, "t1_member").pk]),
        reverse("team-membership-add", args=[t1.team.pk]),
        reverse("team-membership-role", args=[tm.pk]),
        reverse("team-membership-remove", args=[tm.pk]),
        reverse("invitation-create"),
        reverse("invitation-revoke", args=[t1.objects[Invitation].pk]),
    ]


def test_viewer_sees_teams_and_members_but_no_write_controls(console, world):
    response = console("t1_viewer").get(reverse("team-list"))
    body = response.content.decode().split('<main id="content"')[1]  # the topbar's switchers aside
    assert response.status_code == 200
    assert world.t1.team.name in body and world.users["t1_member"].email in body
    for control in ('action="/teams/new/"', "/role/", "/remove/", "Invite someone", "Pending invitations", "<select"):
        assert control not in body
    assert world.t2.team.name not in body


def test_viewer_gets_403_on_every_post(console, world):
    client = console("t1_viewer")
    data = {"role": "owner", "name": "x", "slug": "x", "email": "a@example.com"}
    for url in act_urls(world):
        assert client.post(url, data).status_code == 403
    assert membership(world, "t1_member").role == TenantRole.MEMBER
    assert Invitation.objects.get(pk=world.t1.objects[Invitation].pk).revoked_at is None


def test_admin_sees_every_control(console, world):
    body = console("t1_admin").get(reverse("team-list")).content.decode()
    for control in ('action="/teams/new/"', reverse("membership-role", args=[membership(world, "t1_member").pk]),
                    "Invite someone", "Pending invitations", reverse("team-membership-add", args=[world.t1.team.pk])):
        assert control in body
    # An admin cannot touch an owner: the owner's row has no controls.
    assert reverse("membership-role", args=[membership(world, "t1_owner").pk]) not in body


def test_another_tenants_objects_are_404(console, world):
    client = console("t2_owner")
    for url in act_urls(world)[1:6] + act_urls(world)[7:]:
        assert client.post(url, {"role": "viewer", "user": str(world.users["t2_member"].pk)}).status_code == 404, url
    inv = world.t1.objects[Invitation]
    assert client.get(reverse("invitation-created", args=[inv.pk])).status_code == 404
    # A member of the other tenant is stopped earlier, by role, or finds nothing: never a change.
    for url in act_urls(world)[1:]:
        assert console("t2_member").post(url, {"role": "viewer"}).status_code in (403, 404)
    assert membership(world, "t1_member").role == TenantRole.MEMBER


def test_admin_changes_a_members_role(console, world):
    target = membership(world, "t1_member")
    response = console("t1_admin").post(reverse("membership-role", args=[target.pk]), {"role": "viewer"}, follow=True)
    assert "is now viewer" in response.content.decode()
    target.refresh_from_db()
    assert target.role == TenantRole.VIEWER


def test_role_change_with_htmx_swaps_the_row(console, world):
    target = membership(world, "t1_viewer")
    response = console("t1_admin").post(reverse("membership-role", args=[target.pk]), {"role": "member"},
                                        HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200 and body.lstrip().startswith(f'<tr id="member-{target.pk}"')
    assert '<option value="member" selected>' in body and "is now member" in body
    target.refresh_from_db()
    assert target.role == TenantRole.MEMBER


def test_services_refusal_is_shown_not_raised(console, world):
    """An admin may not make an owner (the service's rule), and the last owner stays."""
    target = membership(world, "t1_member")
    response = console("t1_admin").post(reverse("membership-role", args=[target.pk]), {"role": "owner"},
                                        HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and "Only an owner can make someone an owner" in response.content.decode()
    owner = membership(world, "t1_owner")
    response = console("t1_owner").post(reverse("membership-role", args=[owner.pk]), {"role": "admin"}, follow=True)
    assert "A tenant must keep at least one owner" in response.content.decode()
    target.refresh_from_db()
    owner.refresh_from_db()
    assert (target.role, owner.role) == (TenantRole.MEMBER, TenantRole.OWNER)


def test_admin_removes_a_member(console, world):
    target = membership(world, "t1_viewer")
    response = console("t1_admin").post(reverse("membership-remove", args=[target.pk]), HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and "left the tenant" in response.content.decode()
    assert not Membership.objects.filter(pk=target.pk).exists()


def test_invitation_is_created_and_its_link_shown_once(console, world):
    client = console("t1_admin")
    response = client.post(reverse("invitation-create"), {
        "email": "new.person@example.com", "role": "member", "team": str(world.t1.team.pk), "team_role": "admin"})
    invitation = Invitation.objects.get(email="new.person@example.com")
    assert response.status_code == 302 and response["Location"] == reverse("invitation-created", args=[invitation.pk])
    assert (invitation.tenant, invitation.team, invitation.team_role) == (world.t1.tenant, world.t1.team, "admin")
    body = client.get(response["Location"]).content.decode()
    assert "/invitations/mri_" in body
    assert INVITATION_LINK not in client.session
    again = client.get(response["Location"]).content.decode()
    assert "/invitations/mri_" not in again and "cannot be shown again" in again


@pytest.mark.parametrize(("data", "message"), [
    ({"email": "not-an-address", "role": "member"}, "Enter a valid email address."),
    ({"email": "someone@example.com", "role": "owner"}, "Select a valid choice."),  # an admin cannot grant owner
])
def test_bad_invitation_is_shown_on_the_form(console, world, data, message):
    before = Invitation.objects.count()
    response = console("t1_admin").post(reverse("invitation-create"), {"team_role": "member", **data})
    assert response.status_code == 200 and message in response.content.decode()
    assert Invitation.objects.count() == before


def test_inviting_a_member_says_they_are_one(console, world):
    email = world.users["t1_member"].email
    response = console("t1_admin").post(reverse("invitation-create"), {"email": email, "role": "viewer",
                                                                       "team_role": "member"})
    assert response.status_code == 200 and f"{email} is already a member of this tenant." in response.content.decode()


def test_admin_revokes_an_invitation(console, world):
    invitation = world.t1.objects[Invitation]
    response = console("t1_admin").post(reverse("invitation-revoke", args=[invitation.pk]), HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and "state-revoked" in response.content.decode()
    invitation.refresh_from_db()
    assert invitation.revoked_at is not None


def test_admin_creates_a_team_and_a_duplicate_slug_is_refused(console, world):
    client = console("t1_admin")
    response = client.post(reverse("team-create"), {"name": "Vision lab", "slug": "vision-lab"})
    assert response.status_code == 302
    assert Team.objects.filter(tenant=world.t1.tenant, slug="vision-lab").exists()
    response = client.post(reverse("team-create"), {"name": "Again", "slug": "vision-lab"})
    assert response.status_code == 200
    assert "A team with slug &#x27;vision-lab&#x27; already exists" in response.content.decode()
    response = client.post(reverse("team-create"), {"name": "Bad", "slug": "Bad Slug"})
    assert response.status_code == 200 and "Use lower-case letters, digits and single hyphens" in (
        response.content.decode())
    assert Team.objects.filter(tenant=world.t1.tenant).count() == 2


def test_team_members_are_added_changed_and_removed(console, world):
    client = console("t1_admin")
    team, viewer = world.t1.team, world.users["t1_viewer"]
    response = client.post(reverse("team-membership-add", args=[team.pk]), {"user": str(viewer.pk), "role": "member"})
    assert response.status_code == 302
    tm = TeamMembership.objects.get(team=team, user=viewer)
    response = client.post(reverse("team-membership-role", args=[tm.pk]), {"role": "admin"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and "is now team admin" in response.content.decode()
    tm.refresh_from_db()
    assert tm.role == TeamRole.ADMIN
    assert client.post(reverse("team-membership-remove", args=[tm.pk])).status_code == 302
    assert not TeamMembership.objects.filter(pk=tm.pk).exists()


def test_adding_someone_outside_the_tenant_is_refused_on_the_page(console, world):
    stranger = world.users["t2_member"]
    response = console("t1_admin").post(reverse("team-membership-add", args=[world.t1.team.pk]),
                                        {"user": str(stranger.pk), "role": "member"})
    assert response.status_code == 200 and "Choose a member of this tenant." in response.content.decode()
    assert not TeamMembership.objects.filter(user=stranger, team=world.t1.team).exists()


def test_a_plain_member_cannot_manage_a_team_they_do_not_administer(console, world):
    response = console("t1_member").post(reverse("team-membership-add", args=[world.t1.team.pk]),
                                         {"user": str(world.users["t1_viewer"].pk), "role": "member"})
    assert response.status_code == 200
    assert "Only tenant admins and the team&#x27;s admins manage its members." in response.content.decode()


def test_page_query_count_does_not_grow_with_members(console, world, django_assert_max_num_queries):
    client = console("t1_admin")
    client.get(reverse("team-list"))
    with CaptureQueriesContext(connection) as few:
        client.get(reverse("team-list"))
    for i in range(5):
        user = make_user(f"extra-{i}@example.com")
        Membership.objects.create(tenant=world.t1.tenant, user=user, role=TenantRole.MEMBER)
        team = Team.objects.create(tenant=world.t1.tenant, name=f"Extra {i}", slug=f"extra-{i}")
        TeamMembership.objects.create(team=team, user=user)
    with django_assert_max_num_queries(len(few)):
        body = client.get(reverse("team-list")).content.decode()
    assert "extra-4@example.com" in body
