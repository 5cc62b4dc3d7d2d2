"""
JSON log lines (MERIDIAN_LOG_FORMAT=json, config.logging_json): every line says when, how bad, who
logged it and what, and whose request it was (request id, tenant); a task's lines carry the id of
the request that queued it; an exception is a field; the access log and the node API's handler
say the same; the settings pick the format.
"""

from __future__ import annotations

import io
import json
import logging
import uuid
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from gunicorn.config import Config

from config.access_log import AccessLogger
from config.logging_json import JsonFormatter, log_format
from core import log_context
from core.log_context import ContextFilter, LogContext
from tests.config.worker_thread import volume_created_by_a_request, wait_for, worker_thread
from tests.operations.test_node_api_handler import call

FIELDS = {"timestamp", "level", "logger", "message", "request_id", "tenant"}


class Lines(logging.Handler):
    """The JSON lines written through the settings' formatter and filter, parsed back."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.stream = io.StringIO()
        self.setFormatter(JsonFormatter())
        self.addFilter(ContextFilter())

    def emit(self, record):
        self.stream.write(self.format(record) + "\n")

    def parsed(self) -> list[dict]:
        return [json.loads(line) for line in self.stream.getvalue().splitlines()]

    def about(self, text: str) -> list[dict]:
        return [line for line in self.parsed() if text in line["message"]]


@pytest.fixture
def application():
    """The project's WSGI application (imported first: Django's setup then configures logging, afresh)."""
    from config.wsgi import application

    return application


@pytest.fixture
def worker():
    """A Celery worker thread (its start sets Django up again, which configures logging afresh: before ``lines``)."""
    with worker_thread() as started:
        yield started


@pytest.fixture
def lines():
    handler, root = Lines(), logging.getLogger()
    root.addHandler(handler)
    level, root.level = root.level, logging.INFO
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_a_line_has_every_field_outside_a_request_too(lines):
    logging.getLogger("meridian.test").warning("plain %s", "words", extra={"node": "gpu-001"})
    (line,) = lines.about("plain words")
    assert set(line) >= FIELDS and line["request_id"] is None and line["tenant"] is None
    assert line["level"] == "WARNING" and line["logger"] == "meridian.test" and line["node"] == "gpu-001"
    assert line["timestamp"].endswith("Z") and "T" in line["timestamp"]  # ISO 8601, UTC
    assert "task_name" not in line and "exception" not in line


def test_an_exception_is_a_structured_field(lines):
    with log_context.bound(LogContext(request_id="req-1", tenant="acme")):
        try:
            {}["missing"]
        except KeyError:
            logging.getLogger("meridian.test").exception("The lookup failed.")
    (line,) = lines.about("The lookup failed.")
    assert line["request_id"] == "req-1" and line["tenant"] == "acme" and line["level"] == "ERROR"
    assert line["exception"]["type"] == "KeyError" and line["exception"]["message"] == "'missing'"
    assert line["exception"]["traceback"].startswith("Traceback (most recent call last):")
    assert "KeyError: 'missing'" in line["exception"]["traceback"]


@pytest.mark.django_db
def test_an_api_request_s_lines_carry_its_id_and_its_tenant(world, lines):
    missing = uuid.uuid4()
    response = world.client("t1_member").get(f"/api/v1/volumes/{missing}/", HTTP_X_REQUEST_ID="client-chosen-id-1")
    assert response.status_code == 404 and response["X-Request-ID"] == "client-chosen-id-1"
    # Django logs the 404 after the middleware returned; the line still knows whose request it was.
    (line,) = [line for line in lines.about(str(missing)) if line["logger"] == "django.request"]
    assert line["request_id"] == "client-chosen-id-1" and line["tenant"] == world.t1.tenant.slug
    assert line["status_code"] == 404 and "request" not in line


@pytest.mark.django_db
def test_a_signed_in_browser_s_lines_carry_the_tenant_it_acts_for(world, lines):
    client = Client()
    client.force_login(world.users["t1_member"])
    missing = uuid.uuid4()
    assert client.get(f"/api/v1/volumes/{missing}/").status_code == 404
    (line,) = [line for line in lines.about(str(missing)) if line["logger"] == "django.request"]
    assert line["tenant"] == world.t1.tenant.slug


@pytest.mark.django_db
def test_an_anonymous_request_has_an_id_and_no_tenant(world, lines):
    response = world.client("anon").get("/api/v1/volumes/")
    assert response.status_code == 401
    (line,) = lines.about("/api/v1/volumes/")
    assert line["request_id"] == response["X-Request-ID"] and line["tenant"] is None


@pytest.mark.django_db(transaction=True)  # a WSGI request closes the test's connection when it starts
def test_the_node_api_s_own_handler_gives_its_requests_an_id(world, application, lines):
    status, sent, _ = call(application, "/api/agent/v1/nothing/")
    assert status == 404
    (line,) = lines.about("/api/agent/v1/nothing/")
    assert line["request_id"] == sent["X-Request-ID"] and line["tenant"] is None


@pytest.mark.django_db(transaction=True)  # the step is queued on commit and run by a worker thread
def test_a_task_s_lines_carry_the_id_and_tenant_of_the_request_that_queued_it(world, worker, lines, monkeypatch):
    volume = volume_created_by_a_request(world, monkeypatch, "queued-by-this-request")
    (line,) = wait_for(lambda: lines.about(f"Creating {volume.backend_ref}."))
    assert line["request_id"] == "queued-by-this-request" and line["tenant"] == world.t1.tenant.slug
    assert line["task_name"] == "storage.volume_converge" and line["task_id"]
    # Outside the task the worker's thread is nobody's again.
    assert log_context.current() is None


def test_a_task_run_in_place_keeps_the_request_s_id():
    from config.celery import _enter_task, _leave_task

    request = SimpleNamespace()  # no headers: run in place, as an eager call would
    task = SimpleNamespace(name="storage.volume_converge", request=request)
    with log_context.bound(LogContext(request_id="req-2", tenant="acme")) as outer:
        _enter_task(task_id="t-1", task=task)
        inner = log_context.current()
        assert (inner.request_id, inner.tenant, inner.task_id) == ("req-2", "acme", "t-1")
        _leave_task(task_id="t-1")
        assert log_context.current() is outer


def test_a_publish_carries_the_request_s_id_and_tenant_and_nothing_outside_one():
    from config.celery import _carry_request

    headers = {}
    _carry_request(headers=headers)
    assert headers == {}
    with log_context.bound(LogContext(request_id="req-3", tenant="acme")):
        _carry_request(headers=headers)
    assert headers == {"meridian_request_id": "req-3", "meridian_tenant": "acme"}


def test_the_access_log_s_json_lines_carry_the_request_s_fields(monkeypatch):
    monkeypatch.setenv("MERIDIAN_LOG_FORMAT", "json")
    config = Config()
    config.set("accesslog", "-")
    logger = AccessLogger(config)
    (handler,) = [h for h in logger.access_log.handlers if getattr(h, "_gunicorn", False)]
    assert isinstance(handler.formatter, JsonFormatter)
    handler.stream = stream = io.StringIO()
    context = LogContext(request_id="req-4", tenant="acme")
    environ = {"REQUEST_METHOD": "POST", "RAW_URI": "/api/v1/volumes/", "PATH_INFO": "/api/v1/volumes/",
               "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1", log_context.ENVIRON_KEY: context}
    response = SimpleNamespace(status="201 Created", status_code=201, sent=42, headers=[("X-Request-ID", "req-4")])
    logger.access(response, SimpleNamespace(headers=[]), environ, timedelta(milliseconds=7))
    line = json.loads(stream.getvalue())
    assert set(line) >= FIELDS and line["logger"] == "gunicorn.access" and '"POST /api/v1/volumes/' in line["message"]
    assert (line["request_id"], line["tenant"], line["status"], line["method"]) == ("req-4", "acme", 201, "POST")
    assert line["duration_ms"] == 7.0 and line["bytes"] == 42 and line["path"] == "/api/v1/volumes/"


def test_the_settings_pick_the_format():
    from django.conf import settings

    assert settings.LOGGING["formatters"]["json"]["()"] == "config.logging_json.JsonFormatter"
    assert settings.LOGGING["handlers"]["console"]["filters"] == ["context"]
    assert settings.LOGGING["handlers"]["console"]["formatter"] == settings.MERIDIAN_LOG_FORMAT in ("plain", "json")


def test_a_format_that_is_neither_stops_the_process(monkeypatch):
    monkeypatch.setenv("MERIDIAN_LOG_FORMAT", "xml")
    with pytest.raises(ImproperlyConfigured, match="set plain or json"):
        log_format()
    monkeypatch.setenv("MERIDIAN_LOG_FORMAT", " JSON ")
    assert log_format() == "json"
