"""
Every page of the console through axe-core (4.12.1, bundled by axe-playwright-python) and a check
of the focus ring, as a tenant owner, a viewer and a platform admin, at 1280 px and 390 px, with
JavaScript on and off. A broken rule fails the test, naming the rule, the elements, the page, the
persona, the width and whether script ran.

What axe checks: the WCAG 2.0 and 2.1 A and AA rules (labels, names of links and buttons, colour
contrast, ARIA, duplicate ids, lists, tables, scrollable regions) and three best practices about
landmarks and headings (one main landmark, all content inside landmarks, an h1 on every page).
What axe does not check, the contrast of focus, is checked here: every element the Tab key reaches
is focused in turn and its ring must be drawn (2 px or more) at 3:1 against what lies under it.

Axe runs in an isolated world of the page (a content script's world, over the DevTools protocol),
not in the page's own: the page's Content-Security-Policy stays as it is (no ``bypass_csp``), the
console listener still fails the test on a CSP violation, and with JavaScript off the page's
scripts stay off while axe runs. Chromium runs no timers there when script is off, so that world's
``setTimeout`` becomes a microtask for the zero-delay deferrals axe makes (its longer timeouts, which
only guard frames and preloads, never fire: the console has no frames).
"""

from __future__ import annotations

import json
import uuid

import pytest
from axe_playwright_python.base import AXE_SCRIPT
from playwright.sync_api import expect

from cloud.models import Node
from provisioning.models import VPC, Instance
from tenants import services
from tenants.choices import TenantRole
from tenants.models import APIToken, HighPriorityApplication
from tenants.scoping import Principal
from tests.browser.pages import log_in, require_pages, url_exists
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY, reserve_on_small_fleet

pytestmark = pytest.mark.slow

VIEWPORTS = {1280: {"width": 1280, "height": 900}, 390: {"width": 390, "height": 844}}
PERSONAS = ["t1_owner", "t1_viewer", "platform_admin"]
# The WCAG 2.0 and 2.1 A and AA rules, and three best practices: every page has one main landmark,
# all its content inside landmarks, and an h1.
AXE_OPTIONS = {
    "runOnly": {"type": "tag", "values": ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]},
    "rules": {"landmark-one-main": {"enabled": True}, "region": {"enabled": True},
              "page-has-heading-one": {"enabled": True}},
    "resultTypes": ["violations"],
}
# How many of a rule's elements a failure names.
TARGETS_SHOWN = 3

# Zero-delay timers as microtasks, for the isolated world of a page whose scripts are off.
NO_TIMERS = """
window.setTimeout = (callback, delay, ...args) => {
  if (!(delay > 1)) Promise.resolve().then(() => callback(...args));
  return 0;
};
window.clearTimeout = () => {};
"""

# While a page is checked htmx sends nothing (its polls would swap parts of the page under axe):
# a listener of this world cancels each request before it leaves (DOM events reach every world).
HOLD_HTMX = 'document.addEventListener("htmx:beforeRequest", (event) => event.preventDefault(), true); 0'

RUN_AXE = f"""
axe.run(document, {json.dumps(AXE_OPTIONS)}).then(results => results.violations.map(v => ({{
  id: v.id, impact: v.impact, help: v.help, targets: v.nodes.map(n => n.target.join(" "))}})))
"""

