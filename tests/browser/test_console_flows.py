"""
The console in a real browser: a member reserves GPUs and watches the reservation become active
without reloading; bad input is shown next to its fields; another tenant's pages are 404s; CSRF
and autoescaping hold; the main tenant and staff pages render. Every test also fails on a console
error, an uncaught exception or a CSP violation (see pages.ConsoleLog).
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from provisioning.models import Reservation
from tenants.models import HighPriorityApplication
from tests.browser.pages import ACTIVE_TIMEOUT_S, log_in, require_pages, screenshot
from tests.world import small_fleet, team_record, vm_offering

pytestmark = pytest.mark.slow

# Each driver call of the simulated hardware takes this long, so provisioning lasts a few seconds.
DRIVER_LATENCY_S = 0.3
TENANT_PAGES = ["/reservations/", "/vpcs/", "/teams/", "/quotas/", "/tokens/", "/ssh-keys/", "/notifications/",
                "/audit/", "/high-priority/"]
STAFF_PAGES = ["/staff/", "/staff/fleet/", "/staff/queue/", "/staff/tenants/", "/staff/quotas/",
               "/staff/high-priority/"]


@pytest.fixture
def fleet(world):
    return small_fleet(4)


def fill_reservation_form(tab, *, name: str, count: int = 1) -> None:
    """Type as a person does, key by key (each key is an input event the estimate follows)."""
    tab.locator("#id_name").press_sequentially(name)
    tab.locator("#id_offering").select_option(vm_offering().slug)
    tab.locator("#id_count").fill("")
    tab.locator("#id_count").press_sequentially(str(count))


def field_box(tab, name: str):
    """The form field's own block: its label, input, help text and error messages."""
    return tab.locator(".field", has=tab.locator(f"#id_{name}")).last


def submit(tab, button: str = "Reserve"):
    with tab.expect_navigation() as navigation:
        tab.get_by_role("button", name=button, exact=True).click()
    return navigation.value


def watch_state(tab, until: str, timeout_s: float) -> list[str]:
    """Read the state badge until it shows ``until``; returns every text it showed, in order."""
    badge = tab.locator("#reservation-state")
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        text = badge.inner_text().strip()
        if not seen or seen[-1] != text:
            seen.append(text)
        if text == until:
            return seen
        assert time.monotonic() < deadline, (f"the page still shows {seen[-1]} after {timeout_s:.0f} s: {seen}\n"
                                             + tab.locator("#progress").inner_text())
        tab.wait_for_timeout(200)


def test_a_member_reserves_and_watches_it_become_active(tab, console_log, people, fleet, celery_worker, settings):
    """
    A member opens "Reserve GPUs", sees the estimate fill in, submits and lands on the reservation's
    page, which goes on to Active by itself (htmx polling, no reload) as the worker provisions it.
    """
    settings.MERIDIAN_SIMULATION = {**settings.MERIDIAN_SIMULATION, "latency_s": {"default": DRIVER_LATENCY_S}}
    log_in(tab, people["t1_member"])
    expect(tab.get_by_role("heading", level=1)).to_have_text("Tenant t1")
    screenshot(tab, "tenant-dashboard")

    tab.get_by_role("link", name="Reserve GPUs").first.click()
    expect(tab.get_by_role("heading", name="Reserve GPUs")).to_be_visible()
    estimate = tab.locator("#estimate")
    expect(estimate).to_contain_text("Choose an offering")
    fill_reservation_form(tab, name="browser-finetune", count=2)
    for text in ("Free now", "us-east-1", "Price estimate", "$39.84", "Quota left", "Expected start"):
        expect(estimate).to_contain_text(text)
    screenshot(tab, "tenant-reservation-new-with-estimate")

    polls: list[tuple[int, str]] = []  # the status and HX-Refresh header of each progress poll
    tab.on("response", lambda response: polls.append((response.status, response.headers.get("hx-refresh", "")))
           if urlsplit(response.url).path.endswith("/progress/") else None)
    submit(tab)
    reservation = Reservation.objects.get(name="browser-finetune")
    assert tab.url.endswith(f"/reservations/{reservation.pk}/")
    expect(tab.get_by_role("status").filter(has_text="browser-finetune")).to_have_text("browser-finetune is scheduled.")
    reloads: list[str] = []
    tab.on("framenavigated", lambda frame: reloads.append(frame.url) if frame == tab.main_frame else None)

    seen = watch_state(tab, "Active", ACTIVE_TIMEOUT_S)

    assert seen[0] in ("Scheduled", "Provisioning"), seen
    assert "Provisioning" in seen, f"the page never showed the provisioning in progress: {seen}"
    # The page moves by itself: htmx swaps the progress in, or redraws the page where the poll's
    # answer asks it to (HX-Refresh); the test never reloads it.
    refreshes = sum(refresh == "true" for _, refresh in polls)
    assert polls and len(reloads) <= refreshes, (polls, reloads)
    reservation.refresh_from_db()
    assert reservation.state == "active"
    progress = tab.locator("#progress")
    expect(progress.get_by_role("progressbar")).to_have_attribute("aria-valuenow", "100")
    expect(progress).not_to_contain_text("updating live")
    expect(progress).to_contain_text("Provisioning finished in")
    expect(progress.locator(".badge", has_text="Waiting")).to_have_count(0)  # no wait is left on a finished step
    # Placed: the score has folded away under its summary; opened, it explains itself.
    score = tab.locator("section#score")
    score.locator("summary", has_text="Priority score").click()
    for header in ("Factor", "Value", "Weight", "Contribution"):
        expect(score.get_by_role("columnheader", name=header)).to_be_visible()
    assert score.locator("tbody tr").count() >= 3
    instances = tab.locator("section.card", has=tab.get_by_role("heading", name="Instances"))
    expect(instances.locator(".badge").first).to_have_text("Active")
    expect(instances).to_contain_text("ssh ")
    expect(tab.get_by_role("button", name="Release")).to_be_visible()
    expect(tab.get_by_role("button", name="Cancel", exact=True)).to_have_count(0)
    screenshot(tab, "tenant-reservation-active")


