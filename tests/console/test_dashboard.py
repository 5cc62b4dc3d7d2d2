"""The dashboard and the switchers: scoped like the API, and staff land on the fleet."""

import pytest

pytestmark = pytest.mark.django_db


def test_signed_out_goes_to_login(console):
    response = console("anon").get("/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_dashboard_shows_own_tenant_only(console, world):
    page = console("t1_member").get("/")
    assert page.status_code == 200
    body = page.content.decode()
    assert world.t1.tenant.name in body and world.t2.tenant.name not in body


def test_viewer_sees_no_reserve_button(console):
    assert "Reserve GPUs</a>" not in console("t1_viewer").get("/").content.decode()
    assert "Reserve GPUs</a>" in console("t1_member").get("/").content.decode()


def test_switching_to_a_tenant_one_is_not_in_is_refused(console, world):
    client = console("t1_member")
    response = client.post("/switch/", {"tenant": world.t2.tenant.slug, "next": "/"})
    assert response.status_code == 302 and response["Location"] == "/tenants/"
    assert world.t2.tenant.name not in client.get("/").content.decode()


def test_switch_refuses_an_offsite_next(console, world):
    response = console("t1_member").post("/switch/", {"tenant": world.t1.tenant.slug, "next": "https://evil.example/"})
    assert response["Location"] == "/"


def test_staff_without_a_tenant_land_on_the_fleet(console):
    response = console("platform_admin").get("/")
    assert response.status_code == 302 and response["Location"] == "/staff/fleet/"


def test_tenant_users_see_no_staff_pages_nor_links(console, world):
    client = console("t1_owner")
    for url in ("/staff/fleet/", "/staff/queue/", "/staff/quotas/"):
        assert client.get(url).status_code == 404
    assert "/staff/fleet/" not in client.get("/").content.decode()
    # A 404 on a staff page does not lose the tenant chosen with the switcher.
    assert world.t1.tenant.name in client.get("/").content.decode()


def test_a_team_that_is_no_id_is_ignored_not_a_500(console, world):
    client = console("t1_member")
    client.post("/switch/", {"tenant": world.t1.tenant.slug, "team": "x", "next": "/"})
    assert client.get("/").status_code == 200
    session = client.session
    session["console_team"] = "not-a-uuid"  # an older session holding garbage
    session.save()
    assert client.get("/reservations/").status_code == 200
