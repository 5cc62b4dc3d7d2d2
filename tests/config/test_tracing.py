"""
Tracing (config.tracing): one trace follows a request through the API, the Celery step it queued
(across a real message, to a worker) and the driver call the step made; log lines carry its ids;
the node API's handler is traced too; a lone database statement starts no trace; and off -- the
default -- nothing is instrumented, no span is made and drivers are handed out as they are.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.instrumentation.django import DjangoInstrumentor
from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from config import tracing
from core import log_context
from core import tracing as hooks
from provisioning.drivers import DriverError, Target, drivers_for
from provisioning.drivers.simulated import SimulatedPower
from storage.drivers import driver_for
from storage.drivers.simulated import SimulatedStorage
from tests.config.worker_thread import volume_created_by_a_request, wait_for, worker_thread
from tests.operations.test_node_api_handler import call

REPO = Path(__file__).resolve().parents[2]
OTEL_MIDDLEWARE = DjangoInstrumentor._opentelemetry_middleware


@pytest.fixture
def worker():
    """A Celery worker thread, started before tracing (its start sets Django up again)."""
    with worker_thread() as started:
        yield started


@pytest.fixture
def spans():
    """Tracing on for the test, its spans kept in memory; off again afterwards."""
    exporter = InMemorySpanExporter()
    assert tracing.setup("test", exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.shutdown()


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.addFilter(log_context.ContextFilter())
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def records():
    handler, root = Records(), logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler.records
    finally:
        root.removeHandler(handler)


def named(exporter, name: str):
    return [span for span in exporter.get_finished_spans() if span.name == name]


@pytest.mark.django_db(transaction=True)  # the step is queued on commit and run by the worker thread
def test_a_request_its_celery_step_and_the_driver_call_are_one_trace(world, worker, spans, records, monkeypatch):
    volume = volume_created_by_a_request(world, monkeypatch, "traced-request-1")
    (run,) = wait_for(lambda: named(spans, "run/storage.volume_converge"))

    (server,) = [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]
    (publish,) = named(spans, "apply_async/storage.volume_converge")
    (driver,) = named(spans, "driver.storage.create")
    assert server.parent is None and server.attributes["http.method"] == "POST"
    assert server.attributes["meridian.request_id"] == "traced-request-1"
    assert server.attributes["meridian.tenant"] == world.t1.tenant.slug
    assert publish.kind == SpanKind.PRODUCER and publish.parent.span_id == server.context.span_id
    assert run.kind == SpanKind.CONSUMER and run.parent.span_id == publish.context.span_id
    assert driver.parent.span_id == run.context.span_id
    assert {s.context.trace_id for s in (server, publish, run, driver)} == {server.context.trace_id}
    assert driver.attributes["meridian.driver.kind"] == "storage"
    assert driver.attributes["meridian.driver"] == "SimulatedStorage"
    assert driver.attributes["meridian.storage.ref"] == volume.backend_ref
    assert server.resource.attributes["service.name"] == "meridian-test"

    (line,) = [r for r in records if r.getMessage() == f"Creating {volume.backend_ref}."]
    assert line.trace_id == format(server.context.trace_id, "032x")
    assert line.span_id == format(driver.context.span_id, "016x")
    assert (line.request_id, line.task_name) == ("traced-request-1", "storage.volume_converge")


@pytest.mark.django_db(transaction=True)  # a WSGI request closes the test's connection when it starts
def test_the_node_api_s_own_handler_is_traced_too(world, spans):
    from operations.node_api.handler import NodeAPIHandler

    assert settings.MERIDIAN_NODE_API_MIDDLEWARE[0] == OTEL_MIDDLEWARE
    status, sent, _ = call(NodeAPIHandler(), "/api/agent/v1/nothing/")
    assert status == 404
    (server,) = [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert server.attributes["meridian.request_id"] == sent["X-Request-ID"]


@pytest.mark.django_db  # the simulated BMC keeps its state in the database
def test_a_driver_call_is_a_span_and_the_driver_is_still_itself(spans):
    power = drivers_for("us-east-1").power
    assert isinstance(power, SimulatedPower) and type(power) is not SimulatedPower
    target = Target(node_id="node-1", hostname="gpu-001")
    power.set_power(target, True)
    assert power.power_state(target) == "on"
    (state,) = named(spans, "driver.power.power_state")
    assert state.attributes["meridian.node.id"] == "node-1"
    assert state.attributes["meridian.node.hostname"] == "gpu-001"
    assert state.attributes["meridian.driver"] == "SimulatedPower"


@pytest.mark.django_db  # the simulated BMC keeps its state in the database
def test_a_failed_driver_call_is_an_error_span(spans, monkeypatch):
    def refuse(self, target, on):
        raise DriverError("The BMC refused.", transient=False)

    monkeypatch.setattr(SimulatedPower, "set_power", refuse)
    with pytest.raises(DriverError):
        drivers_for("us-east-1").power.set_power(Target(node_id="node-1", hostname="gpu-001"), True)
    (span,) = named(spans, "driver.power.set_power")
    assert span.status.status_code == StatusCode.ERROR
    assert span.events[0].name == "exception"


@pytest.mark.django_db
def test_a_database_statement_alone_starts_no_trace(spans):
    s = connection.settings_dict
    with psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"],
                         password=s["PASSWORD"] or None, dbname=s["NAME"]) as conn:
        conn.execute("SELECT 1")
        assert spans.get_finished_spans() == ()
        with tracing._state["provider"].get_tracer("test").start_as_current_span("a cycle"):
            conn.execute("SELECT 2")
    (query,) = [span for span in spans.get_finished_spans() if span.kind == SpanKind.CLIENT]
    (cycle,) = named(spans, "a cycle")
    assert query.parent.span_id == cycle.context.span_id


def test_off_nothing_is_instrumented_and_drivers_are_themselves(monkeypatch):
    monkeypatch.delenv("MERIDIAN_TRACING", raising=False)
    assert tracing.setup("web") is False and not tracing.active() and not hooks.enabled()
    assert tracing.setup_for_command(["manage.py", "run_scheduler"]) is False
    for instrumentor in (DjangoInstrumentor(), CeleryInstrumentor(), PsycopgInstrumentor()):
        assert not instrumentor.is_instrumented_by_opentelemetry
    assert OTEL_MIDDLEWARE not in settings.MIDDLEWARE and OTEL_MIDDLEWARE not in settings.MERIDIAN_NODE_API_MIDDLEWARE
    assert not hasattr(psycopg.connect, "__wrapped__")
    assert type(drivers_for("us-east-1").power) is SimulatedPower
    assert type(driver_for("simulated")) is SimulatedStorage
    record = logging.makeLogRecord({"msg": "x"})
    log_context.ContextFilter().filter(record)
    assert not hasattr(record, "trace_id")


def test_off_a_fresh_web_process_loads_no_opentelemetry():
    env = {key: value for key, value in os.environ.items() if key != "MERIDIAN_TRACING"}
    env.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    code = "import sys, config.wsgi; print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_the_switch(monkeypatch):
    for value, on in (("1", True), ("true", True), ("0", False), ("", False)):
        monkeypatch.setenv("MERIDIAN_TRACING", value)
        assert tracing.requested() is on
    monkeypatch.setenv("MERIDIAN_TRACING", "1")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.requested() is False
