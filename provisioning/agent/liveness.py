"""
The agent's liveness pings (the control plane's side: operations.node_api.liveness): a tiny
signed ``POST /alive/`` every few seconds on a thread of its own, so that a long command (a scrub,
the acceptance checks) or a slow heartbeat never holds it back, while the full heartbeat keeps its
own, longer period. The control plane says how often in each heartbeat's answer (``liveness_s``;
0 or none: no pings -- an older control plane is never pinged).

Each ping carries this run of the agent (a random id), a sequence rising by one, the time it was
sent, the previous ping's round trip and how many went unanswered since the last answered one:
what lets the control plane tell a node gone quiet from its own load delaying everyone's pings.
The first ping of a run says ``start`` (so does the next after a refusal: the control plane may
have forgotten the run), and an agent going away in order says ``stop``, so its node is judged
by heartbeats while it restarts.

Pings keep a fixed rate (each due one period after the one before, not after its answer) and a
ping that waits longer than a period for its answer is given up: the next one is due. When the
schedule fell behind (a suspended process) the missed slots are skipped, not sent in a burst.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

log = logging.getLogger("meridian.agent")
PATH = "/alive/"
MIN_PERIOD_S, MAX_PERIOD_S = 0.2, 60.0


class Pinger:
    """
    ``tick()`` sends the ping that is due (if any); ``run()`` ticks until stopped, on the caller's
    thread (``start()`` runs it on a daemon thread). ``clock`` (monotonic seconds) and ``wall``
    (Unix seconds) are the clocks; ``paused()`` says the agent is made silent (tests, the demo).
    """

    def __init__(self, control_plane, *, clock=time.monotonic, wall=time.time, paused=lambda: False,
                 run: str | None = None):
        self.control_plane, self.clock, self.wall, self.paused = control_plane, clock, wall, paused
        self.run_id = run or secrets.token_hex(8)
        self.period = 0.0  # off until the control plane says
        self.seq = 0
        self.started = False  # whether the control plane took a ping that began this run
        self.rtt_ms: int | None = None
        self.failed = 0
        self.due_at: float | None = None
        self.wake = threading.Event()  # set when the period changes or the agent stops
        self.lock = threading.Lock()  # the last ping (leave) and the thread's never interleave

    def period_take(self, liveness_s) -> None:
        """The period a heartbeat's (or a ping's) answer says; 0, none or nonsense: no pings."""
        period = float(liveness_s) if isinstance(liveness_s, int | float) and not isinstance(liveness_s, bool) else 0.0
        period = min(max(period, MIN_PERIOD_S), MAX_PERIOD_S) if period > 0 else 0.0
        if period != self.period:
            self.period = period
            self.due_at = self.clock() if period else None  # a new period: ping now, then on it
            self.wake.set()

    def body(self, **extra) -> dict:
        body = {"run": self.run_id, "seq": self.seq, "sent_at": round(self.wall(), 3), "rtt_ms": self.rtt_ms,
                "failed": self.failed}
        if not self.started:
            body["start"] = True
        return {**body, **extra}

    def ping(self, **extra) -> bool:
        """One ping now: True when the control plane counted it."""
        with self.lock:
            self.seq += 1
            body, began = self.body(**extra), self.clock()
            try:
                answer = self.control_plane.call("POST", PATH, body, timeout=max(self.period, 1.0))
            except Exception as exc:  # unanswered (or refused): say so with the next one
                self.failed += 1
                if getattr(exc, "status", None) == 409:  # not counted: begin the run again
                    self.started = False
                log.debug("liveness ping %s: %s", self.seq, exc)
                return False
            self.rtt_ms, self.failed, self.started = int((self.clock() - began) * 1000), 0, True
        if isinstance(answer, dict) and "liveness_s" in answer:
            self.period_take(answer["liveness_s"])
        return True

    def tick(self) -> bool | None:
        """Send the ping that is due: None when none is (or pings are off or paused), else whether it counted."""
        now = self.clock()
        if not self.period or self.due_at is None or now < self.due_at or self.paused():
            return None
        self.due_at += self.period
        if self.due_at <= now:  # fell behind: skip the missed slots rather than send them at once
            self.due_at = now + self.period
        return self.ping()

    def wait_s(self) -> float:
        """How long until the next ping is due (at most a second: a period may be given meanwhile)."""
        if not self.period or self.due_at is None:
            return 1.0
        return min(max(self.due_at - self.clock(), 0.0), 1.0)

    def run(self, stop=lambda: False) -> None:
        while not stop():
            try:
                self.tick()
            except Exception:  # a ping must never end the pings
                log.exception("liveness ping failed")
            self.wake.wait(self.wait_s())
            self.wake.clear()

    def start(self, stop) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="meridian-liveness", daemon=True)
        thread.start()
        return thread

    def leave(self) -> None:
        """The agent goes away in order: a last ping that ends the run (best effort)."""
        if self.period and self.started:
            self.ping(stop=True)
        self.wake.set()
