"""
Which GPUs of one node a multi-GPU unit takes: those that share the best link.

A GPU's place in its node is ``(NVLink domain, PCIe switch, NUMA node)``: numbers that the GPUs
sharing one have in common, None where it is not known. The node agent reads them from NVML
(provisioning.agent.topology) and the inventory keeps them (cloud.GPU). A set of GPUs is as fast
as its slowest pair: all in one NVLink domain (NVLink bridges or an NVSwitch), else all under one
PCIe switch, else all on one NUMA node (through that CPU's root complex), else across NUMA nodes
(through the CPUs' interconnect).

``choose`` compares a few candidate sets -- one per NVLink domain, PCIe switch and NUMA node that
holds the unit, and the whole node -- never all subsets (a node has at most 16 GPUs, but a cycle
places hundreds of units): the best link first, then the fewest PCIe switches and NUMA nodes,
then a best fit, the set that leaves the fewest free GPUs beside it in the domains, NUMA nodes and
switches it uses, so that whole ones stay free for the next unit. Pure.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

Place = tuple[int | None, int | None, int | None]  # (NVLink domain, PCIe switch, NUMA node)
UNKNOWN: Place = (None, None, None)
DOMAIN, SWITCH, NUMA_NODE = 0, 1, 2  # a Place's positions
LEFTOVER_LEVELS = (DOMAIN, NUMA_NODE, SWITCH)  # whole ones kept free in this order of importance
# Link classes of a set of GPUs, best first; a set whose places are not known has none.
NVLINK, PCIE_SWITCH, NUMA, SYSTEM = "nvlink", "pcie_switch", "numa", "system"
LINKS = (NVLINK, PCIE_SWITCH, NUMA, SYSTEM)
UNKNOWN_RANK = len(LINKS)
# Free patterns whose choice is remembered: an 8-GPU board has 256 subsets, asked for up to 8 GPUs.
CHOICES_KEPT = 8192


def link_rank(places: Sequence[Place]) -> int:
    """The slowest link between any two of these GPUs, as a position in LINKS (UNKNOWN_RANK: not known)."""
    for level in (DOMAIN, SWITCH, NUMA_NODE):
        first = places[0][level]
        if first is not None and all(p[level] == first for p in places):
            return level
    return LINKS.index(SYSTEM) if all(p[NUMA_NODE] is not None for p in places) else UNKNOWN_RANK


def link_of(places: Sequence[Place]) -> str | None:
    """The link class of two or more GPUs; None for one GPU, or when their places are not known."""
    if len(places) < 2:
        return None
    rank = link_rank(places)
    return LINKS[rank] if rank < UNKNOWN_RANK else None


def numa_of(places: Sequence[Place]) -> int | None:
    """The NUMA node all these GPUs are on; None when they span several or it is not known."""
    found = {p[NUMA_NODE] for p in places}
    return found.pop() if len(found) == 1 else None


def quality(places: Sequence[Place]) -> tuple[int, int, int]:
    """How well a set of GPUs is linked, lower is better: link rank, PCIe switches, NUMA nodes."""
    return link_rank(places), len({p[SWITCH] for p in places}), len({p[NUMA_NODE] for p in places})


def take_fewest(bins: Sequence[tuple[T, int]], count: int) -> list[tuple[T, int]] | None:
    """
    Take ``count`` from as few bins as possible: the largest bins whole, then the rest from the
    smallest bin that still holds it (best fit, so the bigger bins stay whole). ``None`` when all
    bins together hold too little.
    """
    if sum(size for _, size in bins) < count:
        return None
    rest = sorted(bins, key=lambda b: -b[1])
    taken: list[tuple[T, int]] = []
    while True:
        holding = [b for b in rest if b[1] >= count]
        if holding:
            last = min(holding, key=lambda b: b[1])
            return [*taken, (last[0], count)]
        biggest = rest.pop(0)
        taken.append(biggest)
        count -= biggest[1]


def choose(places: Sequence[Place], k: int) -> list[int]:
    """
    ``k`` of the GPUs whose places are given (the free GPUs of one node, in index order): their
    positions in ``places``, ascending. Places all unknown: the first ``k``, as before topology.
    """
    n = len(places)
    if k >= n:
        return list(range(n))
    if all(p == UNKNOWN for p in places):
        return list(range(k))
    return list(_choose(tuple(places), k))


@functools.lru_cache(maxsize=CHOICES_KEPT)
def _choose(places: tuple[Place, ...], k: int) -> tuple[int, ...]:
    """``choose`` once per free pattern: a fleet's nodes are of a few boards, so their free GPUs repeat."""
    n = len(places)
    if k == 1:  # no link to choose: only the best fit (ties: the lowest index), counted once per group
        counts = [Counter(p[level] for p in places) for level in LEFTOVER_LEVELS]
        return (min(range(n), key=lambda i: tuple(0 if places[i][level] is None else count[places[i][level]]
                                                  for count, level in zip(counts, LEFTOVER_LEVELS, strict=True))),)
    best = None
    for group in _groups(places, k):
        pick = _fill(places, group, k)
        key = (*quality([places[i] for i in pick]), *_leftover(places, pick))
        if best is None or key < best[0]:
            best = (key, pick)
    return tuple(sorted(best[1]))


