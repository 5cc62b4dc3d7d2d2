"""
Log lines as JSON, one object a line (``MERIDIAN_LOG_FORMAT=json``; docs/observability.md):

    {"timestamp": "2026-03-02T09:14:07.412Z", "level": "INFO", "logger": "storage.steps",
     "message": "...", "request_id": "4f0c...", "tenant": "acme", "task_name": "storage.volume_converge",
     "task_id": "5b1e...", "trace_id": "...", "span_id": "..."}

``timestamp`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, ``request_id`` and ``tenant``
are on every line (null outside a request); ``task_name`` and ``task_id`` in a Celery task (its
``request_id`` is the request that queued it); ``trace_id`` and ``span_id`` while tracing is on; an
exception as ``exception`` {type, message, traceback}; whatever a call passes in ``extra`` too.
The fields come from ``core.log_context.ContextFilter``, which the handlers carry.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

from django.core.exceptions import ImproperlyConfigured
from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as BaseJsonFormatter

FORMAT_VARIABLE = "MERIDIAN_LOG_FORMAT"
FORMATS = ("plain", "json")
# Put on a line only when they have a value.
WHEN_KNOWN = ("task_name", "task_id", "trace_id", "span_id")
# Record attributes that are no field of a line: logging's own (RESERVED_ATTRS; ``exception`` holds
# the exception), Django's request object (django.request's lines), Python 3.12's ``taskName``.
LEFT_OUT = [*RESERVED_ATTRS, "request", "taskName"]


def log_format() -> str:
    """``plain`` or ``json``, as the environment says (read where settings may not be loaded: gunicorn, Celery)."""
    chosen = os.environ.get(FORMAT_VARIABLE, "plain").strip().lower() or "plain"
    if chosen not in FORMATS:
        raise ImproperlyConfigured(f"{FORMAT_VARIABLE} is '{chosen}': set plain or json.")
    return chosen


def json_logs() -> bool:
    return log_format() == "json"


def logging_settings(log_format: str, *, level: str) -> dict:
    """Django's LOGGING: every line to standard error through one handler, in ``log_format``, with its context."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": "core.log_context.ContextFilter"}},
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
                       "json": {"()": "config.logging_json.JsonFormatter"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": log_format, "filters": ["context"]}},
        "root": {"handlers": ["console"], "level": level},
        "loggers": {"django.db.backends": {"level": "WARNING"}},
    }


class JsonFormatter(BaseJsonFormatter):
    def __init__(self, **kwargs):
        kwargs.setdefault("reserved_attrs", LEFT_OUT)
        super().__init__(
            "%(levelname)s %(name)s %(message)s %(request_id)s %(tenant)s",
            rename_fields={"levelname": "level", "name": "logger"},
            **kwargs,
        )

    def add_fields(self, log_data: dict, record, message_dict: dict) -> None:
        log_data["timestamp"] = (datetime.fromtimestamp(record.created, tz=UTC)
                                 .isoformat(timespec="milliseconds").replace("+00:00", "Z"))
        text = message_dict.pop("exc_info", None)
        super().add_fields(log_data, record, message_dict)
        for name in WHEN_KNOWN:
            if log_data.get(name) is None:
                log_data.pop(name, None)
        if record.exc_info and record.exc_info[0] is not None:
            kind, error = record.exc_info[0], record.exc_info[1]
            name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
            log_data["exception"] = {"type": name, "message": str(error), "traceback": text}
        elif text:
            log_data["exception"] = {"type": None, "message": None, "traceback": text}
