"""
Tenancy services, called directly and through the API: the cross-row rules (last owner, last
team admin, who grants which role), invitations, tenant creation, the session principal and quotas.
"""

import threading
from datetime import timedelta

import pytest
import time_machine
from django.conf import settings
from django.db import connection
from django.test import Client
from django.utils import timezone
from drf_standardized_errors.handler import exception_handler
from rest_framework.test import APIClient

from cloud.models import GPUModel
from core.errors import Conflict, DomainError, Forbidden, QuotaExceeded
from security.models import AuditEvent
from tenants import services
from tenants.choices import QuotaResource, TeamRole, TenantRole, TokenScope
from tenants.models import Invitation, Membership, Quota, Team, TeamMembership, Tenant, User, secret_digest
from tenants.permissions import TENANT_REQUIRED
from tenants.quotas import quota_check, quota_limits
from tenants.scoping import Principal
from tenants.services import (
    INVITATION_INVALID,
    INVITATION_PREFIX,
    LAST_OWNER,
    LAST_TEAM_ADMIN,
    ONLY_OWNER_GRANTS_OWNER,
    SIGN_IN_REQUIRED,
)
from tests.world import issue_token, unique

TEAMS = "/api/v1/teams/"
MEMBERSHIPS = "/api/v1/memberships/"
TEAM_MEMBERSHIPS = "/api/v1/team-memberships/"
INVITATIONS = "/api/v1/invitations/"
ACCEPT = "/api/v1/invitations/accept/"
TENANTS = "/api/v1/tenants/"
ME = "/api/v1/me/"
PASSWORD = "correct-Horse-battery-42"


def assert_error(response, status: int, code: str, attr: str | None = None) -> dict:
    assert response.status_code == status, (response.status_code, response.content)
    body = response.json()
    assert set(body) == {"type", "errors"}, body
    error = body["errors"][0]
    assert error["code"] == code, body
    if attr is not None:
        assert error["attr"] == attr, body
    return error


def membership_of(world, persona: str, side: str = "t1") -> Membership:
    return Membership.objects.get(tenant=world.side(side).tenant, user=world.users[persona])


def team_membership_of(world, persona: str, team: Team | None = None) -> TeamMembership:
    return TeamMembership.objects.get(team=team or world.t1.team, user=world.users[persona])


def secret_of(link: str) -> str:
    return link.rstrip("/").rsplit("/", 1)[-1]


def row_as_text(model, pk) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT row_to_json(t)::text FROM {model._meta.db_table} t WHERE id = %s", [pk])  # noqa: S608
        return cursor.fetchone()[0]