def test_form_errors_are_shown_next_to_their_fields_and_nothing_is_made(tab, console_log, people, fleet):
    """Count 0 and a spot term without a max price: a 400 with each message beside its field."""
    console_log.allow(r"status of 400 \(Bad Request\) \(http://[^/]+/reservations/new/\)")  # the form's answer
    log_in(tab, people["t1_member"])
    tab.goto("/reservations/new/")
    fill_reservation_form(tab, name="browser-bad", count=0)
    tab.locator("#id_billing_term").select_option("spot")
    response = submit(tab)

    assert response.status == 400
    for field, message in (("count", "Ensure this value is greater than or equal to 1."),
                           ("spot_max_price", "A spot reservation needs the most you will pay per GPU-hour.")):
        beside = field_box(tab, field).get_by_role("alert")
        expect(beside).to_be_visible()
        expect(beside).to_contain_text(message)
        expect(tab.locator(f"#id_{field}")).to_have_attribute("aria-invalid", "true")
    expect(field_box(tab, "name").get_by_role("alert")).to_have_count(0)
    expect(tab.locator("#id_name")).to_have_value("browser-bad")  # what was typed is kept
    assert not Reservation.objects.filter(name="browser-bad").exists()
    screenshot(tab, "tenant-reservation-new-errors")


def test_another_tenant_gets_404_for_the_page_and_its_htmx_partial(tab, console_log, people, world):
    """t2's member cannot open t1's reservation page, nor fetch its progress partial with htmx."""
    theirs, own = world.t1.objects[Reservation], world.t2.objects[Reservation]
    log_in(tab, people["t2_member"])
    assert tab.goto(f"/reservations/{own.pk}/").status == 200  # the same page of its own tenant opens
    console_log.allow(r"status of 404 \(Not Found\)")
    console_log.allow(r"^console\.error: Response Status Error Code 404 from /reservations/")  # htmx's report of it

    def htmx_get(path: str):
        """The page's own htmx fetches ``path`` (HX-Request, session cookie) and discards it."""
        with tab.expect_response(lambda response: response.url.endswith(path)) as answer:
            tab.evaluate("path => htmx.ajax('GET', path, {target: '#progress', swap: 'none'})", path)
        return answer.value

    refused = htmx_get(f"/reservations/{theirs.pk}/progress/")
    assert refused.status == 404 and refused.request.headers.get("hx-request") == "true"
    assert theirs.name not in refused.text()
    assert htmx_get(f"/reservations/{own.pk}/progress/").status == 200
    response = tab.goto(f"/reservations/{theirs.pk}/")
    assert response.status == 404
    assert theirs.name not in tab.content()


def test_a_post_without_the_csrf_token_is_refused(tab, console_log, people, world):
    """The cancel form without its token, submitted from the page: 403, and the reservation stays."""
    reservation = world.t1.objects[Reservation]
    log_in(tab, people["t1_member"])
    tab.goto(f"/reservations/{reservation.pk}/")
    cancel = tab.locator(f"form[action='/reservations/{reservation.pk}/cancel/']")
    cancel.locator("input[name=csrfmiddlewaretoken]").evaluate("input => input.remove()")
    console_log.allow(r"status of 403 \(Forbidden\)")

    response = submit(tab, "Cancel")

    assert response.status == 403
    assert len(console_log.dialogs) == 1 and console_log.dialogs[0].startswith("confirm: "), console_log.dialogs
    expect(tab.locator("body")).to_contain_text("CSRF")
    reservation.refresh_from_db()
    assert reservation.state == "queued"


def test_a_csp_violation_is_caught_by_the_console_log(tab, console_log):
    """An inline script is refused by the console's CSP, and the listener every test has reports it."""
    tab.goto("/login/")
    tab.evaluate("""() => {
        const script = document.createElement("script");
        script.textContent = "window.injected = true";
        document.body.append(script);
    }""")
    tab.wait_for_timeout(100)  # the console message arrives after the script is refused

    assert tab.evaluate("window.injected") is None
    assert any("Content Security Policy" in error for error in console_log.unexpected()), console_log.errors
    console_log.errors.clear()  # seen: the test has what it came for


