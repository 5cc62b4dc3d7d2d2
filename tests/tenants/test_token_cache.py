"""
What a bearer token resolves to, remembered per process (tenants/token_cache.py): a repeat
request reads no token, membership or team rows, and every change that decides what a token may
do is seen by the very next request -- in this process and in another that remembered the token
before the change (the shared auth epoch, not the process's own memory, tells them).
"""

from datetime import timedelta
from unittest import mock

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core import epochs
from tenants import services, token_cache
from tenants.choices import TenantRole
from tenants.models import APIToken, Membership, TeamMembership
from tenants.principals import principal_for_bearer
from tenants.token_cache import TOKENS

ME = "/api/v1/me/"
AUTH_TABLES = ("tenants_apitoken", "tenants_membership", "tenants_teammembership")


def auth_reads(client) -> int:
    """SELECTs of token, membership and team-membership rows while GET /teams/ is answered."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/api/v1/teams/")
    assert response.status_code == 200, response.content
    return sum(q["sql"].startswith("SELECT") and any(f'"{t}"' in q["sql"].split(" WHERE ")[0].split(" FROM ")[1]
                                                      for t in AUTH_TABLES) for q in queries.captured_queries)


def another_process(entries: dict):
    """What a process that resolved these tokens before the change still holds."""
    TOKENS._kept = dict(entries)


def test_a_repeat_request_reads_no_auth_rows(world):
    client = world.client("t1_member")
    assert auth_reads(client) >= 3  # the token, the membership, the team roles
    assert auth_reads(client) == 0


def test_the_cache_can_be_turned_off(world, settings):
    settings.MERIDIAN_AUTH_CACHE_SECONDS = 0
    client = world.client("t1_member")
    assert auth_reads(client) >= 3
    assert auth_reads(client) >= 3


def test_an_unreadable_shared_cache_means_the_database_is_read_every_time(world):
    client = world.client("t1_member")
    down = mock.Mock(**{"get.side_effect": ConnectionError("redis is down")})
    with mock.patch.object(epochs, "cache", down):
        assert auth_reads(client) >= 3
        assert auth_reads(client) >= 3


def test_a_remembered_prefix_with_another_secret_is_refused(world):
    raw = world.tokens["t1_member"]
    principal_for_bearer(raw)
    forged = raw[:-4] + ("AAAA" if not raw.endswith("AAAA") else "BBBB")
    response = world.client("anon").get(ME, HTTP_AUTHORIZATION=f"Bearer {forged}")
    assert response.status_code == 401 and response.json()["errors"][0]["code"] == "token_invalid"


def revoke(world):
    token = APIToken.objects.get(prefix=world.tokens["t1_member"].split("_")[1])
    services.token_revoke(actor=world.principal("t1_owner"), token=token)
    return 401


def remove(world):
    membership = Membership.objects.get(user=world.users["t1_member"], tenant=world.t1.tenant)
    services.membership_remove(actor=world.principal("t1_owner"), membership=membership)
    return 401


def deactivate(world):
    user = world.users["t1_member"]
    user.is_active = False
    user.save(update_fields=["is_active"])
    return 401


def demote(world):
    membership = Membership.objects.get(user=world.users["t1_member"], tenant=world.t1.tenant)
    services.membership_set_role(actor=world.principal("t1_owner"), membership=membership, role=TenantRole.VIEWER)
    return TenantRole.VIEWER


def leave_the_team(world):
    TeamMembership.objects.filter(user=world.users["t1_member"]).delete()
    return {}


@pytest.mark.parametrize("change", [revoke, remove, deactivate, demote, leave_the_team])
@pytest.mark.parametrize("where", ["this process", "another process"])
def test_a_change_is_seen_by_the_next_request(world, change, where, django_capture_on_commit_callbacks):
    client = world.client("t1_member")
    before = client.get(ME).json()["acting_as"]
    assert before["role"] == TenantRole.MEMBER and auth_reads(client) == 0
    remembered = dict(TOKENS._kept)
    with django_capture_on_commit_callbacks(execute=True):
        expected = change(world)
    if where == "another process":
        another_process(remembered)
    response = client.get(ME)
    if expected == 401:
        assert response.status_code == 401, response.content
    elif expected == {}:
        assert principal_for_bearer(world.tokens["t1_member"]).team_roles == {}
    else:
        assert response.json()["acting_as"]["role"] == expected


def test_the_epoch_changes_again_when_the_change_commits(world, django_capture_on_commit_callbacks):
    """A request between the change and its commit reads the old rows: they must not outlive the commit."""
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        demote(world)
        during = token_cache.AUTH_EPOCH.read()
        principal_for_bearer(world.tokens["t1_member"])  # another request, reading before the commit
    assert token_cache.AUTH_EPOCH.read() != during
    assert principal_for_bearer(world.tokens["t1_member"]).role == TenantRole.VIEWER


def test_a_remembered_token_is_not_used_after_its_time(world, settings):
    client = world.client("t1_member")
    assert auth_reads(client) >= 3
    assert auth_reads(client) == 0
    later = epochs.time.monotonic() + settings.MERIDIAN_AUTH_CACHE_SECONDS + 1
    with mock.patch.object(epochs.time, "monotonic", return_value=later):
        assert auth_reads(client) >= 3


def test_each_request_gets_its_own_objects(world):
    raw = world.tokens["t1_member"]
    first, second = principal_for_bearer(raw), principal_for_bearer(raw)
    assert first.user is not second.user and first.token is not second.token and first.tenant is not second.tenant
    first.user.full_name = "changed by one request"
    first.team_roles.clear()
    assert principal_for_bearer(raw).user.full_name != "changed by one request"
    assert principal_for_bearer(raw).team_roles == second.team_roles


def test_last_used_is_still_written_about_once_a_minute(world):
    raw = world.tokens["t1_member"]
    token = APIToken.objects.get(prefix=raw.split("_")[1])
    APIToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now() - timedelta(minutes=5))
    TOKENS.clear()
    principal_for_bearer(raw)
    first = APIToken.objects.get(pk=token.pk).last_used_at
    assert timezone.now() - first < timedelta(seconds=5)
    with CaptureQueriesContext(connection) as queries:
        principal_for_bearer(raw)
    assert not queries.captured_queries  # remembered, and used less than a minute ago
