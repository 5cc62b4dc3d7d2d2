"""
The Reserve form in a real browser: the estimate follows typing, pasting and picking; a newer
estimate never aborts the one under way (no console error); after a refused submit the focus is
on the first field to fix; without JavaScript the estimate still comes (a button) and the
reservation's page does not claim to update live. At desktop and phone width, with screenshots.
"""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from provisioning import views
from provisioning.models import Reservation
from provisioning.services import reservation_rescore
from tests.browser.pages import PAGE_TIMEOUT_S, log_in, screenshot
from tests.world import small_fleet, vm_offering

pytestmark = pytest.mark.slow

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def fleet(world):
    return small_fleet(4)


def open_form(tab, people, persona: str = "t1_member") -> None:
    log_in(tab, people[persona])
    tab.goto("/reservations/new/")
    expect(tab.get_by_role("heading", name="Reserve GPUs")).to_be_visible()


def test_the_estimate_follows_picking_and_pasting_without_a_key_press(tab, people, fleet):
    """Choosing an offering and pasting a count (input events, no keyup) each bring a new estimate."""
    open_form(tab, people)
    estimate = tab.locator("#estimate")
    expect(estimate).to_contain_text("Choose an offering")
    expect(estimate.locator(".errorlist")).to_have_count(0)  # nothing typed is nothing wrong
    tab.locator("#id_name").press_sequentially("browser-paste")
    tab.locator("#id_offering").select_option(vm_offering().slug)
    expect(estimate).to_contain_text("$19.92")  # 1 GPU x 8 hours x $2.49
    tab.locator("#id_count").select_text()
    tab.keyboard.insert_text("3")  # what a paste does: an input event and no key events
    expect(estimate).to_contain_text("$59.76")
    expect(tab.locator("#estimate-summary")).to_contain_text("$59.76")  # beside the Reserve button too
    expect(estimate).to_contain_text("Free now")
    screenshot(tab, "tenant-reservation-new-estimate-pasted")


def test_a_newer_estimate_waits_for_the_one_under_way_and_logs_no_error(tab, people, fleet, monkeypatch):
    """
    Estimates answered slowly while the count changes: each change supersedes the last, none is
    aborted (htmx logs every abort as a console error, which fails this test), the last one wins.
    """
    slow = views.estimates.estimate

    def slow_estimate(**kwargs):
        time.sleep(0.6)
        return slow(**kwargs)

    monkeypatch.setattr(views.estimates, "estimate", slow_estimate)
    open_form(tab, people)
    tab.locator("#id_name").press_sequentially("browser-slow")
    tab.locator("#id_offering").select_option(vm_offering().slug)
    count = tab.locator("#id_count")
    for value in ("2", "4", "6", "5"):
        count.fill(value)
        tab.wait_for_timeout(450)  # past the 400 ms pause: each change sends its own request
    expect(tab.locator("#estimate")).to_contain_text("$99.60", timeout=PAGE_TIMEOUT_S * 1000)  # 5 x 8 h x $2.49


def test_after_a_refused_submit_the_first_field_to_fix_has_the_focus(tab, console_log, people, fleet):
    console_log.allow(r"status of 400 \(Bad Request\) \(http://[^/]+/reservations/new/\)")  # the form's answer
    open_form(tab, people)
    tab.locator("#id_name").fill("browser-focus")
    tab.locator("#id_offering").select_option(vm_offering().slug)
    tab.locator("#id_count").fill("0")
    tab.locator("#id_ssh_public_key").fill("not a key")
    with tab.expect_navigation():
        tab.get_by_role("button", name="Reserve", exact=True).click()
    expect(tab.locator("#id_count")).to_be_focused()
    for field in ("count", "ssh_public_key"):  # both mistakes at once, not one per submit
        expect(tab.locator(f"#id_{field}")).to_have_attribute("aria-invalid", "true")
    expect(tab.locator("#estimate")).to_contain_text("greater than or equal to 1")
    assert not Reservation.objects.filter(name="browser-focus").exists()
    screenshot(tab, "tenant-reservation-new-first-error-focused")


def test_a_viewer_gets_a_notice_not_a_form(tab, people, fleet):
    open_form(tab, people, "t1_viewer")
    expect(tab.get_by_role("heading", name="You can look, not reserve")).to_be_visible()
    expect(tab.locator("#reservation-form")).to_have_count(0)
    screenshot(tab, "tenant-reservation-new-viewer")


@pytest.fixture
def no_script_page(chromium, live_server, console_log):
    """A page of a browser with JavaScript switched off."""
    context = chromium.new_context(base_url=live_server.url, java_script_enabled=False,
                                   viewport={"width": 1280, "height": 900})
    context.set_default_timeout(PAGE_TIMEOUT_S * 1000)
    page = context.new_page()
    page.on("console", console_log.on_console)
    yield page
    context.close()


def test_without_javascript_the_estimate_comes_by_a_button(no_script_page, people, fleet):
    tab = no_script_page
    open_form(tab, people)
    tab.locator("#id_offering").select_option(vm_offering().slug)
    tab.locator("#id_count").fill("2")
    with tab.expect_navigation():
        tab.get_by_role("button", name="Check price and availability").click()
    estimate = tab.locator("#estimate")
    expect(estimate).to_contain_text("Price estimate")
    expect(estimate).to_contain_text("$39.84")
    expect(tab.locator("#id_count")).to_have_value("2")
    screenshot(tab, "tenant-reservation-new-no-script-estimate")
    tab.locator("#id_name").fill("browser-no-script")
    with tab.expect_navigation():
        tab.get_by_role("button", name="Reserve", exact=True).click()
    reservation = Reservation.objects.get(name="browser-no-script")
    assert tab.url.endswith(f"/reservations/{reservation.pk}/")
    progress = tab.locator("#progress")
    expect(progress.get_by_text("updating live")).to_be_hidden()
    expect(progress.get_by_role("link", name="Reload the page")).to_be_visible()


def test_with_javascript_the_page_says_it_updates_live(tab, people, world, fleet):
    reservation = world.t1.objects[Reservation]
    log_in(tab, people["t1_member"])
    tab.goto(f"/reservations/{reservation.pk}/")
    progress = tab.locator("#progress")
    expect(progress.get_by_text("updating live")).to_be_visible()
    expect(progress.get_by_text("Reload the page")).to_be_hidden()


@pytest.mark.parametrize("width", ["desktop", "phone"])
def test_the_form_and_a_waiting_reservation_read_well_at_each_width(tab, people, world, fleet, width):
    """Screenshots to look at: the form with its estimate and a queued reservation's page, nothing overflowing."""
    if width == "phone":
        tab.set_viewport_size(PHONE)
    open_form(tab, people)
    tab.locator("#id_offering").select_option(vm_offering().slug)
    expect(tab.locator("#estimate")).to_contain_text("Price estimate")
    screenshot(tab, f"tenant-reservation-new-{width}")
    reservation = world.t1.objects[Reservation]
    reservation_rescore(reservation)  # its score table, the widest part of the page
    tab.goto(f"/reservations/{reservation.pk}/")
    expect(tab.get_by_role("heading", level=1)).to_have_text(reservation.name)
    expect(tab.get_by_role("columnheader", name="Contribution")).to_be_attached()
    overflow = tab.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the page is {overflow} px wider than the {width} screen"
    screenshot(tab, f"tenant-reservation-queued-{width}")
