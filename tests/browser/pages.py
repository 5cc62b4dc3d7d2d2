"""
What the browser tests share: where Chromium is and how it starts, signing in through the real
form, full-page screenshots under var/screenshots/, and the console listener that fails a test on
any error, uncaught exception or CSP violation a page reports (ENGINEERING.md, row 22).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.urls import Resolver404, resolve

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]
SCREENSHOTS = REPO / "var" / "screenshots"
PASSWORD = "browser-test-password-7"
# Console errors every page may show (none today: a page's console stays clean).
KNOWN_CONSOLE_ERRORS: list[str] = []
# What a page may take to answer, and what provisioning may take to reach active (seconds).
PAGE_TIMEOUT_S = 15
ACTIVE_TIMEOUT_S = 60


class ConsoleLog:
    """
    What the page reported: console errors, uncaught exceptions, CSP violations, dialogs. A test
    that expects an error (a 404 it opens on purpose) says so with ``allow``; anything else fails it.
    """

    def __init__(self):
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.allowed: list[re.Pattern] = [re.compile(pattern) for pattern in KNOWN_CONSOLE_ERRORS]

    def allow(self, pattern: str) -> None:
        self.allowed.append(re.compile(pattern))

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(p.search(e) for p in self.allowed)]

    def on_console(self, message) -> None:
        text = message.text
        if message.type == "error" or "Content Security Policy" in text or "Content-Security-Policy" in text:
            location = message.location or {}
            self.errors.append(f"console.{message.type}: {text} ({location.get('url', '')})")

    def on_page_error(self, error) -> None:
        self.errors.append(f"uncaught: {error}")

    def on_dialog(self, dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        if dialog.type == "confirm":
            dialog.accept()  # the console's "Cancel this reservation?" asks: the user says yes
        else:
            dialog.dismiss()


def log_in(page, user, password: str = PASSWORD) -> None:
    """Sign in through the real /login/ form (e-mail and password), as a person would."""
    page.goto("/login/")
    page.get_by_label("E-mail").fill(user.email)
    page.get_by_label("Password").fill(password)
    with page.expect_navigation():
        page.get_by_role("button", name="Sign in").click()
    assert "/login/" not in page.url, f"signing in as {user.email} failed: {page.locator('main').inner_text()}"


def screenshot(page, name: str) -> Path:
    """A full-page PNG under var/screenshots/ (gitignored), to look at after the run."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def url_exists(path: str) -> bool:
    """Whether the console has a page at ``path``."""
    try:
        resolve(path)
    except Resolver404:
        return False
    return True


def require_pages(paths) -> None:
    """Fail the test, naming them, when any of ``paths`` is not a page of the console: a missing page
    is a failure, never a reason to check fewer."""
    missing = [path for path in paths if not url_exists(path)]
    if missing:
        pytest.fail(f"The console has no page at {', '.join(missing)}.", pytrace=False)
