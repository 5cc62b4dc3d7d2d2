"""
Where a request fits in one Pool, without evicting anything.

Each function either returns a ``Fit`` (the GPU memory ranges to take and a score to compare
fabrics by, lower is better) or a ``Shortfall`` (what the pool could offer, for the reason the
request waits). Nothing here changes the Capacity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from uuid import UUID

from provisioning.scheduling.planner.state import GpuState, NodeState, Pool, layout_key, slot_range
from provisioning.scheduling.planner.topology import choose, quality, take_fewest

# A multi-GPU unit compares this many of the best-fitting nodes for the link its GPUs would share.
LOOKAHEAD = 4

Pick = tuple[GpuState, int, int]  # a GPU and the memory range [lo, hi) taken on it
ANY_LAYOUT = "*"  # Pool.slot_node's key for the node a GPU was last started on for slots of any layout


@dataclass
class Fit:
    pool: Pool
    picks: list[Pick]
    score: tuple
    victims: frozenset[UUID] = field(default_factory=frozenset)


@dataclass
class Shortfall:
    """
    What pools can offer for the window: free units (nodes, GPUs or slots) in all, how many units
    of the asked shape fit in the best one (a placement never spans fabrics), and for gangs the
    most free nodes under one leaf switch.
    """

    free: int = 0
    fits: int = 0
    largest_leaf: int = 0

    def __add__(self, other: Shortfall) -> Shortfall:
        return Shortfall(self.free + other.free, max(self.fits, other.fits), max(self.largest_leaf, other.largest_leaf))


#
# Bare metal: whole nodes under as few leaf switches as possible
#

def gang(pool: Pool, count: int, size: int, s: int, e: int) -> Fit | Shortfall:
    """
    ``count`` whole nodes of ``size`` GPUs with every GPU free for ``[s, e)``. One leaf when one
    holds them, else the fewest leaves of one pod, else the fewest pods (see ``_gang_layout``).
    """
    by_leaf = []
    for leaf in pool.leaves:
        free = [n for n in leaf.nodes if n.size == size and n.whole_free(s, e)]
        if free:
            by_leaf.append((leaf, free))
    total = sum(len(free) for _, free in by_leaf)
    if total < count:
        return Shortfall(free=total, fits=total, largest_leaf=max((len(free) for _, free in by_leaf), default=0))
    nodes, pods, leaves, slack = _gang_layout(by_leaf, count)
    return Fit(pool, [(g, 0, g.memory) for n in nodes for g in n.gpus], (pods, leaves, slack))


def _gang_layout(by_leaf: list, count: int) -> tuple[list[NodeState], int, int, int]:
    """
    The nodes of a gang and its (pods, leaves, slack). Among leaves that hold the whole gang, the
    one with the fewest free nodes (partly used leaves first, so whole leaves stay free); among
    pods, the fewest leaves and then the fullest pod; across pods, the fewest pods.
    """
    holding = [(len(free), i) for i, (_, free) in enumerate(by_leaf) if len(free) >= count]
    if holding:
        free_nodes, i = min(holding)
        return by_leaf[i][1][:count], 1, 1, free_nodes - count
    pods: dict[tuple, list[list[NodeState]]] = {}
    for leaf, free in by_leaf:
        pods.setdefault(leaf.pod, []).append(free)
    best = None
    for members in pods.values():
        shares = take_fewest([(free, len(free)) for free in members], count)
        if shares is not None:
            key = (len(shares), sum(len(free) for free in members) - count)
            if best is None or key < best[0]:
                best = (key, shares)
    if best is not None:
        (leaves, slack), shares = best
        return [n for free, k in shares for n in free[:k]], 1, leaves, slack
    pod_bins = [(members, sum(len(free) for free in members)) for members in pods.values()]
    nodes: list[NodeState] = []
    leaves = 0
    pod_shares = take_fewest(pod_bins, count) or []
    for members, share in pod_shares:
        shares = take_fewest([(free, len(free)) for free in members], share) or []
        leaves += len(shares)
        nodes += [n for free, k in shares for n in free[:k]]
    return nodes, len(pod_shares), leaves, sum(size for _, size in pod_bins) - count


#
# VMs and whole-GPU containers: best fit, to keep whole nodes free; inside a node, by topology
#

def node_buckets(pool: Pool, need: int, s: int, e: int) -> tuple[list[list[NodeState]], int]:
    """Nodes with at least ``need`` GPUs free for the window, bucketed by that count; and all free GPUs."""
    buckets: list[list[NodeState]] = [[] for _ in range(pool.max_size + 1)]
    total = 0
    for node in pool.nodes:
        c = node.free_count(s, e)
        total += c
        if c >= need:
            buckets[c].append(node)
    return buckets, total


def best_fit_node(buckets: list[list[NodeState]], need: int) -> tuple[NodeState, int] | None:
    """The node with the fewest free GPUs that still holds ``need``, taken out of its bucket."""
    for c in range(need, len(buckets)):
        if buckets[c]:
            return buckets[c].pop(0), c
    return None


def vm_units(pool: Pool, units: int, per_unit: int, s: int, e: int) -> Fit | Shortfall:
    """
    ``units`` units of ``per_unit`` GPUs, each on one node: one unit on the best-fitting node (of
    those that fit as tightly, the one whose free GPUs share the best link), several under as few
    leaf switches as bare-metal gangs (``_gang_layout``), best-fitting nodes first in each leaf.
    Within a node each unit takes the GPUs that share the best link (``gpus_for``).
    """
    buckets, total = node_buckets(pool, per_unit, s, e)
    fits = sum(len(nodes) * (c // per_unit) for c, nodes in enumerate(buckets))
    if fits < units:
        return Shortfall(free=total, fits=fits)
    if units == 1:
        c, node, gpus = _best_unit(buckets, per_unit, s, e)
        return Fit(pool, [(g, 0, g.memory) for g in gpus], (c - per_unit, quality([g.place for g in gpus])))
    by_leaf: dict = {}
    for c in range(per_unit, len(buckets)):  # fewest free GPUs first: each leaf's nodes in best-fit order
        for node in buckets[c]:
            by_leaf.setdefault(node.leaf, []).extend([node] * min(c // per_unit, units))
    nodes, pods, leaves, slack = _gang_layout(list(by_leaf.items()), units)
    picks: list[Pick] = []
    spare: dict[NodeState, list[GpuState]] = {}  # free GPUs of a node not yet taken by this request
    for node in nodes:
        free = spare[node] if node in spare else node.free_gpus(s, e)
        gpus = gpus_for(free, per_unit)
        spare[node] = [g for g in free if g not in gpus]
        picks += [(g, 0, g.memory) for g in gpus]
    return Fit(pool, picks, (pods, leaves, slack))


def gpus_for(free: list[GpuState], k: int) -> list[GpuState]:
    """``k`` of one node's free GPUs: those that share the best link (planner.topology), else the first ``k``."""
    if k >= len(free) or not free[0].node.shaped:
        return free[:k]
    return [free[i] for i in choose([g.place for g in free], k)]


