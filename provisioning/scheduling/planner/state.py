"""
The planner's indexed, mutable view of a Snapshot: who holds which GPU memory when.

Times are integer microseconds after ``snapshot.now``: exact, and cheaper to compare than
datetimes. Nothing is ever placed before ``now``, so work that ended by then is dropped at build.

Index, per (region, GPU model, node pool), one ``Pool`` per InfiniBand fabric:
  pool -> leaves (grouped by pod) -> nodes -> GPUs -> allocations sorted by start.
Each GPU keeps summaries that answer most questions without a scan: ``last_end`` (free for any
window that starts after it), ``busy_until`` (busy without a gap from now until then, so not
free for any window that starts before it) and ``first_start`` (free for any window that ends
before it). Each node folds them into counts of GPUs that are clean (nothing from now on), busy
now, or booked only ahead, with the earliest a busy one frees up (``busy_min``) and the earliest
a booked one is needed (``ahead_min``): for a window that starts before ``busy_min`` and ends by
``ahead_min`` the node's free GPUs are ``clean + ahead``, an O(1) answer for nearly every node.
Only nodes whose bookings interleave with the window fall back to interval checks.

Every change goes through ``Capacity.set_entries``, which keeps those summaries, the slot-layout
index and the per-region load counts in step and journals an undo step.

The scheduler loop keeps one index across cycles (provisioning.scheduling.kept_capacity): a later cycle moves
``origin`` -- the tick that is "now" -- forward instead of building again. The summaries above stay
true for every window that starts at or after ``origin``; work that ended between the build and
``origin`` only makes a node take the slower, exact path until its entries are set again.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import NamedTuple
from uuid import UUID

from provisioning.scheduling.plan_types import Snapshot
from provisioning.scheduling.planner.load import SHARE_UNITS, Load
from provisioning.scheduling.planner.slots import (
    NO_LAYOUTS,
    Layout,
    layout_key,
    layout_slots,
    slot_layout,
    slot_range,  # noqa: F401 -- imported from here by others
)
from provisioning.scheduling.planner.topology import UNKNOWN, Place

FOREVER = 1 << 62  # later than any window
TICK = timedelta(microseconds=1)


class Entry(NamedTuple):
    """One allocation of GPU memory ``[lo, hi)`` for ``[start, end)``."""

    start: int
    end: int
    lo: int
    hi: int
    owner: UUID  # the reservation
    # The owner's priority when it is spot work of the snapshot that may be evicted; None otherwise
    # (work placed by this planner is not in the database yet, so it is never a victim).
    victim_priority: float | None = None
    share_class: str = ""  # a time-sliced slot's slice class


class GpuState:
    __slots__ = ("gpu_id", "index", "memory", "node", "entries", "last_end", "busy_until", "first_start", "layouts",
                 "place")

    def __init__(self, gpu_id: UUID, index: int, memory: int, node: NodeState, entries: list[Entry],
                 place: Place = UNKNOWN):
        self.gpu_id = gpu_id
        self.index = index
        self.memory = memory
        self.node = node
        self.entries = entries
        self.place = place  # (NVLink domain, PCIe switch, NUMA node) in its node: planner.topology
        self.refresh()

    def refresh(self, origin: int = 0) -> None:
        """Recompute the summaries after ``entries`` changed, from ``origin`` (now) on: work ended by then is past."""
        covered = origin
        last = 0
        first = FOREVER
        layouts = NO_LAYOUTS
        for x in self.entries:
            if x.end <= origin:
                continue
            if first == FOREVER:
                first = x.start
            if x.start <= covered < x.end:
                covered = x.end
            if x.end > last:
                last = x.end
            if x.hi - x.lo < self.memory:
                n = slot_layout(self.memory, x.lo, x.hi)
                key = layout_key(n, x.share_class)
                if n and key not in layouts:
                    layouts = layouts | {key}
        self.busy_until = covered  # origin itself when nothing holds it now
        self.last_end = last
        self.first_start = first
        self.layouts = layouts

    def free(self, s: int, e: int) -> bool:
        """True when nothing on this GPU overlaps ``[s, e)`` in time (a whole-GPU request)."""
        if self.last_end <= s:
            return True
        if s < self.busy_until:
            return False
        for x in self.entries:
            if x.start >= e:
                return True
            if x.end > s:
                return False
        return True

    def busy_at(self, t: int) -> bool:
        if self.last_end <= t:
            return False
        if t < self.busy_until:
            return True
        return any(x.start <= t < x.end for x in self.entries)

    def free_slots(self, s: int, e: int, n: int) -> list[int]:
        """The slots of an ``n``-way layout that nothing overlaps in memory during ``[s, e)``."""
        if self.last_end <= s:
            return list(range(n))
        memory = self.memory
        taken = [False] * n
        for x in self.entries:
            if x.start >= e:
                break
            if x.end > s:
                k = -(-x.lo * n // memory)  # the first slot that starts at or after lo ...
                if k and k * memory // n > x.lo:
                    k -= 1  # ... or the one before it, when that one reaches past lo
                while k < n and k * memory // n < x.hi:
                    taken[k] = True
                    k += 1
        return [k for k in range(n) if not taken[k]]


class NodeState:
    __slots__ = ("node_id", "region", "leaf", "pool", "gpus", "size", "clean", "busy", "busy_min", "ahead",
                 "ahead_min", "bucket", "shaped")

    def __init__(self, node_id: UUID, region: str, leaf: Leaf, pool: Pool):
        self.node_id = node_id
        self.region = region
        self.leaf = leaf
        self.pool = pool
        self.gpus: list[GpuState] = []
        self.size = self.clean = self.busy = self.ahead = 0
        self.busy_min = self.ahead_min = FOREVER
        self.bucket: int | None = None  # its GPUs free now, as ``Pool.free_nodes`` files it
        self.shaped = False  # some GPU's place in the node is known: a multi-GPU unit chooses by topology

    def refresh(self, origin: int = 0) -> None:
        """
        Recount after a GPU's entries changed: clean GPUs, GPUs busy now, GPUs booked only ahead
        (now being ``origin``). A GPU whose summaries are from an earlier now counts as busy or
        ahead, never wrongly as clean; the fast answers below then fall back to the exact ones.
        """
        clean = busy = ahead = 0
        busy_min = ahead_min = FOREVER
        for g in self.gpus:
            if g.last_end <= origin:
                clean += 1
            elif g.busy_until > origin:
                busy += 1
                busy_min = min(busy_min, g.busy_until)
            else:
                ahead += 1
                ahead_min = min(ahead_min, g.first_start)
        self.size = len(self.gpus)
        self.clean, self.busy, self.ahead = clean, busy, ahead
        self.busy_min, self.ahead_min = busy_min, ahead_min
        if self.bucket != clean + ahead:
            filed = self.pool.free_nodes
            if self.bucket is not None:
                filed.get(self.bucket, {}).pop(self, None)
            self.bucket = clean + ahead
            filed.setdefault(self.bucket, {})[self] = None

    def free_count(self, s: int, e: int) -> int:
        """GPUs free for the whole of ``[s, e)``; O(1) unless the window reaches past a booking's edge."""
        if s < self.busy_min and e <= self.ahead_min:
            return self.clean + self.ahead
        return sum(1 for g in self.gpus if g.free(s, e))

    def whole_free(self, s: int, e: int) -> bool:
        """Every GPU free for ``[s, e)``: what a bare-metal unit needs."""
        if self.busy and s < self.busy_min:
            return False
        if not self.busy and e <= self.ahead_min:
            return True
        return all(g.free(s, e) for g in self.gpus)

    def free_gpus(self, s: int, e: int) -> list[GpuState]:
        return [g for g in self.gpus if g.free(s, e)]


