"""
The API-token lifecycle through the real API: issue, use, expire, revoke, refuse bad input.

Tokens are ``mrd_<prefix>_<secret>``, stored as prefix + SHA-256 digest, shown once. Every bad
token is a 401 with one body shape; a token never comes from the query string.
"""

import io
import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from security.models import AuditEvent
from tenants import services
from tenants.authentication import TOKEN_INVALID
from tenants.choices import PlatformRole, TenantRole, TokenScope
from tenants.models import APIToken, Membership, Team, TeamMembership, secret_digest
from tenants.permissions import READ_ONLY_TOKEN
from tenants.services import TOKEN_PREFIX
from tests.world import small_fleet, unique

TOKENS = "/api/v1/api-tokens/"
ME = "/api/v1/me/"
TEAMS = "/api/v1/teams/"

INVALID_BODY = {"type": "client_error", "errors": [{"code": "token_invalid", "detail": TOKEN_INVALID, "attr": None}]}


def bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def the_error(response) -> dict:
    """The single error of a standardized error body."""
    body = response.json()
    assert set(body) == {"type", "errors"}, body
    assert len(body["errors"]) == 1, body
    error = body["errors"][0]
    assert {"code", "detail", "attr"} <= set(error), error
    return error


def assert_error(response, status: int, code: str, attr: str | None = None) -> dict:
    assert response.status_code == status, (response.status_code, response.content)
    error = the_error(response)
    assert error["code"] == code, error
    if attr is not None:
        assert error["attr"] == attr, error
    return error


def issue(world, persona: str, **payload) -> dict:
    """Issue a token through the API as ``persona``; the 201 body (with the plaintext ``token``)."""
    payload.setdefault("name", unique("cli"))
    response = world.client(persona).post(TOKENS, payload, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def row_as_text(model, pk) -> str:
    """Every column of one row, as PostgreSQL's JSON text of the whole row."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT row_to_json(t)::text FROM {model._meta.db_table} t WHERE id = %s", [pk])  # noqa: S608
        return cursor.fetchone()[0]


#
# Issue: shown once, stored as prefix + digest
#


def test_issued_token_is_returned_once_with_the_documented_format(world):
    """POST returns the plaintext once, as mrd_<12 hex>_<43 url-safe chars>, for the caller in their tenant."""
    body = issue(world, "t1_member", scope="read_write")
    secret = body["token"]
    assert secret.startswith(TOKEN_PREFIX)
    prefix = secret.split("_")[1]
    assert len(prefix) == 12
    assert len(secret) == len(TOKEN_PREFIX) + 12 + 1 + 43
    assert body["display"] == f"mrd_{prefix}_…"
    assert body["scope"] == "read_write"
    assert body["user"] == world.users["t1_member"].email
    token = APIToken.objects.get(pk=body["id"])
    assert token.user == world.users["t1_member"]
    assert token.tenant == world.t1.tenant
    assert token.prefix == prefix


def test_plaintext_token_never_appears_in_later_reads(world):
    """GET of the token and the token list show the public prefix only, never the plaintext."""
    client = world.client("t1_member")
    body = issue(world, "t1_member")
    secret = body["token"]

    detail = client.get(f"{TOKENS}{body['id']}/")
    assert detail.status_code == 200, detail.content
    assert "token" not in detail.json()
    assert secret not in detail.content.decode()

    listing = client.get(TOKENS)
    assert listing.status_code == 200, listing.content
    items = listing.json()["results"]
    assert body["id"] in {item["id"] for item in items}
    assert all("token" not in item for item in items)
    assert secret not in listing.content.decode()


def test_token_is_stored_only_as_prefix_and_sha256_digest(world):
    """No column of the token row (nor any audit event) holds the secret; the digest is its SHA-256."""
    body = issue(world, "t1_member")
    secret = body["token"]
    random_part = secret.split("_", 2)[2]
    token = APIToken.objects.get(pk=body["id"])

    assert token.digest == secret_digest(secret)
    row = row_as_text(APIToken, token.pk)
    assert token.prefix in row  # the row really is the one we look at
    assert secret not in row
    assert random_part not in row

    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM {AuditEvent._meta.db_table} t WHERE row_to_json(t)::text LIKE %s",  # noqa: S608
            [f"%{random_part}%"],
        )
        assert cursor.fetchone()[0] == 0
    assert AuditEvent.objects.filter(action="api_token.create", target_id=str(token.pk)).count() == 1


#
# Use
#


def test_issued_token_authenticates_with_bearer_header(world):
    """The new token works at once as ``Authorization: Bearer``; /me says which token and tenant."""
    body = issue(world, "t1_member", scope="read_write")
    response = bearer(body["token"]).get(ME)
    assert response.status_code == 200, response.content
    acting = response.json()["acting_as"]
    assert acting["token"] == body["id"]
    assert acting["tenant"] == str(world.t1.tenant.pk)
    assert acting["role"] == TenantRole.MEMBER
    assert acting["scope"] == "read_write"
    assert acting["platform"] is False


def test_last_used_at_is_set_when_the_token_is_used(world):
    """A token never used has no last_used_at; the first authenticated request stamps it."""
    body = issue(world, "t1_member")
    assert body["last_used_at"] is None
    token = APIToken.objects.get(pk=body["id"])
    assert token.last_used_at is None

    before = timezone.now()
    assert bearer(body["token"]).get(ME).status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None
    assert before <= token.last_used_at <= timezone.now()

    shown = bearer(body["token"]).get(f"{TOKENS}{body['id']}/").json()
    assert shown["last_used_at"] is not None


def test_missing_authorization_is_refused_with_401(world):
    """A protected route without credentials is a 401 in the standard error shape."""
    response = world.client("anon").get(TEAMS)
    assert_error(response, 401, "not_authenticated")


def test_token_in_query_string_is_not_accepted(world):
    """``?token=`` is never read: the request is anonymous, hence 401, and the same token works as a header."""
    secret = world.tokens["t1_member"]
    response = APIClient().get(f"{TEAMS}?token={secret}")
    assert response.status_code == 401, response.content
    assert the_error(response)["code"] in {"not_authenticated", "token_invalid"}
    assert world.client("t1_member").get(TEAMS).status_code == 200


#
# Expiry
#


def test_expired_token_is_refused_with_token_expired(world):
    """A token works until its expires_at and is a 401 ``token_expired`` one second after."""
    body = issue(world, "t1_member", expires_in_days=1)
    token = APIToken.objects.get(pk=body["id"])
    assert token.expires_at is not None

    with time_machine.travel(token.expires_at - timedelta(seconds=1), tick=False):
        assert bearer(body["token"]).get(ME).status_code == 200
    with time_machine.travel(token.expires_at + timedelta(seconds=1), tick=False):
        response = bearer(body["token"]).get(ME)
    assert_error(response, 401, "token_expired")
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(("days", "code"), [(0, "min_value"), (-1, "min_value"), (366, "invalid"),
                                            (36_500, "invalid"), (36_501, "max_value")])
def test_expires_in_days_outside_one_to_max_ttl_is_400(world, days, code):
    """expires_in_days must be 1..MERIDIAN_TOKEN_MAX_TTL (365) days; 0, -1, 366 and 100 years are refused."""
    before = APIToken.objects.count()
    response = world.client("t1_member").post(TOKENS, {"name": "x", "expires_in_days": days}, format="json")
    assert_error(response, 400, code, attr="expires_in_days")
    assert APIToken.objects.count() == before


def test_expires_in_days_at_the_max_ttl_is_accepted(world):
    """Exactly the maximum lifetime is allowed and lands about that far ahead."""
    body = issue(world, "t1_member", expires_in_days=settings.MERIDIAN_TOKEN_MAX_TTL.days)
    token = APIToken.objects.get(pk=body["id"])
    assert abs(token.expires_at - (timezone.now() + settings.MERIDIAN_TOKEN_MAX_TTL)) < timedelta(minutes=1)


def test_expires_at_in_the_past_is_400(world):
    """An expiry already passed cannot be issued."""
    before = APIToken.objects.count()
    past = (timezone.now() - timedelta(minutes=5)).isoformat()
    response = world.client("t1_member").post(TOKENS, {"name": "x", "expires_at": past}, format="json")
    assert_error(response, 400, "invalid", attr="expires_at")
    assert APIToken.objects.count() == before


def test_expires_at_beyond_max_ttl_is_400(world):
    """expires_at further ahead than the maximum lifetime is refused like expires_in_days."""
    later = (timezone.now() + settings.MERIDIAN_TOKEN_MAX_TTL + timedelta(days=1)).isoformat()
    response = world.client("t1_member").post(TOKENS, {"name": "x", "expires_at": later}, format="json")
    assert_error(response, 400, "invalid", attr="expires_at")


def test_expires_at_and_expires_in_days_together_is_400(world):
    """Give one expiry or the other, not both."""
    before = APIToken.objects.count()
    later = (timezone.now() + timedelta(days=2)).isoformat()
    response = world.client("t1_member").post(
        TOKENS, {"name": "x", "expires_at": later, "expires_in_days": 3}, format="json"
    )
    assert_error(response, 400, "invalid", attr="expires_in_days")
    assert APIToken.objects.count() == before


def test_token_cannot_outlive_the_token_that_issues_it(world):
    """
    A token with an expiry may only issue tokens that expire no later than itself; the refusal
    names the field the request used and says when the issuing token expires.
    """
    issued = issue(world, "t1_member", scope="read_write", expires_in_days=2)
    parent = bearer(issued["token"])
    before = APIToken.objects.count()
    assert_error(parent.post(TOKENS, {"name": "forever"}, format="json"), 400, "invalid", attr="expires_at")
    error = assert_error(parent.post(TOKENS, {"name": "longer", "expires_in_days": 3}, format="json"), 400,
                         "invalid", attr="expires_in_days")
    assert issued["expires_at"][:16].replace("T", " ") in error["detail"]
    assert APIToken.objects.count() == before
    assert parent.post(TOKENS, {"name": "shorter", "expires_in_days": 1}, format="json").status_code == 201


def test_the_api_guides_token_example_works_as_written(world):
    """The API guide issues a token on the command line, then an automation token with it: as written, it works."""
    readme = (Path(settings.BASE_DIR) / "docs" / "api.md").read_text()
    body = json.loads(re.search(r"-d '(\{\"name\": \"ci\".*?\})' \$API/api-tokens/", readme).group(1))
    out = io.StringIO()
    call_command("issue_token", world.users["t1_owner"].email, "--tenant", world.t1.tenant.slug, stdout=out)
    response = bearer(out.getvalue().strip()).post(TOKENS, body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["scope"] == body["scope"]


#
# A viewer's tokens only read
#


def viewer_session(world) -> APIClient:
    client = APIClient()
    client.force_login(world.users["t1_viewer"])
    return client


def test_a_viewer_gets_read_tokens_and_a_read_write_one_is_refused(world):
    """The roles table's promise: a viewer creates only read-only tokens (asking for more is a clear 403)."""
    client = viewer_session(world)
    before = APIToken.objects.count()
    error = assert_error(client.post(TOKENS, {"name": "rw", "scope": "read_write"}, format="json"), 403,
                         "token_scope_exceeds_role")
    assert "read" in error["detail"]
    assert APIToken.objects.count() == before
    made = client.post(TOKENS, {"name": "ro", "expires_in_days": 30}, format="json")
    assert made.status_code == 201 and made.json()["scope"] == "read"


def test_the_command_line_gives_a_viewer_a_read_token_and_refuses_read_write(world):
    viewer = world.users["t1_viewer"]
    out = io.StringIO()
    call_command("issue_token", viewer.email, "--tenant", world.t1.tenant.slug, stdout=out)
    assert APIToken.objects.get(prefix=out.getvalue().strip().split("_")[1]).scope == "read"
    with pytest.raises(CommandError, match="read"):
        call_command("issue_token", viewer.email, "--tenant", world.t1.tenant.slug, "--scope", "read_write",
                     stdout=io.StringIO())


#
# Revocation
#


def test_revoked_token_is_refused_with_token_revoked(world):
    """DELETE revokes (204); the very next request with the token is a 401 ``token_revoked``."""
    body = issue(world, "t1_member")
    assert bearer(body["token"]).get(ME).status_code == 200

    response = world.client("t1_member").delete(f"{TOKENS}{body['id']}/")
    assert response.status_code == 204, response.content
    token = APIToken.objects.get(pk=body["id"])
    assert token.revoked_at is not None

    assert_error(bearer(body["token"]).get(ME), 401, "token_revoked")


def test_revoking_twice_is_204_and_writes_one_audit_event(world):
    """A second DELETE of a revoked token changes nothing: 204, same revoked_at, no second event."""
    body = issue(world, "t1_member")
    client = world.client("t1_member")
    assert client.delete(f"{TOKENS}{body['id']}/").status_code == 204
    revoked_at = APIToken.objects.get(pk=body["id"]).revoked_at

    again = client.delete(f"{TOKENS}{body['id']}/")
    assert again.status_code == 204, again.content
    assert APIToken.objects.get(pk=body["id"]).revoked_at == revoked_at
    assert AuditEvent.objects.filter(action="api_token.revoke", target_id=body["id"]).count() == 1


def test_token_can_revoke_itself_and_then_stops_working(world):
    """Revoking the token that makes the request is allowed; its next use is refused."""
    body = issue(world, "t1_member", scope="read_write")
    own = bearer(body["token"])
    assert own.delete(f"{TOKENS}{body['id']}/").status_code == 204
    assert_error(own.get(ME), 401, "token_revoked")


#
# Bad tokens: one 401 body, never a 500
#


def _one_char_changed(secret: str) -> str:
    last = secret[-1]
    return secret[:-1] + ("A" if last != "A" else "B")


def _other_prefix(secret: str) -> str:
    prefix = secret.split("_")[1]
    flipped = ("0" if prefix[0] != "0" else "1") + prefix[1:]
    return secret.replace(prefix, flipped, 1)


BAD_TOKENS = {
    "prefix_only": lambda s: "mrd_",
    "one_char_changed": _one_char_changed,
    "wrong_prefix": _other_prefix,
    "wrong_type_prefix": lambda s: "mrx_" + s[len(TOKEN_PREFIX):],
    "jwt_like": lambda s: (
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwiYWRtaW4iOnRydWV9."
        "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
    ),
    "ten_kb_junk": lambda s: "A" * 10_240,
    "ten_kb_junk_after_valid_prefix": lambda s: s + "x" * 10_240,
    "sql_like": lambda s: "mrd_' OR '1'='1",
    "latin1_char": lambda s: s[:-1] + "é",
    # A real client sending UTF-8 bytes: WSGI hands them over decoded as latin-1.
    "utf8_non_ascii": lambda s: ("mrd_токен_" + "ü" * 43).encode().decode("latin-1"),
}


@pytest.mark.parametrize("case", sorted(BAD_TOKENS))
def test_bad_token_is_refused_with_token_invalid(world, case):
    """Every malformed, altered or unknown token gets the same 401 body, not a 500 and not a hint."""
    secret = world.tokens["t1_member"]
    raw = BAD_TOKENS[case](secret)
    assert raw != secret
    response = APIClient().get(TEAMS, HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 401, response.content
    assert response.json() == INVALID_BODY
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="meridian"'
    # The real token still works right after.
    assert world.client("t1_member").get(TEAMS).status_code == 200


@pytest.mark.parametrize("header", ["Bearer", "Bearer  ", "Bearer a b", "bearer mrd_ mrd_"])
def test_bearer_header_with_zero_or_two_values_is_token_invalid(world, header):
    """``Bearer`` with no value or with more than one is a 401 ``token_invalid``."""
    response = APIClient().get(TEAMS, HTTP_AUTHORIZATION=header)
    assert response.status_code == 401, response.content
    assert response.json() == INVALID_BODY


def test_token_of_an_inactive_user_is_token_invalid(world):
    """A deactivated user's token stops working, revealing nothing about why."""
    user = world.users["t1_member"]
    user.is_active = False
    user.save(update_fields=["is_active"])
    response = world.client("t1_member").get(ME)
    assert response.status_code == 401
    assert response.json() == INVALID_BODY


def test_scope_outside_the_enum_is_400_and_issues_nothing(world):
    """There is no ``admin`` scope: asking for one is a 400 on ``scope``, as is an unknown ``scopes`` field."""
    before = APIToken.objects.count()
    client = world.client("t1_member")
    assert_error(client.post(TOKENS, {"name": "x", "scope": "admin"}, format="json"), 400, "invalid_choice",
                 attr="scope")
    assert_error(client.post(TOKENS, {"name": "x", "scopes": ["admin"]}, format="json"), 400, "unknown_field",
                 attr="scopes")
    assert APIToken.objects.count() == before


def test_login_lock_holds_the_right_password_spares_neighbours_and_lifts_after_cool_off(world):
    """
    After the failure limit for one address from one IP, even the right password is refused until
    the cool-off has passed; another person signing in from the same IP is not affected.
    """
    password = "right-Horse-battery-42"
    user, neighbour = world.users["t1_member"], world.users["t1_viewer"]
    for person in (user, neighbour):
        person.set_password(password)
        person.save(update_fields=["password"])
    browser = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        browser.post("/login/", {"username": user.email, "password": "wrong-password-123"})
    locked = browser.post("/login/", {"username": user.email, "password": password})
    assert locked.status_code in (403, 429), locked.status_code
    assert browser.get(ME).status_code in (401, 403)

    other = Client().post("/login/", {"username": neighbour.email, "password": password})
    assert other.status_code == 302, other.status_code

    with time_machine.travel(timezone.now() + settings.AXES_COOLOFF_TIME + timedelta(seconds=1), tick=False):
        again = Client().post("/login/", {"username": user.email, "password": password})
    assert again.status_code == 302, again.status_code


#
# Scope and current role
#


def test_read_scope_token_cannot_write(world):
    """A read token may GET but any write is a 403 ``token_read_only``, whatever the user's role."""
    body = issue(world, "t1_owner")  # default scope: read
    assert body["scope"] == TokenScope.READ
    client = bearer(body["token"])
    assert client.get(TEAMS).status_code == 200

    before = Team.objects.count()
    response = client.post(TEAMS, {"name": "Nope", "slug": unique("nope")}, format="json")
    error = assert_error(response, 403, "token_read_only")
    assert error["detail"] == READ_ONLY_TOKEN
    assert Team.objects.count() == before

    response = client.post(TOKENS, {"name": "escalate", "scope": "read_write"}, format="json")
    assert_error(response, 403, "token_read_only")


def test_token_follows_its_users_demotion_on_the_next_request(world):
    """An admin's read_write token can create a team; after demotion to viewer the next write is 403."""
    admin = world.client("t1_admin")
    assert admin.post(TEAMS, {"name": "Before", "slug": unique("before")}, format="json").status_code == 201

    membership = Membership.objects.get(tenant=world.t1.tenant, user=world.users["t1_admin"])
    response = world.client("t1_owner").patch(f"/api/v1/memberships/{membership.pk}/", {"role": "viewer"},
                                              format="json")
    assert response.status_code == 200, response.content

    before = Team.objects.count()
    response = admin.post(TEAMS, {"name": "After", "slug": unique("after")}, format="json")
    assert_error(response, 403, "permission_denied")
    assert Team.objects.count() == before
    assert admin.get(ME).json()["acting_as"]["role"] == TenantRole.VIEWER


def test_token_of_a_user_removed_from_the_tenant_is_token_revoked(world):
    """Removing a member (API) revokes their tokens for the tenant: the next use is 401 ``token_revoked``."""
    member = world.client("t1_member")
    assert member.get(ME).status_code == 200
    membership = Membership.objects.get(tenant=world.t1.tenant, user=world.users["t1_member"])

    response = world.client("t1_owner").delete(f"/api/v1/memberships/{membership.pk}/")
    assert response.status_code == 204, response.content

    assert_error(member.get(ME), 401, "token_revoked")
    assert not APIToken.objects.filter(user=world.users["t1_member"], tenant=world.t1.tenant,
                                       revoked_at__isnull=True).exists()


def test_token_whose_membership_vanished_is_token_revoked(world):
    """Even without the service revoking it, a token whose user has no membership left is refused."""
    Membership.objects.filter(tenant=world.t1.tenant, user=world.users["t1_viewer"]).delete()
    assert_error(world.client("t1_viewer").get(ME), 401, "token_revoked")


def test_tenant_header_cannot_move_a_token_to_another_tenant(world):
    """A token acts in its own tenant; X-Meridian-Tenant naming another one changes nothing."""
    client = world.client("t2_member")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world.tokens['t2_member']}",
                       HTTP_X_MERIDIAN_TENANT=world.t1.tenant.slug)
    acting = client.get(ME).json()["acting_as"]
    assert acting["tenant"] == str(world.t2.tenant.pk)
    teams = client.get(TEAMS).json()["results"]
    assert {t["id"] for t in teams} == {str(world.t2.team.pk)}


