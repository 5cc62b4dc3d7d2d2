"""
The web server's access log: the node agents' routine calls (heartbeats, command polls) are logged
at debug, so the console's and the API's requests are not buried under them; failures still show.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from gunicorn.config import Config

from config.access_log import AccessLogger
from config.management.commands.up import web_argv


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def access_log():
    """``access_log(level)``: a started AccessLogger at gunicorn's ``--log-level`` and what it writes."""
    made = []

    def make(level: str = "info"):
        config = Config()
        config.set("accesslog", "-")
        config.set("loglevel", level)
        logger = AccessLogger(config)
        lines = Lines()
        logger.access_log.addHandler(lines)
        made.append((logger, lines))
        return logger, lines

    yield make
    for logger, lines in made:
        logger.access_log.removeHandler(lines)


def request(logger, path: str, status: int = 200) -> None:
    """What gunicorn's worker calls after answering ``POST path`` with ``status``."""
    environ = {"REQUEST_METHOD": "POST", "RAW_URI": path, "PATH_INFO": path, "SERVER_PROTOCOL": "HTTP/1.1",
               "REMOTE_ADDR": "127.0.0.1"}
    response = SimpleNamespace(status=f"{status} X", status_code=status, sent=12, headers=[])
    logger.access(response, SimpleNamespace(headers=[]), environ, timedelta(milliseconds=3))


def test_a_heartbeat_that_succeeded_is_not_an_info_line(access_log):
    logger, lines = access_log()
    request(logger, "/api/agent/v1/heartbeat/")
    request(logger, "/api/agent/v1/commands/")
    request(logger, "/reservations/new/")
    request(logger, "/api/v1/reservations/")
    assert [r.getMessage().split('"')[1] for r in lines.records] == [
        "POST /reservations/new/ HTTP/1.1", "POST /api/v1/reservations/ HTTP/1.1"]
    assert {r.levelno for r in lines.records} == {logging.INFO}


def test_a_node_api_request_that_failed_is_still_logged(access_log):
    logger, lines = access_log()
    request(logger, "/api/agent/v1/heartbeat/", status=401)
    request(logger, "/api/agent/v1/telemetry/", status=500)
    assert [(r.levelno, r.getMessage().split('"')[2].split()[0]) for r in lines.records] == [
        (logging.INFO, "401"), (logging.INFO, "500")]


def test_at_debug_level_the_node_api_is_logged_too(access_log):
    logger, lines = access_log("debug")
    request(logger, "/api/agent/v1/heartbeat/")
    request(logger, "/reservations/")
    assert [(r.levelno, r.getMessage().split('"')[1]) for r in lines.records] == [
        (logging.DEBUG, "POST /api/agent/v1/heartbeat/ HTTP/1.1"), (logging.INFO, "POST /reservations/ HTTP/1.1")]


def test_the_run_command_starts_gunicorn_with_this_access_log(monkeypatch):
    monkeypatch.delenv("MERIDIAN_LOG_LEVEL", raising=False)
    argv = web_argv(Path("/venv/bin"), "127.0.0.1", 8000, 2)
    assert argv[argv.index("--logger-class") + 1] == "config.access_log.AccessLogger"
    assert argv[argv.index("--log-level") + 1] == "info" and "--access-logfile" in argv
    monkeypatch.setenv("MERIDIAN_LOG_LEVEL", "DEBUG")
    argv = web_argv(Path("/venv/bin"), "127.0.0.1", 8000, 2)
    assert argv[argv.index("--log-level") + 1] == "debug"
