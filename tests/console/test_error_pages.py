"""
The console's error pages: a refused post, a page that is not there and a server error are drawn
in the console's own shell (top bar and navigation), say why, and offer a way back; a refusal is
logged as one line, not as a traceback. Unknown /api/ URLs keep the API's JSON error.
"""

import logging

import pytest
from django.test import Client
from django.urls import path

from config import urls as cloud_urls

pytestmark = pytest.mark.django_db


def test_a_viewers_post_is_a_403_in_the_console_shell_with_the_reason(console, caplog):
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = console("t1_viewer").post("/vpcs/new/", {"name": "lab"})

    assert response.status_code == 403
    page = response.content.decode()
    assert 'aria-label="Console"' in page, "the side navigation of the console"
    assert "viewer" in page and "member" in page, "which role it has and which one the action needs"
    assert 'href="/"' in page and "Back to the dashboard" in page
    refused = [r for r in caplog.records if r.name == "django.request"]
    assert refused and all(r.exc_info is None for r in refused), "a refusal is not logged as a traceback"


def test_a_viewers_reserve_post_names_the_role_it_needs(console):
    response = console("t1_viewer").post("/reservations/new/", {"name": "x"})

    assert response.status_code == 403
    page = response.content.decode()
    assert "Your role in" in page and "is viewer" in page and "member or above" in page


def test_an_unknown_page_is_a_404_in_the_console_shell(console):
    response = console("t1_member").get("/no-such-page/")

    assert response.status_code == 404
    page = response.content.decode()
    assert 'aria-label="Console"' in page and "Page not found" in page
    assert "Back to the dashboard" in page
    assert "The requested resource was not found on this server" not in page  # Django's bare default


def test_another_tenants_object_is_the_same_404_page(console, world):
    from tests.world import world_vpc

    vpc = world_vpc(world.t2.tenant)
    response = console("t1_member").get(f"/vpcs/{vpc.pk}/")

    assert response.status_code == 404
    assert "Page not found" in response.content.decode()


def test_a_signed_out_visitor_gets_the_404_page_without_the_navigation():
    response = Client().get("/no-such-page/")

    assert response.status_code == 404
    page = response.content.decode()
    assert "Page not found" in page and 'aria-label="Console"' not in page and "Sign in" in page


def test_an_unknown_api_url_keeps_the_apis_json_error(console):
    response = console("t1_member").get("/api/v1/no-such-endpoint/")

    assert response.status_code == 404
    assert response.json()["errors"][0]["code"] == "not_found"


def test_staff_index_is_the_problems_page_and_a_404_for_tenants(console):
    response = console("platform_admin").get("/staff/")
    assert response.status_code == 200 and "What needs a person now" in response.content.decode()
    assert console("t1_owner").get("/staff/").status_code == 404


def broken(request):
    raise RuntimeError("boom")


urlpatterns = [path("broken/", broken), *cloud_urls.urlpatterns]
handler500 = "web.error_views.server_error"


@pytest.mark.urls(__name__)
def test_a_server_error_is_a_500_in_the_console_shell_with_the_request_id(console):
    client = console("t1_member")
    client.raise_request_exception = False

    response = client.get("/broken/", HTTP_X_REQUEST_ID="req-1234-abcd")

    assert response.status_code == 500
    page = response.content.decode()
    assert "Something went wrong" in page and "req-1234-abcd" in page and "Back to the dashboard" in page
    assert "boom" not in page, "the exception itself stays in the server's log"


def test_the_500_page_renders_without_a_database(rf):
    """The database may be why it failed: the page draws from the request alone."""
    from web.error_views import server_error

    request = rf.get("/x/")
    request.id = "req-5678"
    response = server_error(request)
    assert response.status_code == 500 and "req-5678" in response.content.decode()