def test_token_of_another_tenant_sees_nothing_of_this_tenant(world):
    """Tenant B's token cannot read tenant A's token (404)."""
    other = world.t1.objects[APIToken]
    assert_error(world.client("t2_member").get(f"{TOKENS}{other.pk}/"), 404, "not_found")
    assert_error(world.client("t2_member").delete(f"{TOKENS}{other.pk}/"), 404, "not_found")
    other.refresh_from_db()
    assert other.revoked_at is None


#
# Who sees and revokes which tokens
#


def test_member_lists_only_their_own_tokens(world):
    """A member's list holds their tokens only, none of the tenant's other tokens."""
    issue(world, "t1_member")
    response = world.client("t1_member").get(TOKENS)
    assert response.status_code == 200, response.content
    items = response.json()["results"]
    own = APIToken.objects.filter(user=world.users["t1_member"])
    assert {item["id"] for item in items} == {str(pk) for pk in own.values_list("pk", flat=True)}
    assert len(items) == 2
    assert APIToken.objects.filter(tenant=world.t1.tenant).exclude(user=world.users["t1_member"]).exists()


@pytest.mark.parametrize("persona", ["t1_admin", "t1_owner"])
def test_admin_and_owner_list_every_token_of_the_tenant(world, persona):
    """Tenant admins and owners see every token of their tenant, and no other tenant's."""
    response = world.client(persona).get(TOKENS)
    assert response.status_code == 200, response.content
    ids = {item["id"] for item in response.json()["results"]}
    expected = {str(pk) for pk in APIToken.objects.filter(tenant=world.t1.tenant).values_list("pk", flat=True)}
    assert ids == expected
    assert str(world.t2.objects[APIToken].pk) not in ids
    assert len(ids) >= 5


