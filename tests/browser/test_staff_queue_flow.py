"""
The staff queue's actions in a browser, as a platform admin would take them: at desktop and phone
width, with JavaScript on and off (plain forms: the same posts either way). The admin holds a
queued reservation and lets it go, raises it, cancels another with a reason; the tenant's owner
reads what happened on the reservation's page; a viewer and an approver are offered no action.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from provisioning.models import Reservation
from tests.browser.pages import log_in, screenshot
from tests.console.test_staff_queue import queue_up
from tests.world import small_fleet

pytestmark = pytest.mark.slow
WIDTHS = {"desktop": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}


@pytest.fixture
def fleet(world):
    return small_fleet(4)


@pytest.fixture
def browse(new_page):
    """``browse(width, js)``: a page of a fresh context at that width, with JavaScript on or off."""
    return lambda width, js: new_page(WIDTHS[width], script=js)


def row_actions(page, reservation):
    """Open the row's disclosure and return it."""
    disclosure = page.locator("details.queue-actions", has=page.get_by_text(f"Act on {reservation.name}"))
    disclosure.locator("summary").click()
    return disclosure


def submit(page, button):
    with page.expect_navigation():
        button.click()


@pytest.mark.parametrize("js", [True, False], ids=["js", "no-js"])
@pytest.mark.parametrize("width", ["desktop", "phone"])
def test_an_admin_holds_lets_go_raises_and_cancels_from_the_queue(browse, people, world, fleet, width, js):
    waiting, other = queue_up(world.t1.tenant, 2, team=world.t1.team)
    admin = browse(width, js)
    log_in(admin, people["platform_admin"])
    admin.goto("/staff/queue/")
    actions = row_actions(admin, waiting)
    actions.get_by_label("Note for the team").nth(1).fill("Checking the image with you")
    screenshot(admin, f"staff-queue-actions-{width}-{'js' if js else 'no-js'}")
    submit(admin, actions.get_by_role("button", name="Hold in the queue"))
    expect(admin.locator(".flash.success")).to_contain_text(f"{waiting.name} is held")
    expect(admin.locator("tr.held")).to_contain_text(waiting.name)
    scroll = admin.evaluate("document.scrollingElement.scrollWidth") if js else None
    assert scroll is None or scroll <= WIDTHS[width]["width"], "the queue page scrolls sideways"
    screenshot(admin, f"staff-queue-held-{width}-{'js' if js else 'no-js'}")

    owner = browse(width, js)
    log_in(owner, people["t1_owner"])
    owner.goto(f"/reservations/{waiting.pk}/")
    expect(owner.get_by_text("Held in the queue by the operator.")).to_be_visible()
    expect(owner.locator("main")).to_contain_text("Checking the image with you")

    admin.goto("/staff/queue/")
    actions = row_actions(admin, waiting)
    actions.get_by_label("Note for the team").nth(1).fill("Image fixed")
    submit(admin, actions.get_by_role("button", name="Let it go"))
    actions = row_actions(admin, waiting)
    actions.get_by_label("Adjustment, −1 (lowest) to 1 (highest); 0 takes it back").fill("0.4")
    actions.get_by_label("Note for the team").first.fill("Paper deadline")
    submit(admin, actions.get_by_role("button", name="Save adjustment"))
    expect(admin.locator(".flash.success")).to_contain_text("+0.40")
    actions = row_actions(admin, other)
    actions.get_by_label("Reason the team reads").fill("Duplicate of another run")
    submit(admin, actions.get_by_role("button", name="Cancel reservation"))  # with JS, a confirm: accepted
    expect(admin.locator(".flash.success")).to_contain_text("was cancelled")

    waiting.refresh_from_db()
    assert waiting.held_at is None and waiting.priority_adjustment == pytest.approx(0.4)
    assert Reservation.objects.get(pk=other.pk).state == "cancelled"
    owner.goto("/notifications/")
    expect(owner.locator("main")).to_contain_text("Duplicate of another run")


@pytest.mark.parametrize("persona", ["platform_approver", "t1_viewer"])
def test_others_are_offered_no_action(browse, console_log, people, world, fleet, persona):
    waiting = queue_up(world.t1.tenant, 1)[0]
    page = browse("desktop", True)
    log_in(page, people[persona])
    console_log.allow(r"status of 404 .*/staff/queue/")  # the viewer's answer: no such page for tenants
    response = page.goto("/staff/queue/")
    if persona == "t1_viewer":
        assert response.status == 404
        return
    expect(page.locator("main")).to_contain_text(waiting.name)
    assert page.locator("details.queue-actions").count() == 0
