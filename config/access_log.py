"""
gunicorn's access log, without the node agents' routine calls.

Every node agent posts a heartbeat every few seconds and polls for commands: in a short embedded
run they were 13,000 of 25,000 log lines, and the console's and the API's requests drowned in
them. A node-API request that succeeded is logged at DEBUG (shown with ``--log-level debug``,
which ``manage.py up`` passes when MERIDIAN_LOG_LEVEL=DEBUG); one that failed (4xx, 5xx) stays
at INFO with every other request, because an agent that cannot reach the control plane is news.
The agents' health is watched by the missed-heartbeat detector and /metrics, not by this log.

With MERIDIAN_LOG_FORMAT=json gunicorn's own lines are JSON too (config.logging_json), and an
access line carries the request's fields: its id and tenant (the request's log context, left in
the WSGI environ by the request-id middleware), method, path, status, bytes sent, duration.

Used as ``gunicorn --logger-class config.access_log.AccessLogger``.
"""

from __future__ import annotations

import logging

from gunicorn.glogging import Logger

from config.logging_json import JsonFormatter, json_logs
from core.log_context import ENVIRON_KEY, ContextFilter
from operations.node_api.handler import NODE_API_PREFIX


def _status_code(resp) -> int:
    status = getattr(resp, "status_code", None)
    if status is None:
        status = str(getattr(resp, "status", "0")).split(None, 1)[0]
    try:
        return int(status)
    except ValueError:
        return 0


class AccessLogger(Logger):
    """gunicorn's Logger with the node API's successful requests at DEBUG."""

    def setup(self, cfg):
        super().setup(cfg)
        # gunicorn pins the access log at INFO; at --log-level debug it shows the node API too.
        if self.loglevel <= logging.DEBUG:
            self.access_log.setLevel(logging.DEBUG)
        self.json_lines = json_logs()
        if self.json_lines:
            for handler in (*self.error_log.handlers, *self.access_log.handlers):
                if getattr(handler, "_gunicorn", False):
                    handler.setFormatter(JsonFormatter())
                    handler.addFilter(ContextFilter())

    def access(self, resp, req, environ, request_time):
        status = _status_code(resp)
        level = logging.INFO if not environ.get("PATH_INFO", "").startswith(NODE_API_PREFIX) or status >= 400 \
            else logging.DEBUG
        if not self.access_log_enabled or not self.access_log.isEnabledFor(level):
            return
        atoms = self.atoms_wrapper_class(self.atoms(resp, req, environ, request_time))
        try:
            extra = _fields(resp, environ, request_time, status) if getattr(self, "json_lines", False) else None
            self.access_log.log(level, self.cfg.access_log_format, atoms, extra=extra)
        except Exception:  # as gunicorn's own access(): a log line never fails the request
            self.exception("The access log line could not be written.")


def _fields(resp, environ, request_time, status: int) -> dict:
    """An access line's own fields (JSON lines): whose request it was, and what it did."""
    context = environ.get(ENVIRON_KEY)
    request_id = getattr(context, "request_id", None)
    if request_id is None:  # a request that never reached the middleware: the id it answered with, if any
        request_id = dict((k.lower(), v) for k, v in getattr(resp, "headers", ())).get("x-request-id")
    return {
        "request_id": request_id,
        "tenant": getattr(context, "tenant", None),
        "method": environ.get("REQUEST_METHOD"),
        "path": environ.get("PATH_INFO"),
        "status": status,
        "bytes": getattr(resp, "sent", None),
        "duration_ms": round(request_time.total_seconds() * 1000, 3),
        "remote_addr": environ.get("REMOTE_ADDR"),
    }