def test_admin_can_revoke_another_members_token(world):
    """A tenant admin revokes a member's token; the member's next request is refused."""
    token = APIToken.objects.get(user=world.users["t1_member"], tenant=world.t1.tenant)
    response = world.client("t1_admin").delete(f"{TOKENS}{token.pk}/")
    assert response.status_code == 204, response.content
    assert_error(world.client("t1_member").get(ME), 401, "token_revoked")
    event = AuditEvent.objects.get(action="api_token.revoke", target_id=str(token.pk))
    assert event.actor_id == world.users["t1_admin"].pk


def test_member_cannot_revoke_another_members_token(world):
    """Another user's token is invisible to a member: DELETE is 404 and the token keeps working."""
    token = APIToken.objects.get(user=world.users["t1_viewer"], tenant=world.t1.tenant)
    response = world.client("t1_member").delete(f"{TOKENS}{token.pk}/")
    assert_error(response, 404, "not_found")
    token.refresh_from_db()
    assert token.revoked_at is None
    assert world.client("t1_viewer").get(ME).status_code == 200


#
# Team-bound tokens
#


def test_team_bound_token_for_a_team_of_the_user(world):
    """A member of the team can bind a token to it; the token acts narrowed to that team."""
    body = issue(world, "t1_member", team=str(world.t1.team.pk), scope="read_write")
    token = APIToken.objects.get(pk=body["id"])
    assert token.team == world.t1.team
    acting = bearer(body["token"]).get(ME).json()["acting_as"]
    assert acting["team"] == str(world.t1.team.pk)


