"""
Liveness pings (``POST /api/agent/v1/alive/``): the least an agent can say, sent every
MERIDIAN_LIVENESS_SECONDS on a thread of its own, so a dead node is found within a few seconds
while the full heartbeat -- inventory, telemetry, the desired state -- keeps its period and its cost.

A ping costs the key check every agent request makes (one read) and one statement: an UPDATE of
the node's AgentState, committed without waiting for the WAL flush as the heartbeat's liveness
is. Its nonce is not stored -- that would be a second write, and a table growing at the fleet's
ping rate -- so a ping counts only when its sequence is above the last one counted of the same
agent run: a copy, or a ping overtaken by a later one, changes nothing. An agent run is begun by
a ping that says ``start`` and ended by one that says ``stop`` (the agent going away in order:
its node is judged by its heartbeats until the next run begins); those two spend their nonce in
the same statement, as every other agent request does, so a copy of either is refused.

Besides when it came (``alive_at``, our clock), a ping carries when it was sent (the node's
clock), the previous ping's round trip and how many of the agent's pings went unanswered since:
what the watchdog needs to tell a node gone quiet from a control plane too busy to hear it
(operations.silence).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from core.db import fast_cursor
from core.errors import DomainError
from operations.node_api.agents import Replayed
from provisioning.agent.signing import MAX_SKEW_S
from provisioning.models import AgentNonce, AgentState


class PingRefused(DomainError):
    status_code = 409
    default_code = "ping_refused"
    default_detail = (
        "This ping does not count: its sequence is not above the last one of its run (a copy, or overtaken), "
        "or no run was begun -- send a ping with start (after the agent's first heartbeat)."
    )


@dataclass(frozen=True)
class Ping:
    run: str  # the agent run (a random id per start of the agent)
    seq: int  # rises by one with every ping of the run
    sent_at: datetime  # the node's clock
    rtt_ms: int | None = None  # how long the previous ping waited for its answer
    failed: int = 0  # the agent's pings that went unanswered since the last answered one
    start: bool = False  # begins the run
    stop: bool = False  # ends it: the agent goes away in order


_RUN = re.compile(r"[A-Za-z0-9_-]{1,32}")
MAX_SEQ = 2**62


def _whole(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def ping_parse(payload: dict, *, now: datetime | None = None) -> Ping:
    """The ping in ``payload``; KeyError for a missing field, ValueError for one of the wrong shape (both 400)."""
    now = now or timezone.now()
    run, seq, sent = payload["run"], payload["seq"], payload["sent_at"]
    if not isinstance(run, str) or not _RUN.fullmatch(run):
        raise ValueError("run must be 1 to 32 letters, digits, - or _")
    if not _whole(seq, 1, MAX_SEQ):
        raise ValueError(f"seq must be a whole number from 1 to {MAX_SEQ}")
    if not isinstance(sent, int | float) or isinstance(sent, bool) or not math.isfinite(sent) \
            or abs(sent - now.timestamp()) > MAX_SKEW_S + 1:
        raise ValueError(f"sent_at must be the node's Unix time in seconds, within {MAX_SKEW_S} s of ours")
    rtt, failed = payload.get("rtt_ms"), payload.get("failed", 0)
    if rtt is not None and not _whole(rtt, 0, 3_600_000):
        raise ValueError("rtt_ms must be a whole number of milliseconds up to an hour, or null")
    if not _whole(failed, 0, 1_000_000):
        raise ValueError("failed must be a whole number from 0 to 1000000")
    start, stop = payload.get("start", False), payload.get("stop", False)
    if not isinstance(start, bool) or not isinstance(stop, bool) or (start and stop):
        raise ValueError("start and stop are true or false, and not both true")
    return Ping(run=run, seq=seq, sent_at=datetime.fromtimestamp(sent, tz=UTC), rtt_ms=rtt, failed=failed,
                start=start, stop=stop)


def alive(*, node, ping: Ping, nonce: str = "", now: datetime | None = None) -> None:
    """
    Count ``ping`` of ``node``'s agent: one statement (on the key check). PingRefused (409) when
    it does not count -- nothing is stored then; Replayed (409) for a copy of a start or a stop.
    """
    now = now or timezone.now()
    if connection.vendor != "postgresql":
        _alive_orm(node, ping, nonce, now)
        return
    kind = "stop" if ping.stop else "start" if ping.start else "ping"
    params = {"node": node.pk, "run": ping.run, "seq": ping.seq, "at": now, "sent": ping.sent_at,
              "rtt": ping.rtt_ms, "failed": ping.failed, "nonce": nonce}
    with fast_cursor() as cursor:
        cursor.execute(_SQL[kind, connection.in_atomic_block], params)
        row = cursor.fetchone()
    spent, counted = (row[-2], row[-1]) if kind != "ping" else (True, row[-1])
    if not spent:
        raise Replayed()
    if not counted:
        raise PingRefused()


_STATE = AgentState._meta.db_table
_SET = ("alive_at = %(at)s, ping_seq = %(seq)s, ping_sent_at = %(sent)s, ping_rtt_ms = %(rtt)s, "
        "ping_failed = %(failed)s")
_WHERE = {  # which row a ping of each kind counts on
    "ping": "node_id = %(node)s AND ping_run = %(run)s AND ping_seq < %(seq)s",
    "start": "node_id = %(node)s",
    "stop": "node_id = %(node)s AND ping_run = %(run)s",
}
_RUN_SET = {"ping": "", "start": "ping_run = %(run)s, ", "stop": "ping_run = '', "}
_SPENT = (f"spent AS (INSERT INTO {AgentNonce._meta.db_table} (node_id, nonce, seen_at) "  # noqa: S608
          "VALUES (%(node)s, %(nonce)s, %(at)s) ON CONFLICT (node_id, nonce) DO NOTHING RETURNING 1), ")


def _statement(kind: str, in_atomic: bool) -> str:
    """
    One statement per kind: the UPDATE (after spending the nonce, for a start or a stop), committed
    without waiting for the WAL flush when it is its own transaction (a caller's is left alone).
    """
    spent = kind != "ping"
    guard = " AND EXISTS (SELECT FROM spent)" if spent else ""
    update = (f"alive AS (UPDATE {_STATE} SET {_RUN_SET[kind]}{_SET} "  # noqa: S608 -- our own names
              f"WHERE {_WHERE[kind]}{guard} RETURNING 1)")
    results = ["EXISTS (SELECT FROM spent)"] if spent else []
    results.append("EXISTS (SELECT FROM alive)")
    if not in_atomic:
        results.insert(0, "set_config('synchronous_commit', 'off', true)")
    return f"WITH {_SPENT if spent else ''}{update} SELECT {', '.join(results)}"


_SQL = {(kind, in_atomic): _statement(kind, in_atomic) for kind in _WHERE for in_atomic in (True, False)}


def _alive_orm(node, ping: Ping, nonce: str, now: datetime) -> None:
    """``alive`` elsewhere than on PostgreSQL (the embedded SQLite): the same rules through the ORM."""
    fields = {"alive_at": now, "ping_seq": ping.seq, "ping_sent_at": ping.sent_at, "ping_rtt_ms": ping.rtt_ms,
              "ping_failed": ping.failed}
    rows = AgentState.objects.filter(node_id=node.pk)
    if ping.start or ping.stop:
        try:
            with transaction.atomic():
                AgentNonce.objects.create(node_id=node.pk, nonce=nonce, seen_at=now)
        except IntegrityError:
            raise Replayed() from None
        if ping.stop:
            rows, fields = rows.filter(ping_run=ping.run), {**fields, "ping_run": ""}
        else:
            fields["ping_run"] = ping.run
    else:
        rows = rows.filter(ping_run=ping.run, ping_seq__lt=ping.seq)
    if not rows.update(**fields):
        raise PingRefused()
