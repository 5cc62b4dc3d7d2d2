"""
Browser tests of the console: Debian's Chromium (/usr/bin/chromium, never a downloaded browser)
driven by Playwright's sync API against pytest-django's live server, with a Celery worker in a
thread of the test process so provisioning really moves while a page watches it.

Why these fixtures and not pytest-playwright's: the plugin's ``playwright`` fixture is session
scoped, and a started sync Playwright leaves its asyncio loop marked as running in the main
thread until it is stopped. Django then refuses every ORM call made from that thread
(SynchronousOnlyOperation), so every later database test the same xdist worker runs would fail
unless DJANGO_ALLOW_ASYNC_UNSAFE were set for the whole session, switching Django's guard off for
the entire suite. Here Playwright and the browser live for one test module: the guard is off only
while they run, and the loop is gone again before the worker moves on to other tests. Each xdist
worker gets its own live server (session scoped, per process), browser and broker queue.

The worker (``celery_worker``) consumes from kombu's in-memory transport: the live server's
request threads publish the lifecycle's tasks on commit through the project's Celery app, as the
web process does, and a ``solo`` worker thread runs them against the test database. Nothing
outside the process is needed (no RabbitMQ, no filesystem broker shared between xdist workers).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
from celery.contrib.testing.worker import start_worker
from celery.signals import setup_logging, task_postrun
from django.db import connections
from playwright.sync_api import sync_playwright

from config.celery import app
from tests.browser.pages import CHROMIUM, LAUNCH_ARGS, PAGE_TIMEOUT_S, PASSWORD, ConsoleLog
from tests.celery_app import app_on_broker

#
# Browser
#


@pytest.fixture(scope="module")
def chromium():
    """Debian's Chromium, headless, for one test module (skipped where it is not installed)."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium); the browser tests need it")
    with pytest.MonkeyPatch.context() as patch:
        # Playwright's loop runs in this thread: Django would refuse the tests' own ORM calls.
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=LAUNCH_ARGS)
            try:
                yield launched
            finally:
                launched.close()


@pytest.fixture
def console_log() -> ConsoleLog:
    return ConsoleLog()


@pytest.fixture
def new_page(chromium, live_server, console_log):
    """
    ``new_page()``: a page in a fresh browser context (its own cookies: one signed-in user) on the
    live server, watched by ``console_log``, 1280 px wide unless ``viewport`` says otherwise, with
    JavaScript unless ``script=False``. The test fails on any console error, uncaught exception or
    CSP violation the pages reported that it did not ``allow`` (ENGINEERING row 22).
    """
    contexts = []

    def make(viewport: dict | None = None, script: bool = True):
        context = chromium.new_context(base_url=live_server.url, viewport=viewport or {"width": 1280, "height": 900},
                                       java_script_enabled=script)
        context.set_default_timeout(PAGE_TIMEOUT_S * 1000)
        contexts.append(context)
        page = context.new_page()
        page.on("console", console_log.on_console)
        page.on("pageerror", console_log.on_page_error)
        page.on("dialog", console_log.on_dialog)
        return page

    yield make
    for context in contexts:
        context.close()
    unexpected = console_log.unexpected()
    if unexpected:
        pytest.fail("The pages reported errors:\n" + "\n".join(unexpected), pytrace=False)


@pytest.fixture
def tab(new_page):
    """One page (not named ``page``: pytest-playwright would parametrize the test by browser)."""
    return new_page()


#
# The world, with passwords
#


@pytest.fixture
def people(world):
    """The world's personas, each able to sign in with PASSWORD."""
    for user in world.users.values():
        user.set_password(PASSWORD)
        user.save(update_fields=["password"])
    return world.users


#
# Celery: the in-memory broker and a worker thread
#


@pytest.fixture(autouse=True)
def broker():
    """
    The project's Celery app publishes to kombu's in-memory transport, on a queue of this test's
    own, for the test; afterwards the app is as it was (its settings, connection pool and AMQP
    helper, which Celery caches in ``app._pool`` and ``app.amqp``). Yields the queue's name.
    """
    queue = f"meridian-browser-{uuid.uuid4().hex[:12]}"
    with app_on_broker(broker_url="memory://", queue=queue, transport_options={"polling_interval": 0.05}) as connection:
        try:
            yield queue
        finally:
            connection.default_channel.queue_delete(queue)  # what no worker took (tests without one)


@pytest.fixture
def celery_worker(broker) -> Iterator[object]:
    """
    A Celery worker (one ``solo`` thread) consuming this test's queue: what the live server
    enqueues on commit runs here, against the test database, as a worker process would run it.
    """
    def leave_logging_alone(**_):
        """A receiver of setup_logging: Celery then keeps its hands off the test run's logging."""

    def close_connections(**_):
        # Tasks run in the worker's thread (nothing runs eagerly here): its database connections
        # are closed after each one, so none is left open for the flush after the test or the
        # drop of the test database.
        if threading.current_thread() is not threading.main_thread():
            connections.close_all()

    setup_logging.connect(leave_logging_alone, weak=False)
    task_postrun.connect(close_connections, weak=False)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("CELERY_SKIP_CHECKS", "1")  # Django's checks ran when the suite started
            with start_worker(app, pool="solo", concurrency=1, perform_ping_check=False, shutdown_timeout=30,
                              queues=[broker], hostname=f"{broker}@localhost") as worker:
                yield worker
    finally:
        setup_logging.disconnect(leave_logging_alone)
        task_postrun.disconnect(close_connections)
