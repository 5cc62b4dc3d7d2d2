"""
The console's shell in a real browser, by keyboard and at phone width: the tenant and team
switchers change nothing until asked (WCAG 3.2.2), the focus ring stands out (3:1, WCAG 2.4.11's
contrast), the skip link moves the focus to the content, and at 390 px no page scrolls sideways
and the content starts near the top. Screenshots of each page at both widths go to var/screenshots/.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from cloud.models import Node
from provisioning.models import VPC, Reservation
from tests.browser.pages import log_in, screenshot
from tests.world import small_fleet

pytestmark = pytest.mark.slow

PHONE = {"width": 390, "height": 844}
# Below the top bar and the one-line navigation: what a phone shows first is the page's own content.
CONTENT_TOP_MAX_PX = 170
TENANT_PAGES = ["/", "/reservations/", "/reservations/new/", "/vpcs/", "/teams/", "/quotas/", "/ssh-keys/", "/sla/",
                "/high-priority/", "/tokens/", "/notifications/"]
ADMIN_PAGES = ["/audit/", "/teams/"]
STAFF_PAGES = ["/staff/", "/staff/search/", "/staff/fleet/", "/staff/queue/", "/staff/quotas/", "/staff/sla/",
               "/staff/high-priority/", "/audit/"]


@pytest.fixture
def fleet(world):
    return small_fleet(4)


#
# Keyboard
#


def test_the_team_switcher_does_not_navigate_on_arrow_keys(tab, people, world, fleet):
    """Arrowing through the teams only picks one; the Switch button (or a pointer's choice) switches."""
    requests = []
    tab.on("request", lambda request: requests.append(request.url) if "/switch/" in request.url else None)
    log_in(tab, people["t1_member"])
    tab.goto("/reservations/")
    tab.evaluate("window.stayed = true")
    team = tab.locator("#switch-team")
    team.focus()

    team.press("ArrowDown")

    assert team.input_value() == str(world.t1.team.pk), "the arrow picked the next team"
    assert tab.evaluate("window.stayed === true") and tab.url.endswith("/reservations/")
    assert requests == []
    with tab.expect_navigation():
        tab.get_by_role("button", name="Switch", exact=True).click()
    assert len(requests) == 1 and tab.url.endswith("/reservations/")
    expect(tab.locator("#switch-team")).to_have_value(str(world.t1.team.pk))


def _luminance(rgb: tuple[float, float, float]) -> float:
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a, b) -> float:
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


# The focused element's outline colour and width, and the colour behind the outline: the first
# opaque background of its ancestors (the ring is drawn outside the element, over its parent).
FOCUS_RING = """() => {
  const el = document.activeElement, style = getComputedStyle(el);
  const rgb = (text) => (text.match(/[\\d.]+/g) || []).map(Number);
  let behind = el.parentElement, bg = [255, 255, 255];
  while (behind) {
    const c = rgb(getComputedStyle(behind).backgroundColor);
    if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) { bg = c.slice(0, 3); break; }
    behind = behind.parentElement;
  }
  return {what: el.tagName + (el.id ? '#' + el.id : '') + ' ' + (el.textContent || '').trim().slice(0, 30),
          style: style.outlineStyle, width: parseFloat(style.outlineWidth), ring: rgb(style.outlineColor).slice(0, 3),
          bg};
}"""


def test_the_focus_ring_has_3_to_1_contrast_wherever_the_tab_key_goes(tab, people, fleet):
    log_in(tab, people["t1_member"])
    tab.goto("/reservations/new/")
    seen = []
    for _ in range(30):
        tab.keyboard.press("Tab")
        ring = tab.evaluate(FOCUS_RING)
        seen.append(ring["what"])
        assert ring["style"] != "none" and ring["width"] >= 2, f"no focus ring on {ring['what']}"
        ratio = contrast(ring["ring"], ring["bg"])
        assert ratio >= 3, f"{ring['what']}: ring {ring['ring']} on {ring['bg']} is {ratio:.2f}:1"
    assert any("Switch" in what for what in seen) and any(what.startswith("SELECT") for what in seen)


def test_the_skip_link_moves_the_focus_to_the_content(tab, people, fleet):
    log_in(tab, people["t1_member"])
    tab.goto("/reservations/")
    tab.keyboard.press("Tab")
    assert tab.evaluate("document.activeElement.textContent.trim()") == "Skip to content"

    tab.keyboard.press("Enter")

    assert tab.evaluate("document.activeElement.id") == "content"
    tab.keyboard.press("Tab")  # and the next Tab goes on inside the content, not back to the top bar
    assert tab.evaluate("document.getElementById('content').contains(document.activeElement)")


#
# Phone width
#


def phone_check(page, path: str, name: str) -> dict:
    page.goto(path)
    measured = page.evaluate("""() => ({
      scroll: document.scrollingElement.scrollWidth, inner: innerWidth,
      top: Math.round(document.getElementById('content').getBoundingClientRect().top),
      wide: [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > innerWidth + 1
              && !e.closest('.table-wrap, pre, nav.side'))
              .slice(0, 3).map(e => e.tagName + '.' + e.className)})""")
    screenshot(page, f"phone-{name}")
    return measured


def test_at_phone_width_no_page_scrolls_sideways_and_content_starts_near_the_top(new_page, people, world, fleet):
    member = new_page()
    member.set_viewport_size(PHONE)
    log_in(member, people["t1_member"])
    reservation, vpc = world.t1.objects[Reservation], world.t1.objects[VPC]
    pages = [(member, path) for path in TENANT_PAGES + [f"/vpcs/{vpc.pk}/", f"/reservations/{reservation.pk}/"]]
    admin = new_page()
    admin.set_viewport_size(PHONE)
    log_in(admin, people["t1_admin"])
    pages += [(admin, path) for path in ADMIN_PAGES]
    staff = new_page()
    staff.set_viewport_size(PHONE)
    log_in(staff, people["platform_admin"])
    node = Node.objects.order_by("hostname").first()
    pages += [(staff, path) for path in STAFF_PAGES + [f"/staff/fleet/nodes/{node.pk}/"]]

    problems = []
    for page, path in pages:
        name = path.strip("/").replace("/", "-") or "dashboard"
        m = phone_check(page, path, name)
        if m["scroll"] > m["inner"]:
            problems.append(f"{path}: {m['scroll']} px wide in {m['inner']} ({m['wide']})")
        if m["top"] > CONTENT_TOP_MAX_PX:
            problems.append(f"{path}: the content starts {m['top']} px down")
    assert problems == [], "\n".join(problems)


def test_at_desktop_width_the_side_navigation_stays_beside_the_content(tab, people, fleet):
    log_in(tab, people["t1_member"])
    tab.goto("/reservations/")
    side = tab.locator("nav.side").bounding_box()
    content = tab.locator("#content").bounding_box()
    assert side["x"] + side["width"] <= content["x"] and content["y"] < 80
    screenshot(tab, "desktop-reservations")
