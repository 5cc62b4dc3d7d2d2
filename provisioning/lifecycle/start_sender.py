"""
Start messages sent off the committing request's path.

After the commit that placed reservations due now, their ids go to one sender thread per
process, which publishes them (``provisioning.lifecycle``): a create's answer no longer waits
on the broker -- a publish with confirms is about a millisecond of every request. The thread
lingers a moment for more before it publishes (as Kafka's producer does, linger.ms): starts
made within it leave together, a few per message, and a stream of creates pays for a fraction
of the messages (publishing costs the process time even off the request's path; a start that
waits 50 ms more is nothing beside the minutes of provisioning it begins). Sending stays best
effort, as it was on the request's path: a broker that refuses them, or a process that ends
before they left (it waits a moment for them when it exits), costs a few seconds, because the
lifecycle tick starts every scheduled reservation whose time has come.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)
EXIT_WAIT_S = 2.0


class StartSender:
    """
    Hands the ids given to ``send`` to ``publish`` on a thread of its own, in order: those that
    came within ``linger_s`` of the first (``batch`` at most, then at once), or while it was
    busy, together.
    """

    def __init__(self, publish: Callable[[list[str]], None], *, linger_s: float = 0.0, batch: int = 1):
        self._publish, self.linger_s, self.batch = publish, linger_s, batch
        self._reset()
        # A forked child (a gunicorn or Celery worker) gets a copy of the state, not the thread:
        # it starts its own, with nothing of the parent's waiting (the parent sends that).
        os.register_at_fork(after_in_child=self._reset)
        atexit.register(self.flush, EXIT_WAIT_S)

    def _reset(self) -> None:
        self._ready = threading.Condition()
        self._waiting: list[str] = []
        self._busy = False
        self._thread: threading.Thread | None = None

    def send(self, reservation_ids: list[str]) -> None:
        with self._ready:
            if self._thread is None or not self._thread.is_alive():
                thread = threading.Thread(target=self._run, name="start-sender", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # no thread to be had (interpreter shutdown, a thread limit)
                    thread = None
                self._thread = thread
            if self._thread is not None:
                self._waiting.extend(reservation_ids)
                self._ready.notify_all()
                return
        # Sent here, as before the sender: a commit's callback must not fail for want of a thread.
        self._publish_guarded(list(reservation_ids))

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything handed over was published (or refused); False if ``timeout`` ran out first."""
        with self._ready:
            return self._ready.wait_for(lambda: not self._waiting and not self._busy, timeout)

    def _run(self) -> None:
        ready = self._ready
        while True:
            with ready:
                ready.wait_for(lambda: self._waiting)
                if self.linger_s > 0:
                    ready.wait_for(lambda: len(self._waiting) >= self.batch, self.linger_s)
                batch, self._waiting, self._busy = self._waiting, [], True
            try:
                self._publish_guarded(batch)
            finally:
                with ready:
                    self._busy = False
                    ready.notify_all()

    def _publish_guarded(self, batch: list[str]) -> None:
        try:
            self._publish(batch)
        except Exception:  # the sender must live on; ``publish`` reports its own failures
            log.exception("Sending the start of %d reservations failed; the lifecycle tick starts them.", len(batch))