class Leaf:
    __slots__ = ("leaf_id", "pod", "nodes")

    def __init__(self, leaf_id: UUID, pod: tuple[UUID, int]):
        self.leaf_id = leaf_id
        self.pod = pod  # (fabric, pod number): pod numbers repeat across fabrics
        self.nodes: list[NodeState] = []


class Pool:
    """The nodes of one region, GPU model and node pool on one fabric (a placement never spans fabrics)."""

    def __init__(self, region: str, model: UUID, kind: str, fabric: UUID):
        self.region = region
        self.model = model
        self.kind = kind
        self.fabric = fabric
        self.nodes: list[NodeState] = []
        self.leaves: list[Leaf] = []
        self.pods: dict[tuple[UUID, int], list[Leaf]] = {}
        self.max_size = 0
        # slot layout -> GPUs carrying slots of it (an ordered set), for bin-packing fractions
        self.layout_gpus: dict[Layout, dict[GpuState, None]] = {}
        # ... and those of them with a slot free now, as of ``room_origin[layout]`` (the planner scans
        # them instead of every GPU of the layout; slot_units rebuilds it when "now" has moved on),
        # and the node a GPU was last started on for the layout (its next GPU goes beside it).
        self.slot_room: dict[Layout, dict[GpuState, None]] = {}
        self.room_origin: dict[Layout, int] = {}
        self.slot_node: dict[Layout, NodeState] = {}
        # GPUs free now -> the nodes with that many (an ordered set): a best fit without a scan.
        self.free_nodes: dict[int, dict[NodeState, None]] = {}
        # evictable reservation -> GPUs it holds here: a cheap bound before looking for victims
        self.victims: dict[UUID, int] = {}


