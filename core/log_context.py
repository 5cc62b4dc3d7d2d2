"""
What every log line says of where it came from: the request (or the task, and the request that
queued it) and the tenant it acts for, in a context variable the request-id middleware and the
Celery signals (config.celery) set, and ``ContextFilter`` copies onto each record.

The context is one mutable object per request: the tenant becomes known inside the view (DRF
authenticates lazily), after the middleware set it, and the WSGI environ holds the same object
(``ENVIRON_KEY``) so the access log, written after the request, can say whose it was.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from core import tracing

ENVIRON_KEY = "meridian.log_context"
# Message headers that carry a request's id and tenant to the tasks it queues.
REQUEST_ID_HEADER = "meridian_request_id"
TENANT_HEADER = "meridian_tenant"


@dataclass(slots=True)
class LogContext:
    request_id: str | None = None
    tenant: str | None = None
    task_name: str | None = None
    task_id: str | None = None


_context: contextvars.ContextVar[LogContext | None] = contextvars.ContextVar("meridian_log_context", default=None)


def current() -> LogContext | None:
    """The context of the request or task being served, None outside both (commands, the scheduler)."""
    return _context.get()


def enter(context: LogContext) -> contextvars.Token:
    """Make ``context`` the current one until ``leave(token)``."""
    return _context.set(context)


def leave(token: contextvars.Token) -> None:
    try:
        _context.reset(token)
    except ValueError:  # a token of another context (a signal sent from another thread): start clean
        _context.set(None)


@contextmanager
def bound(context: LogContext) -> Iterator[LogContext]:
    token = enter(context)
    try:
        yield context
    finally:
        leave(token)


def set_tenant(tenant) -> None:
    """The tenant the current request acts for (its slug), once authentication knows it."""
    context = _context.get()
    if context is None or tenant is None:
        return
    context.tenant = getattr(tenant, "slug", None) or str(getattr(tenant, "pk", tenant))
    tracing.annotate(tenant=context.tenant)


def publish_headers() -> dict[str, str]:
    """What a task queued now carries of the current request: its id and tenant (none outside a request)."""
    context = _context.get()
    if context is None or context.request_id is None:
        return {}
    headers = {REQUEST_ID_HEADER: context.request_id}
    if context.tenant:
        headers[TENANT_HEADER] = context.tenant
    return headers


class ContextFilter(logging.Filter):
    """
    Puts ``request_id``, ``tenant``, ``task_name`` and ``task_id`` on every record (None when
    unknown), and ``trace_id`` and ``span_id`` while tracing is on and a span is current.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if "request_id" in record.__dict__:  # stamped already (the access log's lines, a second handler)
            return True
        context = _context.get()
        if context is None:  # Django logs a 4xx after the middleware returned: the request still knows
            meta = getattr(record.__dict__.get("request"), "META", None)
            context = meta.get(ENVIRON_KEY) if isinstance(meta, dict) else None
        if context is None:
            record.request_id = record.tenant = record.task_name = record.task_id = None
        else:
            record.request_id, record.tenant = context.request_id, context.tenant
            record.task_name, record.task_id = context.task_name, context.task_id
        if tracing.enabled():
            record.trace_id, record.span_id = tracing.current_ids()
        return True
