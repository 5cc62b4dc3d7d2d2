"""
Where a request fits in one Pool when lower-priority spot work may be evicted.

A victim is a whole reservation of the snapshot whose every allocation is spot work with a
priority strictly below the request's; evicting it frees all its GPUs. The choice minimises the
number of victims first and their priority second. Finding the true minimum is a set-cover
problem, so the choice is greedy: repeatedly take the option (a GPU, a slot or a whole node)
that adds the fewest new victims, and among those the lowest-priority ones. Options already
freed by the victims chosen so far cost nothing, so one victim's GPUs are used together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar
from uuid import UUID

from provisioning.scheduling.planner.fit import Fit, Pick
from provisioning.scheduling.planner.state import GpuState, NodeState, Pool, layout_key, slot_range

T = TypeVar("T")
Victims = frozenset[UUID]


def blockers(gpu: GpuState, s: int, e: int, lo: int, hi: int, priority: float) -> Victims | None:
    """The reservations to evict for memory ``[lo, hi)`` of ``gpu`` to be free in ``[s, e)``; None if one may not be."""
    found = set()
    for x in gpu.entries:
        if x.start >= e:
            break
        if x.end > s and x.lo < hi and lo < x.hi:
            if x.victim_priority is None or x.victim_priority >= priority:
                return None
            found.add(x.owner)
    return frozenset(found)


def victim_cost(victims: Victims, priority_of: Mapping[UUID, float]) -> tuple[int, float, float]:
    """Fewest victims first, then the lowest highest priority, then the lowest total."""
    priorities = [priority_of[v] for v in victims]
    return len(priorities), max(priorities, default=float("-inf")), sum(priorities)


def fewest_victims(
    options: Sequence[tuple[T, Victims]], need: int, chosen: Victims, priority_of: Mapping[UUID, float]
) -> tuple[list[T], Victims] | None:
    """
    ``need`` options (each with the victims that block it) freed by the fewest victims added to
    ``chosen``, then the lowest-priority ones. Greedy, as in set cover: a single victim that
    frees enough on its own when there is one (the lowest-priority such), else the victim that
    frees the most options at once; then victims that turn out not to be needed are dropped.
    """
    if len(options) < need:
        return None
    victims = set(chosen)
    while True:
        freed = sum(1 for _, blocked_by in options if blocked_by <= victims)
        if freed >= need:
            break
        gain: dict[UUID, int] = {}  # victim -> options it alone would free now
        cheapest = None
        for _, blocked_by in options:
            added = blocked_by - victims
            if len(added) == 1:
                (v,) = added
                gain[v] = gain.get(v, 0) + 1
            elif added and (cheapest is None or victim_cost(added, priority_of) < victim_cost(cheapest, priority_of)):
                cheapest = added
        if gain:
            enough = [v for v, count in gain.items() if freed + count >= need]
            if enough:
                victims.add(min(enough, key=lambda v: (priority_of[v], str(v))))
            else:
                victims.add(max(gain, key=lambda v: (gain[v], -priority_of[v], str(v))))
        elif cheapest:
            victims |= cheapest
        else:
            return None
    for v in sorted(victims - chosen, key=lambda v: (-priority_of[v], str(v))):
        if sum(1 for _, blocked_by in options if blocked_by <= victims - {v}) >= need:
            victims.discard(v)  # the others free enough without it
    free_first = sorted((o for o in options if o[1] <= victims), key=lambda o: len(o[1] - chosen))
    picked = [item for item, _ in free_first[:need]]
    return picked, frozenset(v for _, blocked_by in free_first[:need] for v in blocked_by) - chosen


def gang_evicting(pool: Pool, count: int, size: int, s: int, e: int, priority: float,
                  priority_of: Mapping[UUID, float]) -> Fit | None:
    """
    ``count`` whole nodes, evicting the fewest victims. The cheapest of: each leaf that has enough
    candidate nodes, each such pod, the whole fabric; on equal victims the narrower scope wins.
    """
    candidates = []
    for node in pool.nodes:
        if node.size != size:
            continue
        needs: set[UUID] = set()
        for g in node.gpus:
            blocked_by = blockers(g, s, e, 0, g.memory, priority)
            if blocked_by is None:
                break
            needs |= blocked_by
        else:
            candidates.append((node, frozenset(needs)))
    by_leaf: dict[UUID, list] = {}
    by_pod: dict[tuple, list] = {}
    for option in candidates:
        by_leaf.setdefault(option[0].leaf.leaf_id, []).append(option)
        by_pod.setdefault(option[0].leaf.pod, []).append(option)
    best = None
    for tier, scopes in enumerate((by_leaf.values(), by_pod.values(), [candidates])):
        for options in scopes:
            found = fewest_victims(options, count, frozenset(), priority_of)
            if found is None:
                continue
            nodes, victims = found
            leaves = len({n.leaf.leaf_id for n in nodes})
            key = (*victim_cost(victims, priority_of), tier, leaves)
            if best is None or key < best[0]:
                best = (key, nodes, victims)
    if best is None:
        return None
    key, nodes, victims = best
    return Fit(pool, [(g, 0, g.memory) for n in nodes for g in n.gpus], key, victims)


def vm_evicting(pool: Pool, units: int, per_unit: int, s: int, e: int, priority: float,
                priority_of: Mapping[UUID, float], holdings: Mapping[UUID, set[GpuState]]) -> Fit | None:
    """Each unit on the node where it costs the fewest new victims (then the fewest usable GPUs: best fit)."""
    # A node can help only if its free GPUs and those eligible victims hold there reach a unit.
    evictable: dict[NodeState, set[GpuState]] = {}
    for v in pool.victims:
        if priority_of[v] < priority:
            for g in holdings[v]:
                if g.node.pool is pool:
                    evictable.setdefault(g.node, set()).add(g)
    nodes = [n for n in pool.nodes if len(evictable.get(n, ())) + n.free_count(s, e) >= per_unit]
    victims: Victims = frozenset()
    taken: set[GpuState] = set()
    picks: list[Pick] = []
    for _ in range(units):
        best = None
        for node in nodes:
            options = []
            for g in node.gpus:
                if g not in taken and (blocked_by := blockers(g, s, e, 0, g.memory, priority)) is not None:
                    options.append((g, blocked_by))
            found = fewest_victims(options, per_unit, victims, priority_of)
            if found is not None:
                key = (*victim_cost(found[1], priority_of), len(options))
                if best is None or key < best[0]:
                    best = (key, found)
        if best is None:
            return None
        gpus, added = best[1]
        victims |= added
        taken.update(gpus)
        picks += [(g, 0, g.memory) for g in gpus]
    return Fit(pool, picks, victim_cost(victims, priority_of), victims)


def slots_evicting(pool: Pool, units: int, n: int, s: int, e: int, priority: float,
                   priority_of: Mapping[UUID, float], share_class: str = "") -> Fit | None:
    """``units`` slots of an ``n``-way layout (of a slice class, if any) anywhere in the pool, at the fewest victims."""
    options = []
    key = layout_key(n, share_class)
    for node in pool.nodes:
        for g in node.gpus:
            if g.layouts - {key}:
                continue  # cut another way: slots of two layouts are not mixed on one GPU
            for k in range(n):
                lo, hi = slot_range(g.memory, n, k)
                blocked_by = blockers(g, s, e, lo, hi, priority)
                if blocked_by is not None:
                    options.append(((g, lo, hi), blocked_by))
    found = fewest_victims(options, units, frozenset(), priority_of)
    if found is None:
        return None
    picks, victims = found
    return Fit(pool, picks, victim_cost(victims, priority_of), victims)
