"""
OpenTelemetry tracing (docs/observability.md): off unless ``MERIDIAN_TRACING=1``; then a process
traces as ``meridian-<role>`` and sends its spans over OTLP/HTTP, where the standard ``OTEL_*``
variables say (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS``,
``OTEL_TRACES_SAMPLER``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*``...).

``setup(role)`` is called once per process where its work starts: config.wsgi (web), the Celery
signals in config.celery (worker, beat) and manage.py (run_scheduler). It instruments Django (both
WSGI handlers: the full chain and the node API's), Celery (publish and run: the trace context
travels in the task's headers) and psycopg, and puts a span on each driver call (core.tracing).
Off, nothing is instrumented and the OpenTelemetry SDK is not imported: the cost is a flag test
per driver registry call and per log line.
"""

from __future__ import annotations

import logging
import os
import threading

from core import tracing as hooks
from core.log_context import ENVIRON_KEY

log = logging.getLogger(__name__)

SWITCH = "MERIDIAN_TRACING"
# Probes and scrapes are no one's request: not traced unless OTEL_PYTHON_DJANGO_EXCLUDED_URLS says otherwise.
EXCLUDED_URLS = "health/,metrics"
# The manage.py commands that do work of their own, by the role they trace as.
COMMAND_ROLES = {"run_scheduler": "scheduler"}

_lock = threading.Lock()
_state: dict = {}  # provider, instrumentors and what was added to the node API's chain, while on


def requested() -> bool:
    """Whether the environment asks for tracing (``MERIDIAN_TRACING``), unless the SDK is disabled outright."""
    on = os.environ.get(SWITCH, "").strip().lower() in {"1", "true", "yes", "on"}
    return on and os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() != "true"


def active() -> bool:
    return bool(_state)


def setup(role: str, *, exporter=None) -> bool:
    """
    Trace this process as ``meridian-<role>`` if tracing is asked for (or ``exporter`` is given:
    tests, with an in-memory one and no batching); once per process. Returns whether it traces.
    """
    if exporter is None and not requested():
        return False
    with _lock:
        if _state:
            return True
        from opentelemetry import trace
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        name = os.environ.get("OTEL_SERVICE_NAME") or f"meridian-{role}"
        provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name, "meridian.role": role}),
                                  sampler=_sampler())
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        if exporter is None:
            trace.set_tracer_provider(provider)  # for anything else that asks the global one (once per process)
        _state.update(provider=provider, instrumentors=_instrument(provider))
        hooks.enable(provider.get_tracer("meridian.drivers"))
    log.info("Tracing on as %s.", name)
    return True


def setup_for_command(argv: list[str]) -> bool:
    """``manage.py``: trace the commands that do work (COMMAND_ROLES), not the others."""
    role = COMMAND_ROLES.get(argv[1]) if len(argv) > 1 else None
    return setup(role) if role else False


def shutdown() -> None:
    """Undo ``setup``: instrumentation removed, spans flushed (tests; a process's exit flushes by itself)."""
    with _lock:
        if not _state:
            return
        hooks.disable()
        for instrumentor in reversed(_state["instrumentors"]):
            instrumentor.uninstrument()
        _node_api_chain(add=False)
        _state.pop("provider").shutdown()
        _state.clear()


def _instrument(provider) -> list:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    excluded = None if os.environ.get("OTEL_PYTHON_DJANGO_EXCLUDED_URLS") else EXCLUDED_URLS
    django = DjangoInstrumentor()
    django.instrument(tracer_provider=provider, excluded_urls=excluded, response_hook=_response_hook)
    _node_api_chain(add=True)
    celery = CeleryInstrumentor()
    celery.instrument(tracer_provider=provider)
    psycopg = PsycopgInstrumentor()
    psycopg.instrument(tracer_provider=provider, skip_dep_check=True)
    return [django, celery, psycopg]


def _node_api_chain(*, add: bool) -> None:
    """The node API's handler builds a chain of its own (operations.node_api.handler): the span's goes first."""
    from django.conf import settings
    from opentelemetry.instrumentation.django import DjangoInstrumentor

    path = DjangoInstrumentor._opentelemetry_middleware
    chain = [entry for entry in settings.MERIDIAN_NODE_API_MIDDLEWARE if entry != path]
    settings.MERIDIAN_NODE_API_MIDDLEWARE = [path, *chain] if add else chain


def _response_hook(span, request, response) -> None:
    """The request's id and tenant on its span (known by now: the request-id middleware runs inside this one)."""
    context = request.META.get(ENVIRON_KEY)
    if context is not None and span.is_recording():
        span.set_attribute("meridian.request_id", context.request_id)
        if context.tenant:
            span.set_attribute("meridian.tenant", context.tenant)


def _sampler():
    """
    OTEL_TRACES_SAMPLER's sampler (parent-based, always on, by default), except that a database
    statement with no request, task or driver call around it starts no trace: the scheduler's
    and beat's thousands of reads would each be one.
    """
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
    from opentelemetry.trace import SpanKind, get_current_span

    configured = TracerProvider(shutdown_on_exit=False).sampler

    class NoLoneQueries(Sampler):
        def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None,
                          trace_state=None):
            if kind == SpanKind.CLIENT and not get_current_span(parent_context).get_span_context().is_valid:
                return SamplingResult(Decision.DROP)
            return configured.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

        def get_description(self):
            return f"NoLoneQueries{{{configured.get_description()}}}"

    return NoLoneQueries()