def invite(world, persona: str = "t1_admin", **payload) -> tuple[dict, str]:
    """Create an invitation through the API; its body and the link's secret."""
    payload.setdefault("role", TenantRole.MEMBER)
    response = world.client(persona).post(INVITATIONS, payload, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    return body, secret_of(body["link"])


#
# Tenant roles: the last owner, and who may grant what
#


def test_last_owner_cannot_be_demoted_through_the_service(world):
    """The tenant's only owner stays owner: 409 ``last_owner``."""
    membership = membership_of(world, "t1_owner")
    with pytest.raises(Conflict) as caught:
        services.membership_set_role(actor=world.principal("t1_owner"), membership=membership, role=TenantRole.ADMIN)
    assert caught.value.get_codes() == "last_owner"
    assert str(caught.value.detail) == LAST_OWNER
    membership.refresh_from_db()
    assert membership.role == TenantRole.OWNER


def test_last_owner_cannot_be_demoted_through_the_api(world):
    """PATCH of the only owner's role is a 409 ``last_owner`` and changes nothing."""
    membership = membership_of(world, "t1_owner")
    response = world.client("t1_owner").patch(f"{MEMBERSHIPS}{membership.pk}/", {"role": "admin"}, format="json")
    error = assert_error(response, 409, "last_owner")
    assert error["detail"] == LAST_OWNER
    membership.refresh_from_db()
    assert membership.role == TenantRole.OWNER


def test_last_owner_cannot_be_removed(world):
    """DELETE of the only owner's membership is a 409 ``last_owner``; the owner and their token remain."""
    membership = membership_of(world, "t1_owner")
    response = world.client("t1_owner").delete(f"{MEMBERSHIPS}{membership.pk}/")
    assert_error(response, 409, "last_owner")
    assert Membership.objects.filter(pk=membership.pk, role=TenantRole.OWNER).exists()
    assert world.client("t1_owner").get(ME).status_code == 200
    with pytest.raises(Conflict, match="at least one owner"):
        services.membership_remove(actor=world.principal("t1_owner"), membership=membership)


def test_an_owner_can_be_demoted_while_another_owner_remains(world):
    """With two owners, one can step down (200) and the audit trail records it."""
    Membership.objects.filter(pk=membership_of(world, "t1_admin").pk).update(role=TenantRole.OWNER)
    membership = membership_of(world, "t1_owner")
    response = world.client("t1_owner").patch(f"{MEMBERSHIPS}{membership.pk}/", {"role": "admin"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["role"] == TenantRole.ADMIN
    assert AuditEvent.objects.filter(action="membership.update", target_id=str(membership.pk)).count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_owners_demoting_each_other_at_once_leave_one_owner(world):
    """Concurrent demotions of the last two owners: exactly one succeeds, the other is 409 ``last_owner``."""
    tenant = world.t1.tenant
    second = membership_of(world, "t1_admin")
    second.role = TenantRole.OWNER
    second.save(update_fields=["role"])
    first = membership_of(world, "t1_owner")
    plans = [(world.users["t1_owner"], second), (world.users["t1_admin"], first)]
    barrier = threading.Barrier(len(plans))
    outcomes = []

    def demote(actor_user, target):
        try:
            actor = Principal(user=actor_user, tenant=tenant, role=TenantRole.OWNER)
            barrier.wait(timeout=10)
            services.membership_set_role(actor=actor, membership=target, role=TenantRole.ADMIN)
            outcomes.append("ok")
        except Conflict as exc:
            outcomes.append(exc.get_codes())
        except Exception as exc:  # noqa: BLE001 -- recorded, so the test fails with the cause
            outcomes.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=demote, args=plan) for plan in plans]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["last_owner", "ok"]
    assert Membership.objects.filter(tenant=tenant, role=TenantRole.OWNER).count() == 1


@pytest.mark.parametrize(("target", "new_role"), [("t1_member", "owner"), ("t1_owner", "member")])
def test_admin_cannot_grant_owner_or_change_an_owner(world, target, new_role):
    """Only an owner touches the owner role: an admin's PATCH is 403 and changes nothing."""
    membership = membership_of(world, target)
    response = world.client("t1_admin").patch(f"{MEMBERSHIPS}{membership.pk}/", {"role": new_role}, format="json")
    error = assert_error(response, 403, "permission_denied")
    assert error["detail"] == ONLY_OWNER_GRANTS_OWNER
    assert Membership.objects.get(pk=membership.pk).role == membership.role


def test_admin_cannot_remove_an_owner(world):
    """An admin's DELETE of an owner's membership is 403."""
    membership = membership_of(world, "t1_owner")
    response = world.client("t1_admin").delete(f"{MEMBERSHIPS}{membership.pk}/")
    assert_error(response, 403, "permission_denied")
    assert Membership.objects.filter(pk=membership.pk).exists()


def test_admin_can_change_a_members_role_below_owner(world):
    """An admin manages viewers, members and admins: member → viewer is 200."""
    membership = membership_of(world, "t1_member")
    response = world.client("t1_admin").patch(f"{MEMBERSHIPS}{membership.pk}/", {"role": "viewer"}, format="json")
    assert response.status_code == 200, response.content
    assert Membership.objects.get(pk=membership.pk).role == TenantRole.VIEWER


@pytest.mark.parametrize("persona", ["t1_member", "t1_viewer"])
def test_member_cannot_change_roles(world, persona):
    """Members and viewers may not change anyone's role, their own included (403; a viewer's token only reads)."""
    for target in (persona, "t1_viewer" if persona == "t1_member" else "t1_member"):
        membership = membership_of(world, target)
        response = world.client(persona).patch(f"{MEMBERSHIPS}{membership.pk}/", {"role": "admin"}, format="json")
        assert_error(response, 403, "permission_denied" if persona == "t1_member" else "token_read_only")
        assert Membership.objects.get(pk=membership.pk).role == membership.role


def test_role_outside_the_enum_is_400(world):
    """``role="superuser"`` is not a role: 400 on ``role``."""
    membership = membership_of(world, "t1_member")
    response = world.client("t1_owner").patch(f"{MEMBERSHIPS}{membership.pk}/", {"role": "superuser"},
                                              format="json")
    assert_error(response, 400, "invalid_choice", attr="role")


def test_removing_a_member_drops_their_team_memberships(world):
    """membership_remove takes the user out of the tenant's teams too."""
    services.membership_remove(actor=world.principal("t1_owner"), membership=membership_of(world, "t1_member"))
    assert not TeamMembership.objects.filter(user=world.users["t1_member"], team__tenant=world.t1.tenant).exists()


#
# Team roles
#


def test_last_team_admin_cannot_be_demoted(world):
    """The team's only admin stays admin: 409 ``last_team_admin`` through the API and the service."""
    tm = team_membership_of(world, "t1_admin")
    response = world.client("t1_owner").patch(f"{TEAM_MEMBERSHIPS}{tm.pk}/", {"role": "member"}, format="json")
    error = assert_error(response, 409, "last_team_admin")
    assert error["detail"] == LAST_TEAM_ADMIN
    with pytest.raises(Conflict) as caught:
        services.team_membership_set_role(actor=world.principal("t1_admin"), team_membership=tm,
                                          role=TeamRole.MEMBER)
    assert caught.value.get_codes() == "last_team_admin"
    tm.refresh_from_db()
    assert tm.role == TeamRole.ADMIN


def test_last_team_admin_cannot_leave_while_members_remain(world):
    """Removing the only team admin while others are in the team is 409 ``last_team_admin``."""
    tm = team_membership_of(world, "t1_admin")
    assert world.t1.team.memberships.count() > 1
    response = world.client("t1_owner").delete(f"{TEAM_MEMBERSHIPS}{tm.pk}/")
    assert_error(response, 409, "last_team_admin")
    assert TeamMembership.objects.filter(pk=tm.pk).exists()


def test_team_admin_can_be_demoted_once_another_admin_exists(world):
    """With a second team admin, the first may become a member."""
    TeamMembership.objects.filter(pk=team_membership_of(world, "t1_member").pk).update(role=TeamRole.ADMIN)
    tm = team_membership_of(world, "t1_admin")
    response = world.client("t1_owner").patch(f"{TEAM_MEMBERSHIPS}{tm.pk}/", {"role": "member"}, format="json")
    assert response.status_code == 200, response.content
    assert TeamMembership.objects.get(pk=tm.pk).role == TeamRole.MEMBER


@pytest.fixture
def lab(world) -> Team:
    """A second team of tenant 1 whose only admin is t1_member (a plain tenant member)."""
    team = Team.objects.create(tenant=world.t1.tenant, name="Lab", slug=unique("lab"))
    TeamMembership.objects.create(team=team, user=world.users["t1_member"], role=TeamRole.ADMIN)
    return team


def test_team_admin_adds_members_to_their_own_team(world, lab):
    """A tenant member who is admin of a team adds a tenant member to it (201)."""
    viewer = world.users["t1_viewer"]
    response = world.client("t1_member").post(
        TEAM_MEMBERSHIPS, {"team": str(lab.pk), "user": str(viewer.pk)}, format="json"
    )
    assert response.status_code == 201, response.content
    assert TeamMembership.objects.filter(team=lab, user=viewer, role=TeamRole.MEMBER).exists()


def test_team_admin_cannot_manage_another_teams_members(world, lab):
    """Being admin of one team gives no say over another: adding to or changing it is 403."""
    viewer = world.users["t1_viewer"]
    response = world.client("t1_member").post(
        TEAM_MEMBERSHIPS, {"team": str(world.t1.team.pk), "user": str(viewer.pk)}, format="json"
    )
    assert_error(response, 403, "permission_denied")
    assert not TeamMembership.objects.filter(team=world.t1.team, user=viewer).exists()

    # t1_member is a plain member of world.t1.team, so they see its memberships but cannot change them.
    admin_tm = team_membership_of(world, "t1_admin")
    response = world.client("t1_member").patch(f"{TEAM_MEMBERSHIPS}{admin_tm.pk}/", {"role": "member"},
                                               format="json")
    assert_error(response, 403, "permission_denied")
    with pytest.raises(Forbidden):
        services.team_membership_remove(actor=world.principal("t1_member"), team_membership=admin_tm)
    assert TeamMembership.objects.get(pk=admin_tm.pk).role == TeamRole.ADMIN


def test_team_member_cannot_promote_themselves(world):
    """A plain team member's PATCH of their own team role is 403."""
    own = team_membership_of(world, "t1_member")
    response = world.client("t1_member").patch(f"{TEAM_MEMBERSHIPS}{own.pk}/", {"role": "admin"}, format="json")
    assert_error(response, 403, "permission_denied")
    assert TeamMembership.objects.get(pk=own.pk).role == TeamRole.MEMBER


def test_adding_a_non_member_of_the_tenant_to_a_team_is_not_a_member(world):
    """The service refuses a user outside the tenant with 400 ``not_a_member``."""
    stranger = world.users["t2_member"]
    with pytest.raises(DomainError) as caught:
        services.team_membership_add(actor=world.principal("t1_owner"), team=world.t1.team, user=stranger)
    assert caught.value.status_code == 400
    assert caught.value.get_codes() == "not_a_member"
    assert not TeamMembership.objects.filter(user=stranger, team=world.t1.team).exists()


def test_adding_a_non_member_of_the_tenant_to_a_team_through_the_api_is_400(world):
    """Through the API, another tenant's user id is refused on ``user`` (400) without revealing them."""
    stranger = world.users["t2_member"]
    response = world.client("t1_owner").post(
        TEAM_MEMBERSHIPS, {"team": str(world.t1.team.pk), "user": str(stranger.pk)}, format="json"
    )
    assert response.status_code == 400, response.content
    assert response.json()["errors"][0]["attr"] == "user"
    assert response.json()["errors"][0]["code"] in {"does_not_exist", "not_a_member"}
    assert not TeamMembership.objects.filter(user=stranger, team=world.t1.team).exists()


def test_adding_a_user_twice_to_a_team_is_409(world):
    """A user already in the team cannot be added again."""
    response = world.client("t1_owner").post(
        TEAM_MEMBERSHIPS, {"team": str(world.t1.team.pk), "user": str(world.users["t1_member"].pk)}, format="json"
    )
    assert_error(response, 409, "duplicate")


def test_adding_to_another_tenants_team_is_refused_as_not_found(world):
    """Another tenant's team id is as good as non-existent on ``team`` (400), for memberships and invitations."""
    before = (TeamMembership.objects.count(), Invitation.objects.count())
    response = world.client("t1_owner").post(
        TEAM_MEMBERSHIPS, {"team": str(world.t2.team.pk), "user": str(world.users["t1_member"].pk)}, format="json"
    )
    assert_error(response, 400, "does_not_exist", attr="team")
    response = world.client("t1_owner").post(INVITATIONS, {"role": "member", "team": str(world.t2.team.pk)},
                                             format="json")
    assert_error(response, 400, "does_not_exist", attr="team")
    assert (TeamMembership.objects.count(), Invitation.objects.count()) == before


def test_team_role_outside_the_enum_is_400(world):
    """``role="superuser"`` on a team membership is a 400 on ``role``."""
    tm = team_membership_of(world, "t1_member")
    response = world.client("t1_owner").patch(f"{TEAM_MEMBERSHIPS}{tm.pk}/", {"role": "superuser"}, format="json")
    assert_error(response, 400, "invalid_choice", attr="role")


@pytest.mark.parametrize("persona", ["t1_admin", "t1_owner"])
def test_tenant_people_cannot_change_their_quota(world, persona):
    """Quotas are set by platform admins: a tenant admin's or owner's PATCH is 403 and the limit stays."""
    quota = world.t1.objects[Quota]
    response = world.client(persona).patch(f"/api/v1/quotas/{quota.pk}/", {"limit": 9999}, format="json")
    assert_error(response, 403, "permission_denied")
    assert Quota.objects.get(pk=quota.pk).limit == quota.limit


@pytest.mark.parametrize("path", ["../", "1%20OR%201=1/", "%00/", "not-a-uuid/"])
def test_non_uuid_team_id_in_the_path_is_a_json_404(world, path):
    """A path id that is not a UUID matches no route: a JSON 404, never a 500 or an HTML page."""
    response = world.client("t1_admin").get(f"{TEAMS}{path}")
    assert response.status_code == 404, response.content
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["errors"][0]["code"] == "not_found"


#
# Teams
#


def test_duplicate_team_slug_in_a_tenant_is_409(world):
    """A second team with the same slug in one tenant is a 409 ``duplicate``; no row is added."""
    before = Team.objects.filter(tenant=world.t1.tenant).count()
    response = world.client("t1_admin").post(TEAMS, {"name": "Again", "slug": world.t1.team.slug}, format="json")
    assert_error(response, 409, "duplicate")
    assert Team.objects.filter(tenant=world.t1.tenant).count() == before


def test_same_team_slug_in_two_tenants_is_fine(world):
    """Slugs are unique per tenant, not globally."""
    slug = unique("shared")
    assert world.client("t1_admin").post(TEAMS, {"name": "A", "slug": slug}, format="json").status_code == 201
    assert world.client("t2_owner").post(TEAMS, {"name": "B", "slug": slug}, format="json").status_code == 201
    assert Team.objects.filter(slug=slug).count() == 2


def test_renaming_a_team_to_an_existing_slug_is_409(world):
    """team_update maps the unique clash to a 409 too."""
    other = Team.objects.create(tenant=world.t1.tenant, name="Other", slug=unique("other"))
    response = world.client("t1_admin").patch(f"{TEAMS}{other.pk}/", {"slug": world.t1.team.slug}, format="json")
    assert_error(response, 409, "duplicate")


@pytest.mark.parametrize("name", ["", "x" * 10_240, "bad\x00name"])
def test_bad_team_name_is_400(world, name):
    """An empty, 10 kB or NUL-containing team name is a 400 and creates nothing."""
    before = Team.objects.count()
    response = world.client("t1_admin").post(TEAMS, {"name": name, "slug": unique("bad")}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["errors"][0]["attr"] == "name"
    assert Team.objects.count() == before


@pytest.mark.django_db(transaction=True)
def test_duplicate_team_slug_race_creates_exactly_one_team(world):
    """Two concurrent creates of one slug: one 201, one 409, and exactly one row."""
    slug = unique("race")
    token = world.tokens["t1_admin"]
    barrier = threading.Barrier(2)
    statuses = []

    def create():
        try:
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
            barrier.wait(timeout=10)
            statuses.append(client.post(TEAMS, {"name": "Race", "slug": slug}, format="json").status_code)
        except Exception as exc:  # noqa: BLE001 -- recorded, so the test fails with the cause
            statuses.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=create) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(statuses) == [201, 409]
    assert Team.objects.filter(tenant=world.t1.tenant, slug=slug).count() == 1
    assert AuditEvent.objects.filter(action="team.create", after__slug=slug).count() == 1


#
# Invitations
#


def test_invitation_link_is_shown_once_and_only_its_digest_is_stored(world):
    """The 201 carries the link; the row keeps the SHA-256 of its secret, later reads never show it."""
    body, secret = invite(world, email="New.Person@Example.com")
    assert secret.startswith(INVITATION_PREFIX)
    assert body["link"] == f"{settings.MERIDIAN_PUBLIC_URL.rstrip('/')}/invitations/{secret}/"
    assert body["status"] == "pending"
    invitation = Invitation.objects.get(pk=body["id"])
    assert invitation.digest == secret_digest(secret)
    assert invitation.email == "new.person@example.com"
    row = row_as_text(Invitation, invitation.pk)
    assert invitation.digest in row
    assert secret not in row
    assert secret[len(INVITATION_PREFIX):] not in row

    detail = world.client("t1_admin").get(f"{INVITATIONS}{invitation.pk}/")
    assert detail.status_code == 200
    assert "link" not in detail.json()
    assert secret not in detail.content.decode()
    assert secret not in world.client("t1_admin").get(INVITATIONS).content.decode()


def test_inviting_an_existing_member_by_email_is_409(world):
    """An address already in the tenant cannot be invited again (409 ``already_member``)."""
    before = Invitation.objects.count()
    response = world.client("t1_admin").post(
        INVITATIONS, {"role": "admin", "email": world.users["t1_member"].email.upper()}, format="json"
    )
    assert_error(response, 409, "already_member")
    assert Invitation.objects.count() == before


def test_accepting_anonymously_creates_the_user_and_membership(world):
    """Without a session, e-mail + password create the account with the invited role, who can then sign in."""
    email = f"{unique('newcomer')}@example.com"
    _, secret = invite(world, role=TenantRole.ADMIN, email=email)

    response = APIClient().post(ACCEPT, {"token": secret, "email": email, "password": PASSWORD}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["role"] == TenantRole.ADMIN
    assert response.json()["tenant"]["id"] == str(world.t1.tenant.pk)

    user = User.objects.get(email=email)
    assert user.has_usable_password()
    assert Membership.objects.get(user=user, tenant=world.t1.tenant).role == TenantRole.ADMIN
    invitation = Invitation.objects.get(digest=secret_digest(secret))
    assert invitation.status == "accepted"
    assert invitation.accepted_by == user

    browser = Client()
    signed_in = browser.post("/login/", {"username": email, "password": PASSWORD})
    assert signed_in.status_code == 302, signed_in.content
    me = browser.get(ME)
    assert me.status_code == 200, me.content
    assert me.json()["email"] == email
    assert me.json()["acting_as"]["tenant"] == str(world.t1.tenant.pk)


def test_accepting_an_invitation_with_a_team_adds_the_team_membership(world):
    """A team invitation puts the new member in that team with the invited team role."""
    email = f"{unique('teamie')}@example.com"
    _, secret = invite(world, email=email, team=str(world.t1.team.pk), team_role=TeamRole.ADMIN)
    response = APIClient().post(ACCEPT, {"token": secret, "email": email, "password": PASSWORD}, format="json")
    assert response.status_code == 201, response.content
    assert TeamMembership.objects.get(team=world.t1.team, user__email=email).role == TeamRole.ADMIN


def test_accepting_while_signed_in_joins_as_the_session_user(world):
    """A signed-in user (session) accepts with the token alone and joins with the invited role."""
    user = world.users["t2_member"]
    _, secret = invite(world, role=TenantRole.VIEWER)
    client = APIClient()
    client.force_login(user)
    response = client.post(ACCEPT, {"token": secret}, format="json")
    assert response.status_code == 201, response.content
    assert Membership.objects.get(user=user, tenant=world.t1.tenant).role == TenantRole.VIEWER
    assert Membership.objects.filter(user=user).count() == 2


def test_accepting_with_a_token_joins_as_its_user_but_a_read_only_token_is_403(world):
    """A read-write token accepts as its user; a read-only token may not accept (403 ``token_read_only``)."""
    user = world.users["t2_member"]
    _, secret = invite(world, role=TenantRole.VIEWER)
    before = (User.objects.count(), Membership.objects.count())

    read_only = APIClient()
    read_only.credentials(HTTP_AUTHORIZATION=f"Bearer {issue_token(user, world.t2.tenant, scope=TokenScope.READ)}")
    assert_error(read_only.post(ACCEPT, {"token": secret}, format="json"), 403, "token_read_only")
    assert (User.objects.count(), Membership.objects.count()) == before
    assert Invitation.objects.get(digest=secret_digest(secret)).status == "pending"

    response = world.client("t2_member").post(ACCEPT, {"token": secret}, format="json")
    assert response.status_code == 201, response.content
    assert Membership.objects.get(user=user, tenant=world.t1.tenant).role == TenantRole.VIEWER
    assert Invitation.objects.get(digest=secret_digest(secret)).accepted_by == user


def test_anonymous_accept_of_an_open_invitation_is_sign_in_required_and_writes_nothing(world):
    """
    An invitation that names no address can only be accepted signed in: anonymously, with or
    without an address and password, it is 400 ``sign_in_required``; no account, membership,
    team membership or audit event is written, and the link stays usable.
    """
    email = f"{unique('drifter')}@example.com"
    _, secret = invite(world, team=str(world.t1.team.pk))
    before = (User.objects.count(), Membership.objects.count(), TeamMembership.objects.count(),
              AuditEvent.objects.count())
    for payload in ({"token": secret, "email": email, "password": PASSWORD}, {"token": secret}):
        error = assert_error(APIClient().post(ACCEPT, payload, format="json"), 400, "sign_in_required")
        assert error["detail"] == SIGN_IN_REQUIRED
    with pytest.raises(DomainError) as caught:
        services.invitation_accept(secret=secret, user=None, email=email, password=PASSWORD)
    assert caught.value.get_codes() == "sign_in_required"
    assert (User.objects.count(), Membership.objects.count(), TeamMembership.objects.count(),
            AuditEvent.objects.count()) == before
    assert not User.objects.filter(email=email).exists()
    assert Invitation.objects.get(digest=secret_digest(secret)).status == "pending"


def test_reusing_an_accepted_invitation_is_invitation_invalid(world):
    """An accepted link is spent: accepting again, signed in or not, is 400 ``invitation_invalid`` and adds nobody."""
    _, secret = invite(world)
    first = session(world.users["t2_member"]).post(ACCEPT, {"token": secret}, format="json")
    assert first.status_code == 201, first.content
    members, users = Membership.objects.count(), User.objects.count()

    again = session(world.users["t2_owner"]).post(ACCEPT, {"token": secret}, format="json")
    error = assert_error(again, 400, "invitation_invalid")
    assert error["detail"] == INVITATION_INVALID
    again = APIClient().post(ACCEPT, {"token": secret, "email": "second@example.com", "password": PASSWORD},
                             format="json")
    error = assert_error(again, 400, "invitation_invalid")
    assert error["detail"] == INVITATION_INVALID
    assert (Membership.objects.count(), User.objects.count()) == (members, users)
    assert not Membership.objects.filter(user=world.users["t2_owner"], tenant=world.t1.tenant).exists()
    assert not User.objects.filter(email="second@example.com").exists()
    assert Invitation.objects.get(digest=secret_digest(secret)).accepted_by == world.users["t2_member"]


def test_reusing_an_accepted_email_bound_invitation_is_invitation_invalid(world):
    """A spent link bound to an address creates no second account for that address either."""
    email = f"{unique('once')}@example.com"
    _, secret = invite(world, email=email)
    first = APIClient().post(ACCEPT, {"token": secret, "email": email, "password": PASSWORD}, format="json")
    assert first.status_code == 201, first.content
    members = Membership.objects.count()
    again = APIClient().post(ACCEPT, {"token": secret, "email": email, "password": "another-Pass-777"},
                             format="json")
    assert_error(again, 400, "invitation_invalid")
    assert Membership.objects.count() == members
    assert User.objects.filter(email__iexact=email).count() == 1
    assert User.objects.get(email=email).check_password(PASSWORD)


def test_expired_invitation_is_invitation_invalid(world):
    """After the invitation TTL the link no longer works (400 ``invitation_invalid``)."""
    body, secret = invite(world, email="late@example.com")
    expires_at = Invitation.objects.get(pk=body["id"]).expires_at
    with time_machine.travel(expires_at + timedelta(seconds=1), tick=False):
        response = APIClient().post(ACCEPT, {"token": secret, "email": "late@example.com", "password": PASSWORD},
                                    format="json")
    assert_error(response, 400, "invitation_invalid")
    assert not User.objects.filter(email="late@example.com").exists()


def test_invitation_is_valid_until_its_ttl(world):
    """Just before expiry the same kind of link still works."""
    body, secret = invite(world, email="ontime@example.com")
    expires_at = Invitation.objects.get(pk=body["id"]).expires_at
    assert abs(expires_at - timezone.now() - settings.MERIDIAN_INVITATION_TTL) < timedelta(minutes=1)
    with time_machine.travel(expires_at - timedelta(seconds=1), tick=False):
        response = APIClient().post(ACCEPT, {"token": secret, "email": "ontime@example.com", "password": PASSWORD},
                                    format="json")
    assert response.status_code == 201, response.content


def test_revoked_invitation_is_invitation_invalid(world):
    """DELETE revokes a pending invitation (204); accepting it then is 400 ``invitation_invalid``."""
    body, secret = invite(world, email="gone@example.com")
    assert world.client("t1_admin").delete(f"{INVITATIONS}{body['id']}/").status_code == 204
    response = APIClient().post(ACCEPT, {"token": secret, "email": "gone@example.com", "password": PASSWORD},
                                format="json")
    assert_error(response, 400, "invitation_invalid")
    assert not User.objects.filter(email="gone@example.com").exists()
    response = session(world.users["t2_member"]).post(ACCEPT, {"token": secret}, format="json")
    assert_error(response, 400, "invitation_invalid")


def test_revoking_an_accepted_invitation_is_409(world):
    """Only a pending invitation can be revoked: an accepted one is 409 ``invalid_state`` and stays accepted."""
    body, secret = invite(world, email="done@example.com")
    accepted = APIClient().post(ACCEPT, {"token": secret, "email": "done@example.com", "password": PASSWORD},
                                format="json")
    assert accepted.status_code == 201, accepted.content
    assert_error(world.client("t1_admin").delete(f"{INVITATIONS}{body['id']}/"), 409, "invalid_state")
    invitation = Invitation.objects.get(pk=body["id"])
    assert invitation.status == "accepted"
    assert invitation.revoked_at is None
    assert Membership.objects.filter(user__email="done@example.com", tenant=world.t1.tenant).exists()


@pytest.mark.parametrize("state", ["revoked", "expired"])
def test_revoking_a_revoked_or_expired_invitation_is_409(world, state):
    """A revoked or expired invitation is not pending either: revoking it is 409 ``invalid_state``."""
    body, _ = invite(world)
    invitation = Invitation.objects.get(pk=body["id"])
    actor = world.principal("t1_admin")
    when = timezone.now()
    if state == "revoked":
        assert world.client("t1_admin").delete(f"{INVITATIONS}{body['id']}/").status_code == 204
    else:
        when = invitation.expires_at + timedelta(seconds=1)
    revoked_at = Invitation.objects.get(pk=body["id"]).revoked_at
    with time_machine.travel(when, tick=False):
        assert_error(world.client("t1_admin").delete(f"{INVITATIONS}{body['id']}/"), 409, "invalid_state")
        with pytest.raises(Conflict) as caught:
            services.invitation_revoke(actor=actor, invitation=invitation)
        assert caught.value.get_codes() == "invalid_state"
        invitation.refresh_from_db()
        assert (invitation.status, invitation.revoked_at) == (state, revoked_at)


def test_unknown_invitation_secret_is_invitation_invalid(world):
    """A well-formed secret that was never issued reads exactly like a spent one."""
    response = APIClient().post(
        ACCEPT, {"token": INVITATION_PREFIX + "A" * 43, "email": "who@example.com", "password": PASSWORD},
        format="json",
    )
    assert_error(response, 400, "invitation_invalid")


def test_email_bound_invitation_refuses_another_address(world):
    """An invitation for one address cannot be accepted by another, anonymously or signed in."""
    _, secret = invite(world, email="intended@example.com")
    response = APIClient().post(ACCEPT, {"token": secret, "email": "intruder@example.com", "password": PASSWORD},
                                format="json")
    assert_error(response, 400, "invitation_invalid")
    assert not User.objects.filter(email="intruder@example.com").exists()

    client = APIClient()
    client.force_login(world.users["t2_member"])
    assert_error(client.post(ACCEPT, {"token": secret}, format="json"), 400, "invitation_invalid")
    assert not Membership.objects.filter(user=world.users["t2_member"], tenant=world.t1.tenant).exists()
    assert Invitation.objects.get(digest=secret_digest(secret)).status == "pending"


def test_email_bound_invitation_matches_the_address_regardless_of_case(world):
    """The intended person may type their address in another case."""
    _, secret = invite(world, email="cased@example.com")
    response = APIClient().post(ACCEPT, {"token": secret, "email": "Cased@Example.COM", "password": PASSWORD},
                                format="json")
    assert response.status_code == 201, response.content


@pytest.mark.parametrize("with_password", [True, False], ids=["password-set", "no-password"])
def test_anonymous_accept_for_an_address_that_has_an_account_is_409(world, with_password):
    """
    A link bound to an address that already has an account (with a password or not yet) cannot
    create or claim it anonymously: 409 ``account_exists``, the password untouched, no membership.
    The account's holder signs in and accepts the same link.
    """
    existing = world.users["t2_member"]
    if with_password:
        existing.set_password(PASSWORD)
        existing.save(update_fields=["password"])
    assert existing.has_usable_password() is with_password
    _, secret = invite(world, email=existing.email)
    response = APIClient().post(ACCEPT, {"token": secret, "email": existing.email.upper(),
                                         "password": "another-Pass-777"}, format="json")
    assert_error(response, 409, "account_exists")
    existing.refresh_from_db()
    assert existing.has_usable_password() is with_password
    assert not existing.check_password("another-Pass-777")
    if with_password:
        assert existing.check_password(PASSWORD)
    assert User.objects.filter(email__iexact=existing.email).count() == 1
    assert not Membership.objects.filter(user=existing, tenant=world.t1.tenant).exists()
    assert Invitation.objects.get(digest=secret_digest(secret)).status == "pending"

    accepted = session(existing).post(ACCEPT, {"token": secret}, format="json")
    assert accepted.status_code == 201, accepted.content
    assert Membership.objects.get(user=existing, tenant=world.t1.tenant).role == TenantRole.MEMBER


def test_anonymous_accept_with_a_weak_password_is_400(world):
    """The password validators apply: a short or common password is a 400 on ``password``."""
    _, secret = invite(world, email="weak@example.com")
    response = APIClient().post(ACCEPT, {"token": secret, "email": "weak@example.com", "password": "password"},
                                format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert {e["attr"] for e in errors} == {"password"}
    assert {"password_too_short", "password_too_common"} <= {e["code"] for e in errors}
    assert not User.objects.filter(email="weak@example.com").exists()
    assert Invitation.objects.get(digest=secret_digest(secret)).status == "pending"


def test_another_invitation_cannot_take_over_a_new_tenants_owner_invitation(world):
    """
    A tenant made for a new address has no owner and no account until its owner link is accepted.
    An open invitation of another tenant cannot be used anonymously at all, so it cannot make the
    account; a link of another tenant bound to that address makes the account there, and that
    account gains nothing in the new tenant: the owner link then works only for that account,
    signed in. Staff creating a tenant for that address are told an account exists.
    """
    email = f"{unique('pending-owner')}@example.com"
    created = world.client("platform_admin").post(
        TENANTS, {"name": "Fresh", "slug": unique("fresh"), "owner_email": email}, format="json"
    )
    assert created.status_code == 201, created.content
    assert created.json()["existing_account"] is False
    fresh = Tenant.objects.get(pk=created.json()["id"])
    owner_secret = secret_of(created.json()["invitation_link"])
    assert not User.objects.filter(email__iexact=email).exists()
    assert not Membership.objects.filter(tenant=fresh).exists()

    # (b) An open invitation of tenant 1 cannot make the account anonymously.
    _, open_secret = invite(world, "t1_admin")
    response = APIClient().post(ACCEPT, {"token": open_secret, "email": email, "password": "attacker-Chosen-99"},
                                format="json")
    assert_error(response, 400, "sign_in_required")
    assert not User.objects.filter(email__iexact=email).exists()
    assert Invitation.objects.get(digest=secret_digest(open_secret)).status == "pending"

    # (c) A tenant-1 link bound to the address makes the account, in tenant 1 only.
    _, bound_secret = invite(world, "t1_admin", email=email)
    joined = APIClient().post(ACCEPT, {"token": bound_secret, "email": email, "password": PASSWORD}, format="json")
    assert joined.status_code == 201, joined.content
    account = User.objects.get(email=email)
    assert Membership.objects.get(user=account, tenant=world.t1.tenant).role == TenantRole.MEMBER
    assert not Membership.objects.filter(tenant=fresh).exists()

    # The owner link can no longer be accepted anonymously, nor by anybody else signed in ...
    response = APIClient().post(ACCEPT, {"token": owner_secret, "email": email, "password": "attacker-Chosen-99"},
                                format="json")
    assert_error(response, 409, "account_exists")
    account.refresh_from_db()
    assert account.check_password(PASSWORD)
    response = session(world.users["t1_admin"]).post(ACCEPT, {"token": owner_secret}, format="json")
    assert_error(response, 400, "invitation_invalid")
    assert not Membership.objects.filter(tenant=fresh).exists()
    assert Invitation.objects.get(digest=secret_digest(owner_secret)).status == "pending"

    # ... only by that account, signed in.
    accepted = session(account).post(ACCEPT, {"token": owner_secret}, format="json")
    assert accepted.status_code == 201, accepted.content
    assert accepted.json()["role"] == TenantRole.OWNER
    assert list(Membership.objects.filter(tenant=fresh).values_list("user", "role")) == [
        (account.pk, TenantRole.OWNER)
    ]

    # Staff creating another tenant for the address now see that an account exists.
    again = world.client("platform_admin").post(
        TENANTS, {"name": "Fresher", "slug": unique("fresher"), "owner_email": email.upper()}, format="json"
    )
    assert again.status_code == 201, again.content
    assert again.json()["existing_account"] is True
    assert not Membership.objects.filter(tenant_id=again.json()["id"]).exists()


def test_accepting_never_lowers_an_existing_role(world):
    """A member accepting a viewer invitation stays member; an admin invitation raises them to admin."""
    user = world.users["t1_member"]
    client = APIClient()
    client.force_login(user)
    _, viewer_secret = invite(world, role=TenantRole.VIEWER)
    assert client.post(ACCEPT, {"token": viewer_secret}, format="json").status_code == 201
    assert membership_of(world, "t1_member").role == TenantRole.MEMBER
    _, admin_secret = invite(world, role=TenantRole.ADMIN)
    assert client.post(ACCEPT, {"token": admin_secret}, format="json").status_code == 201
    assert membership_of(world, "t1_member").role == TenantRole.ADMIN


def test_admin_cannot_invite_an_owner(world):
    """Granting owner through an invitation is for owners only: 403 from an admin, 201 from an owner."""
    before = Invitation.objects.count()
    response = world.client("t1_admin").post(INVITATIONS, {"role": "owner"}, format="json")
    assert_error(response, 403, "permission_denied")
    assert Invitation.objects.count() == before
    assert world.client("t1_owner").post(INVITATIONS, {"role": "owner"}, format="json").status_code == 201


def test_member_cannot_invite(world):
    """Invitations are for tenant admins and owners."""
    assert_error(world.client("t1_member").post(INVITATIONS, {"role": "viewer"}, format="json"),
                 403, "permission_denied")


#
# Tenants
#


def test_platform_admin_creates_a_tenant_for_a_new_owner_with_an_invitation_link(world):
    """
    A new owner address gets an owner invitation bound to it and its link (shown once); no account
    or membership exists until the link is accepted, which creates the account as owner.
    """
    slug, email = unique("acme"), f"{unique('boss')}@acme.example"
    response = world.client("platform_admin").post(
        TENANTS, {"name": "Acme", "slug": slug, "owner_email": email}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["slug"] == slug
    assert body["owner_email"] == email
    assert body["existing_account"] is False
    assert body["invitation_link"].startswith(f"{settings.MERIDIAN_PUBLIC_URL.rstrip('/')}/invitations/mri_")
    tenant = Tenant.objects.get(slug=slug)
    assert not User.objects.filter(email__iexact=email).exists()
    assert not Membership.objects.filter(tenant=tenant).exists()
    secret = secret_of(body["invitation_link"])
    invitation = Invitation.objects.get(tenant=tenant)
    assert (invitation.email, invitation.role, invitation.status) == (email, TenantRole.OWNER, "pending")
    assert invitation.digest == secret_digest(secret)

    accepted = APIClient().post(ACCEPT, {"token": secret, "email": email, "password": PASSWORD}, format="json")
    assert accepted.status_code == 201, accepted.content
    assert accepted.json()["role"] == TenantRole.OWNER
    owner = User.objects.get(email=email)
    assert owner.check_password(PASSWORD)
    assert Membership.objects.get(tenant=tenant, user=owner).role == TenantRole.OWNER


def test_platform_admin_creates_a_tenant_for_an_existing_user_with_a_link_to_accept_signed_in(world):
    """
    An existing account is not made owner at once: staff get the owner link and
    ``existing_account: true``; the link cannot be used anonymously for that address (409), and
    the user becomes owner only when they accept it signed in.
    """
    existing = world.users["t2_member"]
    slug = unique("beta")
    response = world.client("platform_admin").post(
        TENANTS, {"name": "Beta", "slug": slug, "owner_email": existing.email.upper()}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["invitation_link"] is not None
    assert body["invitation_link"].startswith(f"{settings.MERIDIAN_PUBLIC_URL.rstrip('/')}/invitations/mri_")
    assert body["existing_account"] is True
    assert body["owner_email"] == existing.email.lower()
    tenant = Tenant.objects.get(slug=slug)
    assert not Membership.objects.filter(tenant=tenant).exists()
    invitation = Invitation.objects.get(tenant=tenant)
    assert (invitation.email, invitation.role, invitation.status) == (existing.email.lower(), TenantRole.OWNER,
                                                                      "pending")
    secret = secret_of(body["invitation_link"])

    response = APIClient().post(ACCEPT, {"token": secret, "email": existing.email, "password": PASSWORD},
                                format="json")
    assert_error(response, 409, "account_exists")
    existing.refresh_from_db()
    assert not existing.has_usable_password()
    assert not Membership.objects.filter(tenant=tenant).exists()

    accepted = session(existing).post(ACCEPT, {"token": secret}, format="json")
    assert accepted.status_code == 201, accepted.content
    assert accepted.json()["role"] == TenantRole.OWNER
    assert Membership.objects.get(tenant=tenant, user=existing).role == TenantRole.OWNER
    assert Invitation.objects.get(pk=invitation.pk).status == "accepted"


@pytest.mark.parametrize("persona", ["t1_owner", "platform_approver"])
def test_only_platform_admins_create_tenants(world, persona):
    """A tenant owner or a platform approver posting a tenant gets 403 and nothing is made."""
    slug = unique("nope")
    response = world.client(persona).post(
        TENANTS, {"name": "Nope", "slug": slug, "owner_email": "x@example.com"}, format="json"
    )
    assert_error(response, 403, "permission_denied")
    assert not Tenant.objects.filter(slug=slug).exists()


def test_duplicate_tenant_slug_is_409(world):
    """Tenant slugs are global handles: a second one is 409 ``duplicate``."""
    response = world.client("platform_admin").post(
        TENANTS, {"name": "Dup", "slug": world.t1.tenant.slug, "owner_email": "dup@example.com"}, format="json"
    )
    assert_error(response, 409, "duplicate")
    assert not User.objects.filter(email="dup@example.com").exists()
    assert not Invitation.objects.filter(email="dup@example.com").exists()


#
# The session principal
#


@pytest.fixture
def two_tenant_user(world) -> User:
    """t1_owner, also a member of tenant 2."""
    user = world.users["t1_owner"]
    Membership.objects.create(tenant=world.t2.tenant, user=user, role=TenantRole.MEMBER)
    return user


def session(user: User, tenant: str | None = None) -> APIClient:
    client = APIClient()
    client.force_login(user)
    if tenant is not None:
        client.credentials(HTTP_X_MERIDIAN_TENANT=tenant)
    return client


def test_session_of_a_single_tenant_user_acts_in_that_tenant(world):
    """Without the header, a user of one tenant acts in it."""
    acting = session(world.users["t1_member"]).get(ME).json()["acting_as"]
    assert acting["tenant"] == str(world.t1.tenant.pk)
    assert acting["role"] == TenantRole.MEMBER
    assert acting["token"] is None


def test_session_header_picks_the_tenant_by_slug(world, two_tenant_user):
    """``X-Meridian-Tenant: <slug>`` acts in that tenant with the user's role there."""
    client = session(two_tenant_user, world.t2.tenant.slug)
    acting = client.get(ME).json()["acting_as"]
    assert acting["tenant"] == str(world.t2.tenant.pk)
    assert acting["role"] == TenantRole.MEMBER
    teams = client.get(TEAMS)
    assert teams.status_code == 200, teams.content
    assert {t["id"] for t in teams.json()["results"]} == {str(world.t2.team.pk)}


def test_session_header_picks_the_tenant_by_id(world, two_tenant_user):
    """``X-Meridian-Tenant: <uuid>`` acts in that tenant too."""
    acting = session(two_tenant_user, str(world.t1.tenant.pk)).get(ME).json()["acting_as"]
    assert acting["tenant"] == str(world.t1.tenant.pk)
    assert acting["role"] == TenantRole.OWNER


@pytest.mark.parametrize("hint", ["no-such-tenant", "00000000-0000-0000-0000-000000000000", "t2"])
def test_session_header_naming_an_unknown_tenant_is_404(world, hint):
    """A tenant that does not exist, or is not one of the user's, is a 404 ``tenant_not_found``."""
    if hint == "t2":
        hint = world.t2.tenant.slug
    response = session(world.users["t1_member"], hint).get(TEAMS)
    assert_error(response, 404, "tenant_not_found")


def test_session_of_a_two_tenant_user_without_header_is_tenant_required(world, two_tenant_user):
    """A user in two tenants must choose one for tenant routes: 400 ``tenant_required``."""
    response = session(two_tenant_user).get(TEAMS)
    error = assert_error(response, 400, "tenant_required")
    assert error["detail"] == TENANT_REQUIRED
    assert session(two_tenant_user).get(ME).json()["acting_as"]["tenant"] is None


#
# Quotas
#


@pytest.fixture
def gpu_models(db) -> tuple[GPUModel, GPUModel]:
    def model(slug):
        return GPUModel.objects.create(slug=unique(slug), name=slug, memory_gib=80, memory_bandwidth_tbs="3.35",
                                       fp16_tflops="989.4", tdp_watts=700)

    return model("quota-a"), model("quota-b")


def test_quota_default_comes_from_settings_when_the_tenant_has_no_row(world, settings):
    """With no tenant row, the one limit is MERIDIAN_DEFAULT_QUOTAS for the resource, marked as default."""
    settings.MERIDIAN_DEFAULT_QUOTAS = {"gpus": 7, "vpcs": 3, "instances": 5}
    limits = quota_limits(tenant=world.t1.tenant, resource=QuotaResource.VPCS)
    assert [(q.scope, q.limit, q.is_default) for q in limits] == [("tenant", 3, True)]
    limits = quota_limits(tenant=world.t1.tenant, resource=QuotaResource.GPUS)
    assert [(q.scope, q.limit, q.is_default) for q in limits] == [("tenant", 7, True)]


def test_quota_tenant_row_replaces_the_default(world):
    """A tenant row for the resource is the tenant's limit; the default no longer applies."""
    Quota.objects.create(tenant=world.t1.tenant, resource=QuotaResource.VPCS, limit=2)
    Quota.objects.create(tenant=world.t2.tenant, resource=QuotaResource.VPCS, limit=99)
    limits = quota_limits(tenant=world.t1.tenant, resource=QuotaResource.VPCS)
    assert [(q.scope, q.limit, q.is_default) for q in limits] == [("tenant", 2, False)]


def test_quota_team_row_applies_with_the_tenant_limit(world):
    """A team's row bounds the team, on top of the tenant's (default) limit; other teams' rows do not."""
    other = Team.objects.create(tenant=world.t1.tenant, name="Other", slug=unique("other"))
    Quota.objects.create(tenant=world.t1.tenant, team=other, resource=QuotaResource.GPUS, limit=1)
    team_row = world.t1.objects[Quota]  # 16 GPUs for world.t1.team
    limits = quota_limits(tenant=world.t1.tenant, resource=QuotaResource.GPUS, team=world.t1.team)
    assert sorted((q.scope, q.limit, q.is_default) for q in limits) == [
        ("team", team_row.limit, False),
        ("tenant", settings.MERIDIAN_DEFAULT_QUOTAS["gpus"], True),
    ]
    # Without the team, the team's row is not a tenant limit.
    limits = quota_limits(tenant=world.t1.tenant, resource=QuotaResource.GPUS)
    assert [(q.scope, q.is_default) for q in limits] == [("tenant", True)]


def test_quota_per_gpu_model_row_applies_to_that_model_only(world, gpu_models):
    """A row naming a GPU model bounds requests for that model and not for another one."""
    a, b = gpu_models
    Quota.objects.create(tenant=world.t1.tenant, resource=QuotaResource.GPUS, gpu_model=a, limit=4)
    Quota.objects.create(tenant=world.t1.tenant, resource=QuotaResource.GPUS, limit=40)
    for_a = quota_limits(tenant=world.t1.tenant, resource=QuotaResource.GPUS, gpu_model=a)
    assert sorted((q.limit, q.gpu_model_id) for q in for_a) == [(4, a.pk), (40, None)]
    for_b = quota_limits(tenant=world.t1.tenant, resource=QuotaResource.GPUS, gpu_model=b)
    assert [(q.limit, q.gpu_model_id) for q in for_b] == [(40, None)]


def test_quota_per_gpu_model_row_does_not_lift_the_overall_default(world, gpu_models, settings):
    """
    A per-model cap narrows, it does not replace the overall GPU limit: with only a model row, a
    request for that model is still bounded by the default limit on all models together.
    """
    settings.MERIDIAN_DEFAULT_QUOTAS = {"gpus": 64, "vpcs": 10, "instances": 32}
    a, b = gpu_models
    Quota.objects.create(tenant=world.t1.tenant, resource=QuotaResource.GPUS, gpu_model=a, limit=8)
    limits = quota_limits(tenant=world.t1.tenant, resource=QuotaResource.GPUS, gpu_model=a)
    assert sorted((q.limit, q.gpu_model_id, q.is_default) for q in limits) == [(8, a.pk, False), (64, None, True)]

    # 60 GPUs of model b in use, 8 of model a asked: the model-a cap allows it, the overall 64 does not.
    def in_use(limit):
        return 0 if limit.gpu_model_id == a.pk else 60

    with pytest.raises(QuotaExceeded) as caught:
        quota_check(tenant=world.t1.tenant, resource=QuotaResource.GPUS, asked=8, in_use=in_use, gpu_model=a)
    assert caught.value.meta["limit"] == 64


def test_quota_check_passes_up_to_the_limit_and_raises_beyond(world):
    """Exactly the limit is allowed; one more is QuotaExceeded (409) with limit, in_use and asked."""
    Quota.objects.create(tenant=world.t1.tenant, resource=QuotaResource.INSTANCES, limit=10)
    quota_check(tenant=world.t1.tenant, resource=QuotaResource.INSTANCES, asked=2, in_use=lambda limit: 8)
    with pytest.raises(QuotaExceeded) as caught:
        quota_check(tenant=world.t1.tenant, resource=QuotaResource.INSTANCES, asked=3, in_use=lambda limit: 8)
    exc = caught.value
    assert exc.status_code == 409
    assert exc.get_codes() == "quota_exceeded"
    assert exc.meta == {"scope": "tenant", "resource": "instances", "limit": 10, "in_use": 8, "asked": 3}


def test_quota_check_names_the_team_limit_that_was_hit(world):
    """A team at its quota asking for more is refused with the team's numbers, though the tenant has room."""
    team_row = world.t1.objects[Quota]

    def in_use(limit):
        return team_row.limit - 1 if limit.scope == "team" else 0

    with pytest.raises(QuotaExceeded) as caught:
        quota_check(tenant=world.t1.tenant, resource=QuotaResource.GPUS, asked=2, in_use=in_use, team=world.t1.team)
    assert caught.value.meta["scope"] == "team"
    assert caught.value.meta["limit"] == team_row.limit
    quota_check(tenant=world.t1.tenant, resource=QuotaResource.GPUS, asked=1, in_use=in_use, team=world.t1.team)


def test_quota_exceeded_renders_as_409_with_meta(world):
    """The API's error handler turns QuotaExceeded into a 409 body whose error carries the numbers."""
    exc = QuotaExceeded(scope="tenant", resource="gpus", limit=8, in_use=6, asked=4)
    response = exception_handler(exc, {"view": None, "args": (), "kwargs": {}, "request": None})
    assert response.status_code == 409
    error = response.data["errors"][0]
    assert error["code"] == "quota_exceeded"
    assert error["meta"]["limit"] == 8
    assert error["meta"]["in_use"] == 6
    assert error["meta"]["asked"] == 4


def test_quota_set_keeps_one_row_per_owner_resource_and_model(world):
    """Setting a quota twice updates the row instead of adding one."""
    actor = world.principal("platform_admin")
    first, created = services.quota_set(actor=actor, tenant=world.t1.tenant, resource=QuotaResource.VPCS, limit=3)
    second, again = services.quota_set(actor=actor, tenant=world.t1.tenant, resource=QuotaResource.VPCS, limit=5)
    assert (created, again) == (True, False)
    assert first.pk == second.pk
    assert Quota.objects.get(pk=first.pk).limit == 5