# Each element the Tab key reaches, focused in turn: its outline (style, width, colour) and what
# lies under the ring, found at a point of the ring itself (left of the element, or right of it
# where the left is off the screen): the first opaque background there that is not the element's.
FOCUS_RINGS = """
(() => {
  const rgba = (text) => (text.match(/[\\d.]+/g) || []).map(Number);
  const channel = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
  const luminance = ([r, g, b]) => 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b);
  const ratio = (a, b) => { const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x);
                            return (hi + 0.05) / (lo + 0.05); };
  const opaque = (c) => c.length === 3 || (c.length === 4 && c[3] > 0.5);
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "")
    + (el.className && typeof el.className === "string" ? "." + el.className.trim().split(/\\s+/).join(".") : "")
    + ' "' + (el.textContent || el.value || el.name || "").trim().replace(/\\s+/g, " ").slice(0, 30) + '"';
  const reachable = [...document.querySelectorAll(
      "a[href], button, input:not([type=hidden]), select, textarea, summary, iframe, [tabindex], [contenteditable]")]
    .filter((el) => el.tabIndex >= 0 && !el.disabled && !el.closest("[inert], fieldset[disabled]")
                    && el.checkVisibility({visibilityProperty: true}));
  const problems = [];
  for (const el of reachable) {
    el.focus();
    if (document.activeElement !== el) continue;
    const style = getComputedStyle(el);
    const width = parseFloat(style.outlineWidth) || 0;
    if (style.outlineStyle === "none" || width === 0) { problems.push(`${name(el)}: no focus ring`); continue; }
    if (style.outlineStyle === "auto") continue;  // Chromium's own two-tone ring: dark and light, on anything
    if (width < 2) { problems.push(`${name(el)}: a focus ring ${width}px wide`); continue; }
    const box = el.getBoundingClientRect(), away = parseFloat(style.outlineOffset) + width / 2;
    const x = box.left - away >= 0 ? box.left - away : box.right + away;
    const y = Math.min(Math.max(box.top + box.height / 2, 0), innerHeight - 1);
    let under = [255, 255, 255];
    for (const behind of document.elementsFromPoint(x, y)) {
      if (behind === el || el.contains(behind)) continue;
      const c = rgba(getComputedStyle(behind).backgroundColor);
      if (opaque(c)) { under = c.slice(0, 3); break; }
    }
    const ring = rgba(style.outlineColor).slice(0, 3), contrast = ratio(ring, under);
    if (contrast < 3) {
      problems.push(`${name(el)}: ring rgb(${ring}) on rgb(${under}) is ${contrast.toFixed(2)}:1 (3:1 needed)`);
    }
  }
  if (document.activeElement) document.activeElement.blur();
  return problems;
})()
"""


class Auditor:
    """
    Axe and the focus-ring check on one page, JavaScript on or off. Axe is loaded into an isolated
    world of every document the page opens (``world``), before the page's own scripts, if any, run.
    """

    world = "accessibility"

    def __init__(self, page, *, script: bool, persona: str):
        self.page, self.script, self.persona = page, script, persona
        self.cdp = page.context.new_cdp_session(page)
        self.cdp.send("Page.enable")
        self.cdp.send("Page.addScriptToEvaluateOnNewDocument",
                      {"source": ("" if script else NO_TIMERS) + AXE_SCRIPT, "worldName": self.world})
        self.context, self.where = 0, ""

    def evaluate(self, expression: str, *, wait: bool = True):
        answer = self.cdp.send("Runtime.evaluate", {"expression": expression, "contextId": self.context,
                                                    "awaitPromise": wait, "returnByValue": wait})
        if "exceptionDetails" in answer:
            details = answer["exceptionDetails"]
            raise AssertionError(f"{self.where}: {details.get('exception', {}).get('description') or details}")
        return answer["result"].get("value")

    def start(self, width: int, label: str) -> None:
        """Set the width and start axe, without waiting for it (another page's axe may run meanwhile)."""
        self.where = f"[{self.persona} {width}px {'js' if self.script else 'no-js'}] {label}"
        if self.page.viewport_size != VIEWPORTS[width]:
            self.page.set_viewport_size(VIEWPORTS[width])
        if self.script and self.page.locator("[hx-trigger='load']").count():
            self.page.wait_for_load_state("networkidle")  # what htmx loads into the page on arrival
        frame = self.cdp.send("Page.getFrameTree")["frameTree"]["frame"]["id"]
        # The world of that name in this document: the one axe was loaded into.
        world = self.cdp.send("Page.createIsolatedWorld", {"frameId": frame, "worldName": self.world})
        self.context = world["executionContextId"]
        if self.script:
            self.evaluate(HOLD_HTMX, wait=False)
        self.evaluate(f"globalThis.running = {RUN_AXE}; 0", wait=False)

    def finish(self) -> list[str]:
        """Axe's findings, then the focus rings', as lines naming the page, persona, width and script."""
        problems = []
        for violation in self.evaluate("globalThis.running"):
            targets = violation["targets"]
            more = f" (+{len(targets) - TARGETS_SHOWN} more)" if len(targets) > TARGETS_SHOWN else ""
            problems.append(f"{self.where}: {violation['id']} ({violation['impact']}) {violation['help']}: "
                            f"{', '.join(targets[:TARGETS_SHOWN])}{more}")
        self.page.keyboard.press("Tab")  # a keyboard user: focus moved by script now shows its ring
        return problems + [f"{self.where}: focus-ring {problem}" for problem in self.evaluate(FOCUS_RINGS)]