def test_team_bound_token_for_a_team_the_user_is_not_in_is_403(world):
    """Binding a token to a team of the tenant the user does not belong to is refused (403)."""
    assert not TeamMembership.objects.filter(user=world.users["t1_viewer"]).exists()
    before = APIToken.objects.count()
    response = viewer_session(world).post(TOKENS, {"name": "x", "team": str(world.t1.team.pk)}, format="json")
    assert_error(response, 403, "permission_denied")
    assert APIToken.objects.count() == before


def test_team_bound_token_for_another_tenants_team_is_400_does_not_exist(world):
    """Another tenant's team is as good as non-existent: 400 ``does_not_exist`` on ``team``."""
    before = APIToken.objects.count()
    response = world.client("t1_owner").post(TOKENS, {"name": "x", "team": str(world.t2.team.pk)}, format="json")
    assert_error(response, 400, "does_not_exist", attr="team")
    assert APIToken.objects.count() == before


def test_team_bound_token_stops_working_when_its_user_leaves_the_team(world):
    """A token bound to a team is refused once its (non-admin) user is no longer in that team."""
    body = issue(world, "t1_member", team=str(world.t1.team.pk))
    TeamMembership.objects.filter(team=world.t1.team, user=world.users["t1_member"]).delete()
    assert_error(bearer(body["token"]).get(ME), 401, "token_revoked")


