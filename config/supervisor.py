"""
A small process supervisor for the embedded run: starts every component as a child, prefixes
its output with its name, and on Ctrl-C (SIGINT) or SIGTERM stops them all -- each child runs in
its own process group, so pool processes (gunicorn and Celery workers) are stopped with it.
If one component dies, the others are stopped too and the supervisor exits non-zero.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Stop(Exception):
    """Raised by the signal handler, wherever the supervisor is: starting, waiting or seeding."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Supervisor:
    def __init__(self, children: list[Child], *, env: dict[str, str], out=None, grace_seconds: float = 20.0):
        self.children = children
        self.env = env
        self.out = out or sys.stdout
        self.grace_seconds = grace_seconds
        self._lock = threading.Lock()
        self._width = max(len(c.name) for c in children)

    def __enter__(self) -> Supervisor:
        """From here on, Ctrl-C, SIGTERM and SIGHUP stop the children, whatever is under way."""

        def handler(signum, frame):
            raise Stop

        self._previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc_info) -> bool:
        try:
            self.stop()
        finally:
            for sig, old in self._previous.items():
                signal.signal(sig, old)
        return exc_info[0] is Stop  # a stop signal is a clean exit, not an error

    def say(self, name: str, line: str) -> None:
        with self._lock:
            self.out.write(f"{name.ljust(self._width)} | {line.rstrip()}\n")
            self.out.flush()

    def start(self) -> None:
        for child in self.children:
            child.process = subprocess.Popen(
                child.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True,
            )
            threading.Thread(target=self._pump, args=(child,), daemon=True).start()
            self.say(child.name, f"started (pid {child.process.pid})")

    def _pump(self, child: Child) -> None:
        for line in child.process.stdout:
            self.say(child.name, line)

    def wait(self) -> int:
        """Block until a child dies on its own (returns 1); a stop signal raises Stop instead."""
        while True:
            for child in self.children:
                if not child.alive:
                    self.say(child.name, f"exited with code {child.process.returncode}; stopping the rest")
                    return 1
            time.sleep(0.5)

    def stop(self) -> None:
        """
        SIGTERM each child's main process (gunicorn and Celery then shut their pools down warmly,
        letting running tasks finish), wait for the grace period, then SIGKILL each whole process
        group so nothing is left behind.
        """
        for sig in STOP_SIGNALS:  # a second Ctrl-C must not cut the shutdown short
            signal.signal(sig, signal.SIG_IGN)
        for child in self.children:
            if child.alive:
                self.say(child.name, "stopping")
                child.process.terminate()
        deadline = time.monotonic() + self.grace_seconds
        for child in self.children:
            if child.process is None:
                continue
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(child.name, "did not stop in time; killing")
            # Kill the whole group even after a clean exit: orphaned pool processes stay in it.
            _signal_group(child, signal.SIGKILL)
            child.process.wait()
            self.say(child.name, f"stopped (code {child.process.returncode})")


def _signal_group(child: Child, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.process.pid, sig)