class Walk:
    """
    A persona's walk in two browser contexts at once, one with JavaScript and one without: each
    page is opened in both and checked at each width (the viewport resized in place, no reload).
    The two pages' axe runs overlap, each in its own renderer process.
    """

    def __init__(self, pages, persona: str):
        self.auditors = [Auditor(page, script=script, persona=persona) for script, page in pages.items()]
        self.pages = [auditor.page for auditor in self.auditors]
        self.problems: list[str] = []
        self.seen: list[str] = []

    def check(self, label: str) -> None:
        for width in VIEWPORTS:
            for auditor in self.auditors:  # JavaScript on first: its axe runs on while the other starts
                auditor.start(width, label)
            for auditor in self.auditors:
                self.problems += auditor.finish()
        self.seen.append(label)

    def visit(self, path: str, status: int = 200) -> None:
        for page in self.pages:
            response = page.goto(path)
            assert response.status == status, f"{path}: {response.status}, not {status}"
        self.check(path)


def path_of(url: str) -> str:
    return "/" + url.split("://", 1)[-1].split("/", 1)[-1]


#
# Fixtures
#


@pytest.fixture
def audit_pages(new_page):
    """``audit_pages()``: a page with JavaScript and one without, each in a fresh context, by ``script``."""
    return lambda: {script: new_page(VIEWPORTS[1280], script=script) for script in (True, False)}


@pytest.fixture
def places(world, people, steps):
    """
    What each persona opens: the pages of its menus and one of each kind of object, an active
    reservation (with its instance and boot log) and a waiting one among them.
    """
    active = reserve_on_small_fleet(world, name="a11y-active")
    steps.run()
    response = world.client("t1_member").post("/api/v1/reservations/", {
        "name": "a11y-waiting", "offering": offering("vm", 1).slug, "regions": ["us-east-1"], "duration_hours": 2,
        "ssh_public_key": SSH_KEY, "gpus": 1}, format="json")
    assert response.status_code == 201, response.json()
    waiting = response.json()["id"]
    instance = Instance.objects.get(reservation_id=active)
    vpc, tenant = world.t1.objects[VPC], world.t1.tenant
    application = world.t1.objects[HighPriorityApplication]
    token = APIToken.objects.filter(user=world.t1.owner).first()
    node = Node.objects.order_by("hostname").first()
    tenant_pages = [
        "/", "/tenants/", "/reservations/", "/reservations/new/", f"/reservations/{active}/",
        f"/reservations/{waiting}/", "/vpcs/", f"/vpcs/{vpc.pk}/", f"/vpcs/{vpc.pk}/isolation/", "/teams/",
        "/quotas/", "/sla/", "/high-priority/", "/ssh-keys/", "/tokens/", "/notifications/",
    ]
    return {
        "t1_owner": tenant_pages + ["/audit/", "/vpcs/new/", f"/instances/{instance.pk}/console/",
                                    f"/tokens/{token.pk}/issued/", f"/high-priority/applications/{application.pk}/"],
        "t1_viewer": tenant_pages,
        "platform_admin": [
            "/staff/", f"/staff/search/?q={tenant.name}", "/staff/fleet/", f"/staff/fleet/nodes/{node.pk}/",
            "/staff/queue/", "/staff/incidents/?show=all", "/staff/quotas/", "/staff/sla/", f"/staff/sla/{tenant.pk}/",
            "/staff/high-priority/", f"/staff/high-priority/{application.pk}/", "/audit/",
        ],
    }