class Capacity:
    """The whole index over one Snapshot, and the only place that changes it."""

    def __init__(self, snapshot: Snapshot, *, slot_shares: bool = False, spot_free: bool = False):
        # ``slot_shares``: the headroom counts a GPU cut into slots by the share in use (planner.load), else whole;
        # ``spot_free``: what only evictable spot work holds counts as free in it.
        self.now = snapshot.now
        self.pools: dict[tuple[str, UUID, str], list[Pool]] = {}
        self.gpus: dict[UUID, GpuState] = {}
        self.group_gpus: dict[tuple[str, UUID, str], int] = {}  # (region, model, pool kind) -> GPUs
        self.region_nodes: dict[str, list[NodeState]] = {}
        self.victim_priority: dict[UUID, float] = {}  # evictable reservations of the snapshot
        self.holdings: dict[UUID, set[GpuState]] = {}  # evictable reservation -> its GPUs
        self.journal: list[Callable[[], None]] = []
        self.origin = 0  # the tick that is now: 0 at build, later when a kept index is reused
        # Nodes whose GPUs changed since the keeper last caught up (kept indexes track it; None: not tracked).
        self.touched: set[NodeState] | None = None
        # (region, model, pool kind) -> instant -> share of its GPUs in use then
        self.load = Load(slot_shares, spot_free)
        self._victim_order: list[float] | None = None
        # Where ``_add`` finds a node's pool and leaf: (group, fabric) -> Pool, (group, leaf) -> Leaf.
        self._fabrics: dict[tuple[str, UUID, str, UUID], Pool] = {}
        self._leaves: dict[tuple[tuple[str, UUID, str], UUID], Leaf] = {}
        self._build(snapshot)

    #
    # Time
    #

    def ticks(self, moment: datetime) -> int:
        return (moment - self.now) // TICK

    def time(self, ticks: int) -> datetime:
        return self.now + ticks * TICK

    def advance(self, now: datetime) -> None:
        """Plan from ``now`` on (not before the build's own now) on this index."""
        self.origin = max(self.origin, self.ticks(now))
        self.load.advance(self.origin)

    #
    # Building
    #

    def _build(self, snapshot: Snapshot) -> None:
        self._find_victims(snapshot)
        for cap in snapshot.nodes:
            self._add(cap)

    def _add(self, cap) -> NodeState:
        """One node of a snapshot (``NodeCapacity``) into the index, after those already in it."""
        group = (cap.region, cap.gpu_model_id, cap.pool)
        pool = self._fabrics.get((*group, cap.fabric_id))
        if pool is None:
            pool = self._fabrics[(*group, cap.fabric_id)] = Pool(cap.region, cap.gpu_model_id, cap.pool, cap.fabric_id)
            self.pools.setdefault(group, []).append(pool)
        leaf = self._leaves.get((group, cap.leaf_id))
        if leaf is None:
            leaf = self._leaves[(group, cap.leaf_id)] = Leaf(cap.leaf_id, (cap.fabric_id, cap.pod))
            pool.leaves.append(leaf)
            pool.pods.setdefault(leaf.pod, []).append(leaf)
        node = NodeState(cap.node_id, cap.region, leaf, pool)
        self.group_gpus[group] = self.group_gpus.get(group, 0) + len(cap.gpus)
        self.load.forget(group)
        for g in cap.gpus:
            gpu = GpuState(g.gpu_id, g.index, g.memory_mib, node, self._entries(g.busy),
                           (g.nvlink_domain, g.pcie_switch, g.numa_node))
            node.shaped = node.shaped or gpu.place != UNKNOWN
            if self.origin:
                gpu.refresh(self.origin)
            node.gpus.append(gpu)
            self.gpus[g.gpu_id] = gpu
            if gpu.entries:  # a GPU with nothing on it has no layout and no holder to index
                self._index_layouts(gpu, NO_LAYOUTS)
                self._index_holdings(gpu)
        node.refresh(self.origin)
        self.region_nodes.setdefault(cap.region, []).append(node)
        leaf.nodes.append(node)
        pool.nodes.append(node)
        pool.max_size = max(pool.max_size, node.size)
        return node

    def add_node(self, cap) -> NodeState:
        """
        A node that may take work again (``NodeCapacity`` with its allocations) into a kept index
        (not journaled). It goes after the nodes already there: only ties may fall otherwise than
        in a fresh build.
        """
        for g in cap.gpus:
            self._note_victims(g.busy)
        return self._add(cap)

    def _note_victims(self, busy) -> None:
        """
        Spot work read again that still holds something from now on may be evicted (at its highest
        priority). Rows from the database carry their reservation's billing term, so a reservation
        is spot in all its rows or none (``_find_victims`` checks that for hand-made snapshots).
        """
        for b in busy:
            if (b.preemptible and self.ticks(b.end) > self.origin
                    and b.priority > self.victim_priority.get(b.reservation_id, float("-inf"))):
                self.victim_priority[b.reservation_id] = b.priority
        self._victim_order = None

    def remove_node(self, node: NodeState) -> None:
        """Take a node that may not take work now out of a kept index (not journaled), with its GPUs."""
        for gpu in node.gpus:
            self.reload(gpu, ())  # its holders and slot layouts leave the indexes
            del self.gpus[gpu.gpu_id]
        pool, leaf = node.pool, node.leaf
        group = (pool.region, pool.model, pool.kind)
        self.group_gpus[group] -= len(node.gpus)
        self.load.forget(group)
        self.region_nodes[node.region].remove(node)
        leaf.nodes.remove(node)
        pool.nodes.remove(node)
        pool.free_nodes.get(node.bucket, {}).pop(node, None)
        for key, beside in list(pool.slot_node.items()):
            if beside is node:
                del pool.slot_node[key]
        if not leaf.nodes:
            del self._leaves[(group, leaf.leaf_id)]
            pool.leaves.remove(leaf)
            pool.pods[leaf.pod].remove(leaf)
            if not pool.pods[leaf.pod]:
                del pool.pods[leaf.pod]
        if not pool.nodes:
            del self._fabrics[(*group, pool.fabric)]
            self.pools[group].remove(pool)
            if not self.pools[group]:
                del self.pools[group]
        pool.max_size = max((n.size for n in pool.nodes), default=0)
        if self.touched is not None:
            self.touched.discard(node)
        node.gpus = []

    def _find_victims(self, snapshot: Snapshot) -> None:
        """A reservation may be evicted only when every allocation of it is spot work; its priority is the highest."""
        not_spot: set[UUID] = set()
        priority: dict[UUID, float] = {}
        for cap in snapshot.nodes:
            for g in cap.gpus:
                for b in g.busy:
                    if not b.preemptible:
                        not_spot.add(b.reservation_id)
                    elif b.priority > priority.get(b.reservation_id, float("-inf")):
                        priority[b.reservation_id] = b.priority
        self.victim_priority = {rid: p for rid, p in priority.items() if rid not in not_spot}

    def _entries(self, busy) -> list[Entry]:
        if not busy:
            return []  # most GPUs: nothing to convert
        entries = []
        now = self.now
        for b in busy:
            start, end = (b.start - now) // TICK, (b.end - now) // TICK
            if end > self.origin and end > start:  # work that ended by now can never conflict again
                entries.append(Entry(start, end, b.mem_lo, b.mem_hi, b.reservation_id,
                                     self.victim_priority.get(b.reservation_id), b.share_class))
        entries.sort(key=lambda x: x.start)
        return entries

    def _index_layouts(self, gpu: GpuState, old_layouts: frozenset[Layout]) -> None:
        """Keep the slot-layout index in step with one GPU's entries."""
        pool = gpu.node.pool
        for n in old_layouts - gpu.layouts:
            pool.layout_gpus[n].pop(gpu, None)
        for n in gpu.layouts - old_layouts:
            pool.layout_gpus.setdefault(n, {})[gpu] = None

    def _index_room(self, gpu: GpuState, old_layouts: frozenset[Layout]) -> None:
        """Keep ``Pool.slot_room`` in step with one GPU's entries (a slot free now, or not)."""
        pool = gpu.node.pool
        for key in old_layouts - gpu.layouts:
            pool.slot_room.get(key, {}).pop(gpu, None)
        for key in gpu.layouts:
            room = pool.slot_room.setdefault(key, {})
            if gpu.free_slots(self.origin, self.origin + 1, layout_slots(key)):
                room[gpu] = None
            else:
                room.pop(gpu, None)

    def _index_holdings(self, gpu: GpuState) -> None:
        """Which GPUs each evictable reservation holds (only snapshot work is ever a victim)."""
        pool = gpu.node.pool
        for x in gpu.entries:
            if x.victim_priority is not None:
                held = self.holdings.setdefault(x.owner, set())
                if gpu not in held:
                    held.add(gpu)
                    pool.victims[x.owner] = pool.victims.get(x.owner, 0) + 1

    def _unindex_holdings(self, gpu: GpuState) -> None:
        """``_index_holdings`` undone for one GPU; a reservation that holds nothing more is no victim."""
        pool = gpu.node.pool
        for x in gpu.entries:
            held = self.holdings.get(x.owner) if x.victim_priority is not None else None
            if held is not None and gpu in held:
                held.discard(gpu)
                if pool.victims.get(x.owner, 0) > 1:
                    pool.victims[x.owner] -= 1
                else:
                    pool.victims.pop(x.owner, None)
                if not held:
                    del self.holdings[x.owner]
                    self.victim_priority.pop(x.owner, None)

    #
    # Changing it
    #

    def set_entries(self, gpu: GpuState, entries: list[Entry], *, journal: bool = True) -> None:
        """Replace one GPU's allocations, keeping every summary and index over it in step."""
        old = gpu.entries
        if journal:
            self.journal.append(lambda: self.set_entries(gpu, old, journal=False))
        before = self.load.before(gpu, old, entries)
        old_layouts = gpu.layouts
        gpu.entries = entries
        gpu.refresh(self.origin)
        gpu.node.refresh(self.origin)
        if self.touched is not None:
            self.touched.add(gpu.node)
        if gpu.layouts != old_layouts:
            self._index_layouts(gpu, old_layouts)
        if gpu.layouts or old_layouts:
            self._index_room(gpu, old_layouts)
        self.load.after(gpu, before)

    def reload(self, gpu: GpuState, busy) -> None:
        """
        Set one GPU's allocations as read again from the database (``Busy`` rows; not journaled):
        a kept index catching up. Its holders' eviction index follows: a spot reservation is a
        victim while it holds a GPU of the index.
        """
        self._unindex_holdings(gpu)
        self._note_victims(busy)
        self.set_entries(gpu, self._entries(busy), journal=False)
        self._index_holdings(gpu)

    def add(self, gpu: GpuState, entry: Entry) -> None:
        entries = gpu.entries.copy()
        bisect.insort(entries, entry, key=lambda x: x.start)
        self.set_entries(gpu, entries)

    def remove_owner(self, gpu: GpuState, owner: UUID) -> None:
        self.set_entries(gpu, [x for x in gpu.entries if x.owner != owner])

    def evict(self, victim: UUID, at: int) -> None:
        """End every allocation of ``victim`` at ``at`` (those not started by then are dropped)."""
        priority = self.victim_priority.pop(victim)
        held = self.holdings.pop(victim, set())
        pools = {pool: pool.victims.pop(victim, 0) for pool in {gpu.node.pool for gpu in held}}
        self._victim_order = None

        def restore() -> None:
            self.victim_priority[victim] = priority
            self.holdings[victim] = held
            for pool, count in pools.items():
                pool.victims[victim] = count
            self._victim_order = None

        self.journal.append(restore)
        for gpu in held:
            kept = []
            for x in gpu.entries:
                if x.owner != victim:
                    kept.append(x)
                elif x.start < at and min(x.end, at) > self.origin:
                    kept.append(x._replace(end=min(x.end, at), victim_priority=None))
            self.set_entries(gpu, kept)

    def rollback(self, mark: int = 0) -> None:
        """Undo every change journaled since ``mark``."""
        while len(self.journal) > mark:
            self.journal.pop()()

    def commit(self) -> None:
        self.journal.clear()

    def dispose(self) -> None:
        """
        Break the index's back-references (GPU -> node -> its GPUs, node -> leaf -> its nodes,
        node -> pool -> its nodes) so it is freed at once when dropped, rather than left to the
        cyclic collector, which then walked 10,000 GPUs' worth of objects after each cycle.
        The index is not usable afterwards.
        """
        self.journal.clear()
        for nodes in self.region_nodes.values():
            for node in nodes:
                node.gpus = []
                node.leaf.nodes = []
        for pools in self.pools.values():
            for pool in pools:
                pool.nodes, pool.leaves, pool.pods, pool.layout_gpus = [], [], {}, {}
                pool.slot_room, pool.room_origin, pool.slot_node, pool.free_nodes = {}, {}, {}, {}

    #
    # Questions across a region
    #

    def count_spot_as_free(self, spot_free: bool) -> None:
        """Whether the headroom's counts take what only spot work holds as free (counted again when next asked)."""
        if self.load.spot_free != spot_free:
            self.load = Load(self.load.shares, spot_free)

    def free_at(self, group: tuple[str, UUID, str], t: int) -> float:
        """
        GPUs of a ``(region, GPU model, pool kind)`` free at instant ``t``: those with nothing on
        them, and the free share of those cut into slots; with ``spot_free``, also what only spot
        work holds (planner.load).
        """
        pools = self.pools.get(group, ())

        def spot_gpus() -> set[GpuState]:
            return {g for pool in pools for v in pool.victims for g in self.holdings.get(v, ()) if g.node.pool is pool}

        in_use = self.load.in_use(group, pools, t, spot_gpus)
        return self.group_gpus.get(group, 0) - in_use / SHARE_UNITS

    def victims_below(self, priority: float) -> int:
        """How many evictable reservations rank below ``priority``: requests alike in it pick alike victims."""
        if self._victim_order is None:
            self._victim_order = sorted(self.victim_priority.values())
        return bisect.bisect_left(self._victim_order, priority)