def split(places: Sequence[Place], k: int) -> list[list[int]]:
    """Several units of ``k`` GPUs out of these (one node's share of a request): ``choose`` again and again."""
    left = list(range(len(places)))
    units = []
    while left:
        pick = [left[i] for i in choose([places[j] for j in left], k)]
        units.append(pick)
        left = [i for i in left if i not in pick]
    return units


def record(indexes: Sequence[int], places: Sequence[Place]) -> dict:
    """What an instance keeps of its GPUs' topology: their indexes, their link class, their NUMA node."""
    return {"gpus": list(indexes), "link": link_of(places), "numa_node": numa_of(places)}


def _groups(places: Sequence[Place], k: int):
    """The sets to choose within: each NVLink domain, PCIe switch and NUMA node with ``k`` free GPUs, and all."""
    for level in (DOMAIN, SWITCH, NUMA_NODE):
        members: dict[int, list[int]] = {}
        for i, p in enumerate(places):
            if p[level] is not None:
                members.setdefault(p[level], []).append(i)
        yield from (m for m in members.values() if len(m) >= k)
    yield list(range(len(places)))


def _fill(places: Sequence[Place], group: list[int], k: int) -> list[int]:
    """``k`` of ``group``: the fewest NUMA nodes, within each the fewest PCIe switches, each a best fit."""
    picked: list[int] = []
    for on_numa, share in take_fewest(_bins(places, group, NUMA_NODE), k) or ():
        for on_switch, count in take_fewest(_bins(places, on_numa, SWITCH), share) or ():
            picked += on_switch[:count]
    return picked


def _bins(places: Sequence[Place], members: list[int], level: int) -> list[tuple[list[int], int]]:
    """``members`` grouped by their place at ``level`` (one whose place is not known, alone), in index order."""
    bins: dict[object, list[int]] = {}
    for i in members:
        value = places[i][level]
        bins.setdefault(("alone", i) if value is None else value, []).append(i)
    return [(m, len(m)) for m in bins.values()]


def _leftover(places: Sequence[Place], pick: Sequence[int]) -> tuple[int, int, int]:
    """The free GPUs left beside ``pick`` in the NVLink domains, NUMA nodes and PCIe switches it uses."""
    picked = set(pick)
    counts = []
    for level in LEFTOVER_LEVELS:
        used = {places[i][level] for i in pick} - {None}
        counts.append(sum(1 for i, p in enumerate(places) if i not in picked and p[level] in used))
    return counts[0], counts[1], counts[2]
