"""
How much of a ``(region, GPU model, pool kind)``'s GPUs is in use at an instant: what the headroom
rule asks before and after each reserved placement, kept up to date on every change instead of
counted again.

A GPU is in use in whole while a whole-GPU allocation covers the instant. A GPU cut into slots is
in use by the share of its memory its slots cover then: cut 8 ways with 3 slots held, 3/8 of it is
in use and 5/8 counts as free, so fractional work on a GPU already cut takes only its share off
the headroom. An allocation that is no slot of any cut counts whole. Shares are counted in
``SHARE_UNITS`` per GPU (every cut into 2 to 8 slots, and 10, 12, 14 or 15, is a whole number of
them), so the counts stay exact through any number of changes. ``shares=False`` counts a GPU whole
while anything is on it (a plain busy count).

``spot_free``: what only spot work that may be evicted holds counts as free -- with spot work in
the headroom, on-demand work ranked above that spot work (nearly always: spot is sold at low
urgency) can have it back, so it keeps reserved work out no more than free GPUs do. A GPU that
spot work shares with other work is in use (whole), or by the other work's share (``shares``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from provisioning.scheduling.planner.slots import slot_layout

if TYPE_CHECKING:
    from provisioning.scheduling.planner.state import Entry, GpuState, Pool

SHARE_UNITS = 840
# Instants whose count is kept up to date; few distinct starts are asked for at once, and each
# kept instant costs a little on every change.
LOAD_INSTANTS = 32
FOREVER = 1 << 62


def slot_share(memory: int, lo: int, hi: int) -> int:
    """The share of a GPU that memory ``[lo, hi)`` is, in SHARE_UNITS; whole unless it is one slot of a cut."""
    if not slot_layout(memory, lo, hi):
        return SHARE_UNITS
    return (2 * (hi - lo) * SHARE_UNITS + memory) // (2 * memory)  # rounded: slots of a cut differ by a MiB


def used(gpu: GpuState, t: int, shares: bool = True, spot_free: bool = False) -> int:
    """How much of ``gpu`` is in use at instant ``t`` (not before "now"), in SHARE_UNITS."""
    if not gpu.busy_at(t):
        return 0
    if spot_free and all(x.victim_priority is not None for x in gpu.entries if x.start <= t < x.end):
        return 0  # only evictable spot work holds it then
    if not shares or not gpu.layouts:  # no slot on it from now on: whatever covers t is whole
        return SHARE_UNITS
    total = 0
    for x in gpu.entries:
        if x.start > t:
            break
        if x.end > t and not (spot_free and x.victim_priority is not None):
            total += slot_share(gpu.memory, x.lo, x.hi)
    return min(total, SHARE_UNITS)


def changed_span(old: list[Entry], new: list[Entry]) -> tuple[int, int]:
    """``[lo, hi)``: the instants covered by the allocations in one list and not the other (empty if none)."""
    lo, hi = FOREVER, -FOREVER
    for x in old:
        if x not in new:
            lo, hi = min(lo, x.start), max(hi, x.end)
    for x in new:
        if x not in old:
            lo, hi = min(lo, x.start), max(hi, x.end)
    return lo, hi


class Load:
    """Per group, instant -> SHARE_UNITS in use then, for the instants asked about (at most LOAD_INSTANTS each)."""

    def __init__(self, shares: bool = True, spot_free: bool = False):
        self.shares = shares
        self.spot_free = spot_free
        self.counts: dict[tuple, dict[int, int]] = {}

    def forget(self, group: tuple) -> None:
        """The group's GPUs changed (a node came or went): its counts are made again when asked."""
        self.counts.pop(group, None)

    def advance(self, origin: int) -> None:
        """Counts kept for instants now past are never asked again, yet every change pays for them."""
        for load in self.counts.values():
            for t in [t for t in load if t < origin]:
                del load[t]

    def in_use(self, group: tuple, pools: Iterable[Pool], t: int,
               spot_gpus: Callable[[], Iterable[GpuState]] = tuple) -> int:
        """``spot_gpus``: the group's GPUs evictable spot work holds, asked for when counting with ``spot_free``."""
        load = self.counts.setdefault(group, {})
        if t not in load:
            if len(load) >= LOAD_INSTANTS:
                del load[next(iter(load))]
            load[t] = self._count(pools, t)
            if self.spot_free:  # what only spot work holds is not in the nodes' summaries: taken off here
                load[t] -= sum(used(g, t, self.shares) - used(g, t, self.shares, True) for g in spot_gpus())
        return load[t]

    def _count(self, pools: Iterable[Pool], t: int) -> int:
        units = 0
        for pool in pools:
            # Busy at t is not free for [t, t + 1): the nodes' summaries answer that in O(1) mostly.
            units += SHARE_UNITS * sum(n.size - n.free_count(t, t + 1) for n in pool.nodes)
            if self.shares and pool.layout_gpus:
                cut = {g for gpus in pool.layout_gpus.values() for g in gpus}
                units -= sum(SHARE_UNITS - used(g, t) for g in cut if g.busy_at(t))
        return units

    def before(self, gpu: GpuState, old: list[Entry], new: list[Entry]) -> list:
        """
        What ``gpu`` counts at each kept instant a change from ``old`` to ``new`` may move: only an
        instant inside an allocation that came or went (asking every kept instant, twice, was most
        of what a change cost). ``after`` applies the difference once the change is made.
        """
        pool = gpu.node.pool
        load = self.counts.get((pool.region, pool.model, pool.kind))
        if not load:
            return []
        lo, hi = changed_span(old, new)
        return [(load, t, used(gpu, t, self.shares, self.spot_free)) for t in load if lo <= t < hi]

    def after(self, gpu: GpuState, before: list) -> None:
        for load, t, was in before:
            now = used(gpu, t, self.shares, self.spot_free)
            if now != was:
                load[t] += now - was
