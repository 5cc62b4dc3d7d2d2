"""
The scheduler loop's planning index, kept between cycles and brought up to date from what changed.

Building the planner's index (``planner.state.Capacity``) from a fresh snapshot every cycle read
every allocation of the window and made an object for each of the fleet's GPUs: at 90 % full on
10,240 GPUs, a third of a cycle. A cycle changes a few hundred nodes at most, so the loop keeps
the index and, each cycle, reads the capacity change feed (``change_feed``: rows the database's
triggers write in the same transactions as the changes) -- the nodes whose allocations were
placed, released, evicted, extended or ended on their own, whose right to take work changed, and
whether hardware came or went -- in one statement; only those nodes are read again. What the
last plan wrote into the index is read again too (``Capacity.touched``): the database, not the
plan, says what committed -- unless the loop says a placement committed exactly as planned, in a
transaction whose own feed rows are then skipped (``applied``).

A node that stops taking work (a spare, out of service, being cleaned or attested: see
``fleet_shape.blocked_now``) leaves the index; one that starts again comes back with its
allocations; a node whose GPU stops or starts taking work comes back with the GPUs that may.
The index is built again from a snapshot when the fleet's shape changed, when many nodes changed
at once, when the feed cannot vouch for the time since the last read, and at least every
``rebuild_s`` seconds (a score or billing change of held work -- what picks spot victims -- is
in no feed). Whatever the index believes, the database still refuses overlapping allocations: a
stale index costs a lost race, never a double booking.

PostgreSQL only: on the embedded SQLite default (small fleets) every cycle builds its index.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.db import connection, transaction

from provisioning.scheduling.change_feed import ChangeFeed
from provisioning.scheduling.fleet_shape import FleetShape, blocked_now, node_capacity
from provisioning.scheduling.planner.state import Capacity
from provisioning.scheduling.snapshot import window_allocations

# Every allocation that ends after now: what is held or booked from now on, whatever the window.
AHEAD = timedelta(days=3650)
# More changed nodes than this share of the index: building again is as cheap as catching up.
REBUILD_SHARE = 0.4


class KeptCapacity:
    def __init__(self, shape: FleetShape, rebuild_s: float = 300.0, rebuild_share: float = REBUILD_SHARE):
        self.shape = shape
        self.rebuild_s, self.rebuild_share = rebuild_s, rebuild_share
        self.capacity: Capacity | None = None
        self.nodes: dict = {}  # node id -> NodeState of the index
        self.feed = ChangeFeed()
        # What the last cycle committed exactly as planned: its transactions, whose feed rows tell
        # nothing new, and the nodes the plan wrote that must be read again (None: every one).
        self._own: set[int] = set()
        self._unsettled: set | None = None
        self.blocked: tuple[set, set] | None = None
        self.built_at = float("-inf")
        self.rebuilds = self.caught_up = 0  # for the bench: whole builds, nodes read again
        self._frozen = 0  # the build last moved out of the collector's way

    def for_cycle(self, now: datetime) -> Capacity:
        """The index as the database stands now (its ``origin`` at ``now``), tracking what the cycle changes."""
        if connection.vendor != "postgresql":
            self.shape.refresh()
            return self._build(now, blocked_now())
        with _one_snapshot():  # the feed and the rows read again describe the same moment
            capacity = self._catch_up(now)
        self.feed.prune()
        return capacity

    def applied(self, xids: set[int], unsettled: set) -> None:
        """
        The cycle's placements were committed by the transactions ``xids``, each as planned but
        those on ``unsettled`` nodes (not committed, refused, evicting): the index already holds
        the rest, so only those nodes are read again, and the feed's rows of ``xids`` are skipped.
        """
        self._own, self._unsettled = xids, unsettled

    def _catch_up(self, now: datetime) -> Capacity:
        own, unsettled, self._own, self._unsettled = self._own, self._unsettled, set(), None
        changes = self.feed.read(now, skip=own)
        if (self.capacity is None or changes.stale or changes.shape
                or time.monotonic() - self.built_at >= self.rebuild_s):
            self.shape.read()
            return self._build(now, blocked_now())
        # Nodes that started or stopped taking work, or whose GPUs did: they leave the index and
        # come back with what may take work now.
        blocked = self._blocked(changes.rights)
        moved = self._moved(blocked)
        wrote = {node.node_id for node in self.capacity.touched}
        changed = (wrote if unsettled is None else wrote & unsettled) | changes.allocations
        changed = (changed & self.nodes.keys()) - moved
        if len(changed) + len(moved) > self.rebuild_share * len(self.nodes):
            return self._build(now, blocked)
        self.capacity.advance(now)
        if changed or moved:
            busy = window_allocations(now, now + AHEAD, node_ids=changed | moved)
            for node_id in changed:
                for gpu in self.nodes[node_id].gpus:
                    self.capacity.reload(gpu, busy.get(gpu.gpu_id, ()))
            blocked_nodes, blocked_gpus = blocked
            for node_id in moved:
                if node_id in self.nodes:
                    self.capacity.remove_node(self.nodes.pop(node_id))
                shape = None if node_id in blocked_nodes else self.shape.node(node_id)
                if shape is not None and (node := node_capacity(shape, blocked_gpus, busy)) is not None:
                    self.nodes[node_id] = self.capacity.add_node(node)
        self.caught_up += len(changed) + len(moved)
        self.blocked = blocked
        self.capacity.touched = set()
        return self.capacity

    def freeze(self) -> None:
        """
        After a build, move the process's objects -- the index's hundreds of thousands among them --
        to the collector's permanent generation (``gc.freeze``): a full collection walked them all
        between cycles, a pause of a second or two on the 10,240-node fleet. The loop calls it
        between cycles; the index frees itself when dropped (``Capacity.dispose``), not by the collector.
        """
        if self.rebuilds != self._frozen:
            gc.freeze()
            self._frozen = self.rebuilds

    def _blocked(self, nodes: set) -> tuple[set, set]:
        """What may not take work now: the last cycle's answer, with ``nodes`` (and their GPUs) asked again."""
        if not nodes:
            return self.blocked
        was_nodes, was_gpus = self.blocked
        now_nodes, now_gpus = blocked_now(node_ids=nodes)
        gone = {g.gpu_id for n in nodes if (shape := self.shape.node(n)) is not None for g in shape.gpus}
        return (was_nodes - nodes) | now_nodes, (was_gpus - gone) | now_gpus

    def _moved(self, blocked: tuple[set, set]) -> set:
        """The nodes whose own or whose GPUs' right to take work changed since the last cycle."""
        (was_nodes, was_gpus), (nodes, gpus) = self.blocked, blocked
        moved = was_nodes ^ nodes
        moved.update(self.shape.node_of_gpu(gpu_id) for gpu_id in was_gpus ^ gpus)
        moved.discard(None)
        return moved

    def dispose(self) -> None:
        """Drop the index (see ``Capacity.dispose``); the next cycle builds one."""
        if self.capacity is not None:
            self.capacity.dispose()
        self.capacity = None

    def _build(self, now: datetime, blocked: tuple[set, set]) -> Capacity:
        self.dispose()
        self.capacity = Capacity(self.shape.snapshot(now=now, until=now + AHEAD, blocked=blocked))
        self.capacity.touched = set()
        self.nodes = {node.node_id: node for nodes in self.capacity.region_nodes.values() for node in nodes}
        self.blocked = blocked
        self.built_at = time.monotonic()
        self.rebuilds += 1
        return self.capacity


@contextmanager
def _one_snapshot():
    """
    A REPEATABLE READ transaction, so every statement sees one snapshot of the database: a row
    committed between reading the feed and reading the rows would otherwise be in the index and
    in a later read of the feed: read twice, harmless; but a row read before its node's feed row
    was seen could be taken for the index's own. Inside a
    transaction already (tests), that transaction's reads serve.
    """
    if connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield

