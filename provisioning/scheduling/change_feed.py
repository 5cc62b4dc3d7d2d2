"""
What changed since the scheduler loop last looked: the capacity change feed, read in one statement.

The feed (``provisioning.feed_models.CapacityChange``) is written by triggers in the transactions
that change allocations, a node's or GPU's right to take work, or the fleet's hardware. A reader
asks, inside its REPEATABLE READ snapshot, for every row written by a transaction its previous
snapshot could not see (``pg_visible_in_snapshot``; from that snapshot's xmin on, through the xid
index): a transaction still running then cannot be missed, whatever order transactions commit
in. Only rows of the reader's own transaction come again (tests run in one); it skips those it
has read. The same statement names the nodes whose allocations ended since the last read, which
no transaction writes.

The loop deletes rows older than ``RETAIN_S`` it has read; a reader that has not read for
``STALE_S`` (less than that) builds its index afresh instead of trusting the feed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from django.db import connection

from provisioning.feed_models import CapacityChange
from provisioning.models import Allocation

RETAIN_S = 60.0  # rows read this long ago are deleted
STALE_S = 45.0  # a reader silent this long may have lost rows to another reader's pruning
PRUNE_EVERY_S = 15.0
ENDED = -1  # the statement's marker for "allocations ended on their own"


@dataclass
class Changes:
    allocations: set[UUID] = field(default_factory=set)  # nodes whose allocations changed or ended
    rights: set[UUID] = field(default_factory=set)  # nodes whose (or whose GPUs') right to take work changed
    shape: bool = False  # hardware added, removed or recabled
    stale: bool = False  # the feed cannot say (first read, or too long since the last)


class ChangeFeed:
    """One reader's place in the feed (the scheduler loop's leader has one)."""

    def __init__(self):
        self.xmin: int | None = None
        self.snapshot: str | None = None  # the last read's snapshot, as pg_current_snapshot() writes it
        self.read_at = float("-inf")  # monotonic time of the last read
        self.last_now: datetime | None = None
        self._marks: list[tuple[float, int]] = []  # (when, xmin) of reads, for pruning
        self._seen: set[int] = set()  # rows read whose transactions the next read may still return
        self._pruned_at = time.monotonic()

    def read(self, now: datetime, skip: set[int] = frozenset()) -> Changes:
        """
        The changes since the last read (inside the caller's snapshot); ``now`` bounds the ended
        allocations; rows of the transactions ``skip`` are passed over (the reader's own writes).
        """
        ended_after = self.last_now or now
        stale = self.snapshot is None or time.monotonic() - self.read_at > STALE_S
        # A stale reader builds afresh: it reads only the rows it would otherwise see again, to skip them.
        rows = _read(None if stale else self.snapshot, ended_after, now)
        changes = Changes(stale=stale)
        self.snapshot = next(node_id for row_id, xid, kind, node_id in rows if kind is None)
        self.xmin = int(self.snapshot.split(":")[0])
        seen = set()
        for row_id, xid, kind, node_id in rows:
            if kind is None:
                continue
            if row_id is not None:
                if xid >= self.xmin:
                    seen.add(row_id)
                if row_id in self._seen or xid in skip:
                    continue
            if kind in (CapacityChange.ALLOCATIONS, ENDED):
                changes.allocations.add(_uuid(node_id))
            elif kind == CapacityChange.RIGHTS:
                changes.rights.add(_uuid(node_id))
            elif kind == CapacityChange.SHAPE:
                changes.shape = True
        self._seen, self.read_at, self.last_now = seen, time.monotonic(), now
        self._marks.append((self.read_at, self.xmin))
        return changes

    @staticmethod
    def transaction_id() -> int | None:
        """The id of the transaction the caller is in (its feed rows' ``xid``); None off PostgreSQL."""
        if connection.vendor != "postgresql":
            return None
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_xact_id()::text::bigint")
            return cursor.fetchone()[0]

    def prune(self) -> int:
        """Delete what this reader read over ``RETAIN_S`` ago, every ``PRUNE_EVERY_S``; the rows deleted."""
        at = time.monotonic()
        if at - self._pruned_at < PRUNE_EVERY_S:
            return 0
        self._pruned_at = at
        old = [xmin for when, xmin in self._marks if at - when >= RETAIN_S]
        self._marks = [(when, xmin) for when, xmin in self._marks if at - when < RETAIN_S]
        if not old:
            return 0
        return CapacityChange.objects.filter(xid__lt=max(old)).delete()[0]


def _uuid(value) -> UUID:
    return value if isinstance(value, UUID) else UUID(value)


def _read(since: str | None, ended_after: datetime, now: datetime) -> list[tuple]:
    """
    This snapshot (the row without a kind), the feed's rows that the snapshot ``since`` could not
    see (without one: those of this snapshot's transactions still running) and the reader's own
transaction's (a snapshot counts its own transaction as seen), the ended work.
    """
    feed, allocations = CapacityChange._meta.db_table, Allocation._meta.db_table
    # Only the models' table names and constants are formatted in; the rest are parameters.
    sql = (f"WITH s AS (SELECT COALESCE(%s::pg_snapshot, pg_current_snapshot()) AS since) "  # noqa: S608
           f"SELECT NULL::bigint, NULL::bigint, NULL::int, pg_current_snapshot()::text "
           f"UNION ALL SELECT id, xid, kind::int, node_id::text FROM {feed}, s "
           f"WHERE xid >= pg_snapshot_xmin(s.since)::text::bigint "
           f"AND (NOT pg_visible_in_snapshot(xid::text::xid8, s.since) "
           f"OR xid = pg_current_xact_id_if_assigned()::text::bigint) "
           f"UNION ALL SELECT DISTINCT NULL::bigint, NULL::bigint, {ENDED}, node_id::text FROM {allocations} "
           f"WHERE ends_at > %s AND ends_at <= %s AND NOT archived")
    params = [since, ended_after, now]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