#
# The walk
#


def side_links(page) -> list[str]:
    """Every page the side navigation links to (so a page added to the menu is checked without asking)."""
    return page.locator("nav.side a[href]").evaluate_all("links => links.map(a => a.getAttribute('href'))")


def before_signing_in(walk: Walk, persona: str, world) -> None:
    """The pages a person sees before the console: an invitation's (the owner walks it) and the sign-in form."""
    if persona == "t1_owner":
        owner = Principal(user=world.t1.owner, tenant=world.t1.tenant, role=TenantRole.OWNER)
        _, link = services.invitation_create(actor=owner, role=TenantRole.MEMBER)
        for page in walk.pages:
            page.goto(path_of(link))  # it moves the secret into the session and goes on to the form
            assert page.url.endswith("/invitations/accept/"), page.url
        walk.check("/invitations/accept/ (signed out)")
    walk.visit("/login/")


def submit(page, button: str) -> None:
    with page.expect_navigation():
        page.get_by_role("button", name=button, exact=True).click()


def owner_flows(walk: Walk, console_log) -> None:
    """The owner's forms: a reservation and an invitation with mistakes (errors beside their fields), a new token."""
    console_log.allow(r"status of 400 \(Bad Request\) \(http://[^/]+/(reservations|teams/invitations)/new/\)")
    for page in walk.pages:
        page.goto("/reservations/new/")
        page.locator("#id_count").fill("0")
        submit(page, "Reserve")
        expect(page.locator("#id_count")).to_have_attribute("aria-invalid", "true")
    walk.check("/reservations/new/ (with errors)")

    for page in walk.pages:
        page.goto("/tokens/")
        page.locator("form[action='/tokens/new/'] input[name=name]").fill(f"a11y-{uuid.uuid4().hex[:6]}")
        submit(page, "Create token")
        expect(page.get_by_role("heading", name="Copy your token now")).to_be_visible()
    walk.check("/tokens/<new>/issued/ (its secret)")

    for page in walk.pages:
        page.goto("/teams/")
        submit(page, "Create invitation")
        expect(page.locator("#invite_email")).to_have_attribute("aria-invalid", "true")
    walk.check("/teams/ (an invitation without its e-mail)")

    for page in walk.pages:
        page.locator("#invite_email").fill(f"a11y-{uuid.uuid4().hex[:6]}@example.com")
        submit(page, "Create invitation")
        expect(page.get_by_role("heading", name="Give them this link")).to_be_visible()
    walk.check("/teams/invitations/<new>/ (its link)")


def error_pages(walk: Walk, persona: str, console_log) -> None:
    """The console's 404 page, and its 403 page for the viewer (who may not make a VPC)."""
    missing = f"/reservations/{uuid.uuid4()}/"
    console_log.allow(rf"status of 404 \(Not Found\) \(http://[^/]+{missing}\)")
    walk.visit(missing, status=404)
    if persona == "t1_viewer":
        console_log.allow(r"status of 403 \(Forbidden\) \(http://[^/]+/vpcs/new/\)")
        walk.visit("/vpcs/new/", status=403)


@pytest.mark.parametrize("persona", PERSONAS)
def test_every_page_passes_axe_and_shows_its_focus(audit_pages, console_log, people, world, places, persona):
    """Each page the persona opens, at 1280 px and 390 px, with JavaScript on and off."""
    walk = Walk(audit_pages(), persona)
    paths = places[persona]
    require_pages([path.split("?")[0] for path in paths])

    before_signing_in(walk, persona, world)
    for page in walk.pages:
        log_in(page, people[persona])
    menu = [link for link in side_links(walk.pages[0]) if link not in paths and url_exists(link)]
    for path in paths + menu:
        walk.visit(path)
    if persona == "t1_owner":
        owner_flows(walk, console_log)
    error_pages(walk, persona, console_log)

    assert walk.problems == [], (f"{len(walk.problems)} accessibility problems on {len(walk.seen)} pages "
                                 f"(each at {' and '.join(map(str, VIEWPORTS))} px, JavaScript on and off):\n"
                                 + "\n".join(walk.problems))