#
# Platform tokens
#


@pytest.mark.parametrize("persona", ["platform_approver", "platform_admin"])
def test_platform_token_reaches_platform_routes(world, persona):
    """A staff token with no tenant reads the fleet at /api/v1/nodes/."""
    small_fleet(nodes=2)
    token = APIToken.objects.get(user=world.users[persona])
    assert token.tenant_id is None
    response = world.client(persona).get("/api/v1/nodes/")
    assert response.status_code == 200, response.content
    assert response.json()["count"] == 2
    assert world.client(persona).get(ME).json()["acting_as"]["platform"] is True


def test_tenant_token_cannot_reach_platform_routes(world):
    """A tenant owner's token is not a platform token: /api/v1/nodes/ is 403."""
    small_fleet(nodes=2)
    response = world.client("t1_owner").get("/api/v1/nodes/")
    assert_error(response, 403, "permission_denied")


def test_platform_admin_issues_a_platform_token_through_the_api(world):
    """Staff acting platform-wide get a token with no tenant, which then reads platform routes."""
    small_fleet(nodes=1)
    body = issue(world, "platform_admin", scope="read")
    token = APIToken.objects.get(pk=body["id"])
    assert token.tenant_id is None
    assert bearer(body["token"]).get("/api/v1/nodes/").status_code == 200


