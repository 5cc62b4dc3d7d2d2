"""
Start messages sent by a thread of their own, after the commit that made reservations due.

A create placed at once, and a scheduler cycle, waited on the broker before going on: with
RabbitMQ's publisher confirms that is a round trip per message, about a quarter of a create
placed at once. The commit is what makes a reservation due; the message only has a worker start
it now rather than at the next lifecycle tick, which starts every scheduled reservation whose
time has come. So each process hands the ids to one sender thread and goes on. Should the
process die before they are sent, or the broker refuse them, the tick starts them.

MERIDIAN_SEND_STARTS_IN_BACKGROUND=0 sends them in the committing thread instead (the test suite
does, where a test reads what was published as soon as its request returns).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

from django.conf import settings

log = logging.getLogger(__name__)


class StartSender:
    """Per process: ids of due reservations in, their start messages out (``publish``), from one thread."""

    def __init__(self, publish: Callable[[list[str]], None]):
        self._publish = publish
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pid: int | None = None
        self._pending = 0  # batches handed over and not yet sent (or given up on)
        self._done = threading.Condition(self._lock)

    def send(self, reservation_ids: list[str]) -> None:
        if not settings.MERIDIAN_SEND_STARTS_IN_BACKGROUND:
            self._publish(reservation_ids)
            return
        self._start()
        with self._lock:
            self._pending += 1
        self._queue.put(list(reservation_ids))

    def wait_idle(self, timeout: float) -> bool:
        """Whether everything handed over was sent (or given up on) within ``timeout`` seconds."""
        with self._done:
            return self._done.wait_for(lambda: self._pending == 0, timeout)

    def _start(self) -> None:
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child (gunicorn, Celery): a thread of its own
                self._queue, self._pending = queue.SimpleQueue(), 0
                threading.Thread(target=self._run, name="meridian-start-sender", daemon=True).start()
                self._pid = os.getpid()

    def _run(self) -> None:
        while True:
            ids, batches = self._queue.get(), 1
            while True:  # what was handed over meanwhile goes in the same messages
                try:
                    ids += self._queue.get_nowait()
                    batches += 1
                except queue.Empty:
                    break
            try:
                self._publish(ids)
            except Exception:  # noqa: BLE001 -- the thread must live on; the tick starts them
                log.warning("Could not send the start of %d reservations; the lifecycle tick starts them.",
                            len(ids), exc_info=True)
            with self._done:
                self._pending -= batches
                self._done.notify_all()