def _best_unit(buckets: list[list[NodeState]], need: int, s: int, e: int) -> tuple[int, NodeState, list[GpuState]]:
    """
    The node with the fewest free GPUs that still holds ``need`` and the GPUs it would give; for a
    multi-GPU unit, of the first ``LOOKAHEAD`` nodes that fit as tightly, the one whose GPUs share
    the best link (the packing comes first: whole nodes stay free).
    """
    c = next(c for c in range(need, len(buckets)) if buckets[c])
    best = None
    for node in buckets[c][:LOOKAHEAD if need > 1 and buckets[c][0].shaped else 1]:
        gpus = gpus_for(node.free_gpus(s, e), need)
        key = quality([g.place for g in gpus])  # a node whose topology is not known ranks last
        if best is None or key < best[0]:
            best = (key, node, gpus)
    return c, best[1], best[2]


#
# Fractional containers: slots bin-packed onto GPUs already cut the same way
#

def slot_units(pool: Pool, units: int, n: int, s: int, e: int, share_class: str = "",
               now: int | None = None) -> Fit | Shortfall:
    """
    ``units`` slots of an ``n``-way layout: first the free slots of GPUs already carrying slots of
    that layout (fullest GPU first), then whole free GPUs: beside the layout's last one started (or
    the last one started for any layout) when its node has room, else on the node with the fewest
    free GPUs. Time-sliced slots (``share_class``) join only GPUs carrying slots of their size and
    class. A window starting ``now`` looks only at the GPUs with a slot free now (``Pool.slot_room``),
    rebuilt once each time "now" moves on.
    """
    key = layout_key(n, share_class)
    shared = []
    for gpu in _slot_candidates(pool, key, n, s, now):
        free = gpu.free_slots(s, e, n)
        if free:
            shared.append((len(free), gpu, free))
    shared.sort(key=lambda t: t[0])
    picks: list[Pick] = []
    for _, gpu, free in shared:
        picks += [(gpu, *slot_range(gpu.memory, n, k)) for k in free[: units - len(picks)]]
        if len(picks) == units:
            return Fit(pool, picks, (0,))
    # A shared GPU with all its slots free is also a whole free GPU; it is used up above already.
    started = {gpu for _, gpu, _ in shared}
    remaining = units - len(picks)
    new_gpus = -(-remaining // n)
    for beside in (pool.slot_node.get(key), pool.slot_node.get(ANY_LAYOUT)) if new_gpus == 1 else ():
        free = [g for g in beside.free_gpus(s, e) if g not in started] if beside is not None else ()
        if free:
            pool.slot_node[key] = pool.slot_node[ANY_LAYOUT] = beside
            picks += [(free[0], *slot_range(free[0].memory, n, k)) for k in range(remaining)]
            return Fit(pool, picks, (1,))
    if new_gpus == 1:
        gpu = _fewest_free_gpu(pool, s, e, started)
        if gpu is not None:
            pool.slot_node[key] = pool.slot_node[ANY_LAYOUT] = gpu.node
            picks += [(gpu, *slot_range(gpu.memory, n, k)) for k in range(remaining)]
            return Fit(pool, picks, (1,))
    buckets, total = node_buckets(pool, 1, s, e)
    whole = total - sum(1 for count, gpu, _ in shared if count == n and gpu.free(s, e))
    if whole < new_gpus:
        return Shortfall(free=sum(t[0] for t in shared) + whole * n, fits=sum(t[0] for t in shared) + whole * n)
    for _ in range(new_gpus):
        gpu = _new_gpu(buckets, started, s, e)
        started.add(gpu)
        pool.slot_node[key] = pool.slot_node[ANY_LAYOUT] = gpu.node
        picks += [(gpu, *slot_range(gpu.memory, n, k)) for k in range(min(n, units - len(picks)))]
    return Fit(pool, picks, (new_gpus,))


def _fewest_free_gpu(pool: Pool, s: int, e: int, started: set[GpuState]) -> GpuState | None:
    """
    A whole free GPU (none of ``started``) on the node with the fewest free GPUs: the nodes filed by
    their GPUs free now (``Pool.free_nodes``), each checked for the window; a scan when none holds.
    """
    for count in range(1, pool.max_size + 1):
        for node in pool.free_nodes.get(count, ()):
            if node.free_count(s, e):
                free = [g for g in node.free_gpus(s, e) if g not in started]
                if free:
                    return free[0]
    best, fewest = None, pool.max_size + 1
    for node in pool.nodes:
        count = node.free_count(s, e)
        if 0 < count < fewest:
            free = [g for g in node.free_gpus(s, e) if g not in started]
            if free:
                best, fewest = free[0], count
                if count == 1:
                    break
    return best


def _slot_candidates(pool: Pool, key, n: int, s: int, now: int | None):
    """The GPUs of a layout worth asking for a free slot in a window starting at ``s``."""
    every = pool.layout_gpus.get(key, {})
    if now is None or s != now:
        return list(every)
    if pool.room_origin.get(key) != now:  # "now" moved on: slots may have ended since it was built
        pool.slot_room[key] = {g: None for g in every if g.free_slots(now, now + 1, n)}
        pool.room_origin[key] = now
    return list(pool.slot_room.get(key, {}))


def _new_gpu(buckets: list[list[NodeState]], started: set[GpuState], s: int, e: int) -> GpuState:
    """A whole free GPU on the node with the fewest free GPUs."""
    while True:
        node, c = best_fit_node(buckets, 1)
        free = [g for g in node.free_gpus(s, e) if g not in started]
        if free:
            if c > 1:
                buckets[c - 1].insert(0, node)
            return free[0]
