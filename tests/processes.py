"""
Meridian's own processes started by a test, the way a deployment starts them: each against the
test database (and a RabbitMQ queue of the test's own, where it needs one), in a process group of
its own so a test can SIGKILL it whole, its output read line by line with the time each arrived.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from django.db import connection
from kombu import Connection

REPO = Path(__file__).resolve().parent.parent
BROKER = os.environ.get("MERIDIAN_TEST_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")


def database_url_of_tests() -> str:
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    lines: list[tuple[float, str]] = field(default_factory=list)

    def _pump(self) -> None:
        for line in self.popen.stdout:
            self.lines.append((time.monotonic(), line.rstrip()))

    def said(self, text: str) -> float | None:
        """When the process first printed a line containing ``text`` (monotonic), or None."""
        return next((at for at, line in list(self.lines) if text in line), None)

    def wait_for(self, text: str, *, timeout: float, after: float = 0.0) -> float:
        deadline = time.monotonic() + timeout
        while True:
            at = next((at for at, line in list(self.lines) if text in line and at >= after), None)
            if at is not None:
                return at
            assert self.popen.poll() is None or at is not None, f"{self.name} exited:\n{self.output()}"
            assert time.monotonic() < deadline, f"{self.name} did not say {text!r} in {timeout} s:\n{self.output()}"
            time.sleep(0.05)

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines[-60:])

    def kill(self) -> float:
        """SIGKILL the whole process group, as a machine that lost power would; returns when."""
        at = time.monotonic()
        os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)
        return at

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)


@contextmanager
def processes(**settings: str):
    """Yields ``start(name, *argv)``; every process started is stopped afterwards, its queue deleted."""
    queue = f"meridian-test-{uuid.uuid4().hex[:12]}"
    env = {**os.environ, "DATABASE_URL": database_url_of_tests(), "CELERY_BROKER_URL": BROKER,
           "MERIDIAN_CELERY_QUEUE": queue, "MERIDIAN_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1", **settings}
    started: list[Process] = []

    def start(name: str, *argv: str) -> Process:
        popen = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)
        process = Process(name, popen)
        threading.Thread(target=process._pump, daemon=True).start()
        started.append(process)
        return process

    start.queue = queue
    try:
        yield start
    finally:
        for process in started:
            process.stop()
        with Connection(BROKER) as conn:
            conn.default_channel.queue_delete(queue)


class SentTasks:
    """Reads ``queue`` as the test goes (some tasks' messages expire within seconds), by task name."""

    def __init__(self, queue: str):
        self.queue, self.names, self._stop = queue, [], threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        with Connection(BROKER) as conn:
            channel = conn.default_channel
            while not self._stop.is_set():
                try:
                    message = channel.basic_get(self.queue, no_ack=True)
                except conn.channel_errors:  # not declared until beat's first send
                    channel = conn.channel()
                    message = None
                if message is None:
                    time.sleep(0.1)
                else:
                    self.names.append(message.headers.get("task") or json.loads(message.body)[0])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        time.sleep(0.5)
        self._stop.set()
        self._thread.join(timeout=10)
