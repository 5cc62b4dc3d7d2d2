"""The API token pages: one's own tokens (admins: the tenant's), the secret shown once, revoke."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tenants import services
from tenants.models import APIToken, secret_digest
from tenants.views import ISSUED_TOKEN

pytestmark = pytest.mark.django_db


def own_token(world, persona) -> APIToken:
    return APIToken.objects.filter(user=world.users[persona]).first()


def test_member_sees_only_their_own_tokens(console, world):
    body = console("t1_member").get(reverse("token-list")).content.decode()
    assert own_token(world, "t1_member").prefix in body
    assert world.t1.objects[APIToken].prefix not in body  # the owner's
    assert own_token(world, "t1_admin").prefix not in body


def test_admin_sees_every_token_of_the_tenant_and_its_owner(console, world):
    body = console("t1_admin").get(reverse("token-list")).content.decode()
    for persona in ("t1_member", "t1_viewer", "t1_owner"):
        assert own_token(world, persona).prefix in body
        assert world.users[persona].email in body
    assert own_token(world, "t2_member").prefix not in body


def test_secret_is_shown_once_then_gone(console, world):
    client = console("t1_member")
    response = client.post(reverse("token-create"), {"name": "ci", "scope": "read", "expires_in_days": "30"})
    token = APIToken.objects.get(user=world.users["t1_member"], name="ci")
    assert response.status_code == 302 and response["Location"] == reverse("token-issued", args=[token.pk])
    page = client.get(response["Location"])
    body = page.content.decode()
    secret = body.split('id="token-secret" type="text" value="')[1].split('"')[0]
    assert secret.startswith(f"mrd_{token.prefix}_") and token.digest == secret_digest(secret)
    assert "no-store" in page["Cache-Control"]
    assert ISSUED_TOKEN not in client.session
    again = client.get(response["Location"]).content.decode()
    assert secret not in again and "cannot be shown again" in again
    assert token.scope == "read" and token.tenant == world.t1.tenant and token.expires_at is not None


def test_token_bound_to_own_team(console, world):
    response = console("t1_member").post(reverse("token-create"), {"name": "team-ci", "scope": "read_write",
                                                                   "team": str(world.t1.team.pk),
                                                                   "expires_in_days": "90"})
    assert response.status_code == 302
    token = APIToken.objects.get(name="team-ci")
    assert token.team == world.t1.team and token.scope == "read_write" and token.expires_at is not None


def test_a_new_token_expires_in_90_days_unless_changed_and_never_by_default(console, world):
    """The form proposes 90 days; a token with no expiry is not what an empty field quietly makes."""
    client = console("t1_member")
    page = client.get(reverse("token-list")).content.decode()
    assert 'name="expires_in_days"' in page and 'value="90"' in page.split('name="expires_in_days"')[1][:200]
    response = client.post(reverse("token-create"), {"name": "no-expiry", "scope": "read"})
    assert response.status_code == 200 and "Give the token a lifetime" in response.content.decode()
    assert not APIToken.objects.filter(name="no-expiry").exists()


def test_a_viewers_form_offers_read_tokens_only(console, world):
    """A viewer's tokens only read (as the API rules): read_write is not offered, nor taken."""
    client = console("t1_viewer")
    page = client.get(reverse("token-list")).content.decode()
    assert 'value="read_write"' not in page
    response = client.post(reverse("token-create"), {"name": "rw", "scope": "read_write", "expires_in_days": "30"})
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    assert not APIToken.objects.filter(name="rw").exists()


@pytest.mark.parametrize(("data", "message"), [
    ({"name": "long", "scope": "read", "expires_in_days": "400"}, "A token may live at most 365 days."),
    ({"name": "", "scope": "read"}, "This field is required."),
    ({"name": "bad-scope", "scope": "admin"}, "Select a valid choice."),
])
def test_bad_input_is_shown_on_the_form_and_nothing_is_created(console, world, data, message):
    before = APIToken.objects.count()
    response = console("t1_member").post(reverse("token-create"), data)
    assert response.status_code == 200 and message in response.content.decode()
    assert APIToken.objects.count() == before


def test_a_team_one_is_not_in_cannot_be_chosen(console, world):
    response = console("t1_viewer").post(reverse("token-create"), {"name": "x", "scope": "read",
                                                                   "team": str(world.t1.team.pk)})
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    assert not APIToken.objects.filter(name="x").exists()


def test_viewer_may_make_and_revoke_their_own_tokens_as_the_api_allows(console, world):
    """The role table lets anyone manage their own tokens; a viewer's token only reads anyway."""
    client = console("t1_viewer")
    assert 'action="/tokens/new/"' in client.get(reverse("token-list")).content.decode()
    assert client.post(reverse("token-create"), {"name": "viewer-ci", "scope": "read",
                                                 "expires_in_days": "30"}).status_code == 302
    mine = own_token(world, "t1_viewer")
    assert client.post(reverse("token-revoke", args=[mine.pk])).status_code == 302
    mine.refresh_from_db()
    assert mine.revoked_at is not None


def test_members_cannot_revoke_someone_elses_token(console, world):
    owners = world.t1.objects[APIToken]
    for persona in ("t1_viewer", "t1_member"):
        assert console(persona).post(reverse("token-revoke", args=[owners.pk])).status_code == 404
    owners.refresh_from_db()
    assert owners.revoked_at is None


def test_another_tenants_token_is_a_404(console, world):
    token = world.t1.objects[APIToken]
    client = console("t2_member")
    assert client.get(reverse("token-issued", args=[token.pk])).status_code == 404
    assert client.post(reverse("token-revoke", args=[token.pk])).status_code == 404
    assert console("t2_owner").post(reverse("token-revoke", args=[token.pk])).status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None


def test_admin_revokes_a_members_token_in_place_with_htmx(console, world):
    token = own_token(world, "t1_member")
    response = console("t1_admin").post(reverse("token-revoke", args=[token.pk]), HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200 and body.lstrip().startswith(f'<tr id="token-{token.pk}"')
    assert "state-revoked" in body and "is revoked" in body and "hx-post" not in body
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_revoke_without_script_redirects_with_a_message(console, world):
    token = own_token(world, "t1_member")
    response = console("t1_member").post(reverse("token-revoke", args=[token.pk]), follow=True)
    assert response.redirect_chain[-1][0] == reverse("token-list")
    assert f"Token {token.name} is revoked" in response.content.decode()


def test_list_query_count_does_not_grow_with_tokens(console, world, django_assert_max_num_queries):
    client = console("t1_admin")
    client.get(reverse("token-list"))
    with CaptureQueriesContext(connection) as few:
        client.get(reverse("token-list"))
    for i in range(5):
        services.token_issue(actor=world.principal("t1_member"), name=f"more-{i}", team=world.t1.team)
    with django_assert_max_num_queries(len(few)):
        body = client.get(reverse("token-list")).content.decode()
    assert "more-4" in body


def test_the_new_secret_never_rests_in_the_session_in_plain_text(console, world):
    from tenants.views import ISSUED_TOKEN

    client = console("t1_member")
    response = client.post(reverse("token-create"), {"name": "ci", "scope": "read", "expires_in_days": "30"})
    assert response.status_code == 302
    held = client.session[ISSUED_TOKEN]
    assert "mrd_" not in str(held) and "secret" not in held
    assert "mrd_" in client.get(response["Location"]).content.decode()  # shown once, decrypted
