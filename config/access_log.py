"""
gunicorn's access log, without the node agents' routine calls.

Every node agent posts a heartbeat every few seconds and polls for commands: in a short embedded
run they were 13,000 of 25,000 log lines, and the console's and the API's requests drowned in
them. A node-API request that succeeded is logged at DEBUG (shown with ``--log-level debug``,
which ``manage.py up`` passes when MERIDIAN_LOG_LEVEL=DEBUG); one that failed (4xx, 5xx) stays
at INFO with every other request, because an agent that cannot reach the control plane is news.
The agents' health is watched by the missed-heartbeat detector and /metrics, not by this log.

Used as ``gunicorn --logger-class config.access_log.AccessLogger``.
"""

from __future__ import annotations

import logging

from gunicorn.glogging import Logger

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

    def access(self, resp, req, environ, request_time):
        if not environ.get("PATH_INFO", "").startswith(NODE_API_PREFIX) or _status_code(resp) >= 400:
            super().access(resp, req, environ, request_time)
            return
        if not self.access_log_enabled or not self.access_log.isEnabledFor(logging.DEBUG):
            return
        atoms = self.atoms_wrapper_class(self.atoms(resp, req, environ, request_time))
        try:
            self.access_log.debug(self.cfg.access_log_format, atoms)
        except Exception:  # as gunicorn's own access(): a log line never fails the request
            self.exception("The access log line could not be written.")