def test_a_script_in_a_reservation_name_is_shown_as_text(tab, console_log, people, fleet):
    """A name of <script>alert(1)</script> is stored and rendered escaped: visible text, no dialog."""
    name = "<script>alert(1)</script>"
    log_in(tab, people["t1_member"])
    tab.goto("/reservations/new/")
    fill_reservation_form(tab, name=name)
    expect(tab.locator("#estimate")).to_contain_text("Price estimate")
    submit(tab)

    assert Reservation.objects.filter(name=name).exists()
    expect(tab.get_by_role("heading", level=1)).to_have_text(name)
    expect(tab.get_by_role("status").filter(has_text=name)).to_have_text(f"{name} is scheduled.")
    tab.goto("/")
    expect(tab.get_by_role("link", name=name)).to_be_visible()
    tab.goto("/reservations/")
    expect(tab.get_by_role("link", name=name)).to_be_visible()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in tab.content()
    assert console_log.dialogs == []
    screenshot(tab, "tenant-reservation-list-escaped-name")


def test_the_tenant_pages_render(tab, people, fleet):
    """Every page of the tenant menu opens for the tenant's owner, with its heading; a missing one fails."""
    require_pages(TENANT_PAGES)
    log_in(tab, people["t1_owner"])
    for path in TENANT_PAGES:
        response = tab.goto(path)
        assert response.status == 200, path
        expect(tab.get_by_role("heading", level=1)).to_be_visible()
        screenshot(tab, "tenant" + path.rstrip("/").replace("/", "-"))


def test_the_staff_pages_render(tab, people, fleet):
    """A platform admin lands on what needs a person; every staff page opens, a node's page too; a missing one fails."""
    require_pages(STAFF_PAGES)
    log_in(tab, people["platform_admin"])
    assert tab.url.endswith("/staff/")
    expect(tab.get_by_role("heading", level=1)).to_have_text("What needs a person now")
    for path in STAFF_PAGES:
        response = tab.goto(path)
        assert response.status == 200, path
        expect(tab.get_by_role("heading", level=1)).to_be_visible()
        screenshot(tab, "staff" + path.removeprefix("/staff").rstrip("/").replace("/", "-"))
    tab.goto("/staff/fleet/")
    with tab.expect_navigation():
        tab.locator("a[href^='/staff/fleet/nodes/']").first.click()
    expect(tab.get_by_role("heading", level=1)).to_be_visible()
    screenshot(tab, "staff-node")


def test_a_team_applies_for_high_priority_and_an_approver_approves_it(new_page, people, world):
    """
    A team member files the application at /high-priority/; a platform approver outside the team
    approves it at /staff/high-priority/; the team's page then shows the status and the outcome.
    """
    require_pages(["/high-priority/", "/staff/high-priority/"])
    tenant, team = world.t1.tenant, world.t1.team
    HighPriorityApplication.objects.filter(team=team).delete()  # the world's pending one: one at a time
    team_record(team, used=3)  # 30 days of reservations used as booked: above every threshold
    member, approver = new_page(), new_page()

    log_in(member, people["t1_member"])
    member.goto("/high-priority/")
    section = member.locator(f"#team-{team.pk}")
    expect(section.get_by_text("Not high priority", exact=True)).to_be_visible()
    expect(section).to_contain_text("The record meets every threshold")
    section.get_by_label("Why the team needs high priority").fill("The Q4 model release has a fixed date.")
    with member.expect_navigation():
        section.get_by_role("button", name="Apply for high priority").click()
    expect(member.get_by_role("status").filter(has_text="is filed")).to_contain_text(
        f"The application for {team.name} is filed")
    application = HighPriorityApplication.objects.get(team=team, state="pending")
    screenshot(member, "tenant-high-priority-applied")

    log_in(approver, people["platform_approver"])
    approver.goto("/staff/high-priority/")
    screenshot(approver, "staff-high-priority")
    with approver.expect_navigation():
        approver.get_by_role("link", name=f"Review the application of {tenant.name} / {team.name}").click()
    expect(approver.get_by_role("heading", level=1)).to_have_text(f"{tenant.name} / {team.name}")
    approver.get_by_label("Approve").check()
    approver.get_by_label("Note to the team").fill("Approved for the release.")
    screenshot(approver, "staff-high-priority-review")
    with approver.expect_navigation():
        approver.get_by_role("button", name="Record the decision").click()
    expect(approver.get_by_role("status").filter(has_text="approved")).to_contain_text(
        f"The application of {team.name} is approved")

    application.refresh_from_db()
    assert application.state == "approved" and application.reviewed_by == people["platform_approver"]
    member.reload()
    expect(section.get_by_text("High priority", exact=True)).to_be_visible()
    expect(section.locator(f"#application-{application.pk}")).to_contain_text("Approved for the release.")
    screenshot(member, "tenant-high-priority-approved")
    member.goto("/notifications/")
    expect(member.locator("main")).to_contain_text(f"High priority approved for team {team.name}")