def test_platform_token_stops_working_when_the_platform_role_is_taken_away(world):
    """A platform token whose user is no longer staff is refused as revoked."""
    user = world.users["platform_approver"]
    user.platform_role = PlatformRole.NONE
    user.save(update_fields=["platform_role"])
    assert_error(world.client("platform_approver").get("/api/v1/nodes/"), 401, "token_revoked")


@pytest.mark.parametrize("persona", ["platform_approver", "platform_admin"])
def test_platform_staff_revoke_their_own_platform_token(world, persona):
    """Any staff member may revoke their own token (204), after which it is refused."""
    body = issue(world, persona, scope="read_write")
    response = world.client(persona).delete(f"{TOKENS}{body['id']}/")
    assert response.status_code == 204, response.content
    assert APIToken.objects.get(pk=body["id"]).revoked_at is not None
    assert_error(bearer(body["token"]).get(ME), 401, "token_revoked")


def test_platform_approver_cannot_revoke_a_tenants_token(world):
    """A platform approver may read tenants' tokens but not revoke them."""
    token = world.t1.objects[APIToken]
    response = world.client("platform_approver").delete(f"{TOKENS}{token.pk}/")
    assert response.status_code in (403, 404), response.content
    token.refresh_from_db()
    assert token.revoked_at is None


def test_service_refuses_a_token_for_a_user_without_tenant_or_platform_role(world):
    """A principal with neither a tenant nor a platform role cannot be issued a token."""
    from core.errors import Forbidden
    from tenants.scoping import Principal

    with pytest.raises(Forbidden):
        services.token_issue(actor=Principal(user=world.users["t1_member"]), name="none")
