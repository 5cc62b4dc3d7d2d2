"""
The headroom rule on hand-made fleets (pure, no database): reserved work may not take the last
share of a region's GPUs of a model; spot work may, and gives it back to on-demand work that ranks
above it by soft eviction, and GPUs only spot work holds count as headroom; GPUs cut into slots
count by their free share (``slot_shares``; whole by default).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioning.scheduling.plan_types import CONTAINER, SHARED_POOL, VM, Busy
from provisioning.scheduling.planner import Planner, uses_headroom
from provisioning.scheduling.planner.load import SHARE_UNITS, used
from provisioning.scheduling.planner.state import TICK, Capacity, Entry
from tests.provisioning.test_planner import H100, HOUR, MEM, NOW, REGION, ask, gpus_of, occupy, shared, snapshot

GRACE = timedelta(seconds=120)
GROUP = (REGION, H100, SHARED_POOL)


def fleet(busy: int = 10):
    """Two shared nodes of 8 GPUs, ``busy`` of them held by reserved work; a 25 % headroom keeps 4."""
    nodes = shared(2)
    gpus = [g for n in nodes for g in n.gpus]
    occupy(*gpus[:busy])
    return nodes, gpus


def slot(gpu, k: int, n: int = 8, **kwargs) -> uuid.UUID:
    """Slot ``k`` of ``gpu`` cut ``n`` ways, held (by reserved work unless ``spot``)."""
    return occupy(gpu, lo=k * MEM // n, hi=(k + 1) * MEM // n, **kwargs)


#
# Headroom exactly full
#

def test_reserved_work_may_leave_exactly_the_headroom_and_not_one_gpu_less():
    nodes, _ = fleet()
    planner = Planner(snapshot(nodes), headroom=0.25, spot_in_headroom=True)
    assert planner.place(ask(VM, per_unit=3, on_demand=False)) is None  # would leave 3 of the 4 kept
    assert "kept for on-demand" in planner.last_reason
    assert planner.place(ask(VM, per_unit=2, on_demand=False)) is not None  # leaves exactly 4
    assert planner.capacity.free_at(GROUP, 0) == 4
    assert planner.place(ask(VM, per_unit=1, on_demand=False)) is None
    assert len(gpus_of(planner.place(ask(VM, per_unit=4)))) == 4  # on-demand work takes the headroom


def test_reserved_work_that_has_waited_for_the_headroom_may_use_it():
    """``headroom_from``: reserved work may take the headroom for windows from then on, not before."""
    nodes, _ = fleet()
    planner = Planner(snapshot(nodes), headroom=0.25)
    later = NOW + HOUR
    assert planner.place(ask(VM, per_unit=3, on_demand=False, headroom_from=later)) is None
    assert "this one may from" in planner.last_reason and later.strftime("%H:%M") in planner.last_reason
    assert planner.place(ask(VM, per_unit=3, on_demand=False, headroom_from=later, start=later)) is not None
    assert planner.place(ask(VM, per_unit=3, on_demand=False, headroom_from=NOW)) is not None
    assert planner.capacity.free_at(GROUP, 0) == 3


def test_a_reserved_request_that_may_use_the_headroom_after_the_grace_is_not_refused_for_one_that_may_not():
    """
    Failed requests are remembered by shape: two reserved requests alike but for when they may use
    the headroom are not alike. The second may use it by the time its eviction's grace ends.
    """
    nodes, gpus = fleet()
    occupy(*gpus[10:], spot=True, priority=0.1)  # 6 GPUs only spot work holds: counted as headroom
    planner = Planner(snapshot(nodes), headroom=0.25)
    kept_out = ask(VM, per_unit=4, on_demand=False, eviction_grace=GRACE)
    assert planner.place(kept_out) is None and "reserved requests may not use the headroom)" in planner.last_reason
    soon = ask(VM, per_unit=4, on_demand=False, eviction_grace=GRACE, headroom_from=NOW + GRACE / 2)
    placement = planner.place(soon)
    assert placement is not None and placement.start == NOW + GRACE and placement.evictions


def test_who_may_use_the_headroom():
    """One rule for the planner and the create fast path (provisioning.services)."""
    assert uses_headroom(ask(VM), NOW, spot_in_headroom=False)
    spot = ask(VM, on_demand=False, preemptible=True)
    assert uses_headroom(spot, NOW, spot_in_headroom=True) and not uses_headroom(spot, NOW, spot_in_headroom=False)
    waits = ask(VM, on_demand=False, headroom_from=NOW + HOUR)
    assert not uses_headroom(waits, NOW, spot_in_headroom=True)
    assert uses_headroom(waits, NOW + HOUR, spot_in_headroom=True)
    assert not uses_headroom(ask(VM, on_demand=False), NOW + 1000 * HOUR, spot_in_headroom=True)


def test_the_headroom_is_counted_without_rounding_errors():
    """10 % of 30 GPUs is 3, not 3.0000000000000004: leaving exactly 3 free is allowed."""
    nodes = shared(3, gpus=10)
    occupy(*[g for n in nodes for g in n.gpus][:25])
    planner = Planner(snapshot(nodes), headroom=0.10, spot_in_headroom=True)
    assert planner.place(ask(VM, per_unit=2, on_demand=False)) is not None
    assert planner.place(ask(VM, per_unit=1, on_demand=False)) is None


#
# Spot work in the headroom, and on-demand work taking it back
#

def test_spot_work_may_take_the_headroom_gpus():
    nodes, _ = fleet()
    planner = Planner(snapshot(nodes), headroom=0.25, spot_in_headroom=True)
    placement = planner.place(ask(VM, per_unit=6, on_demand=False, preemptible=True))
    assert len(gpus_of(placement)) == 6 and not placement.evictions
    assert planner.capacity.free_at(GROUP, 0) == 0


def test_a_burst_of_on_demand_work_evicts_spot_work_in_the_headroom_after_the_grace_period():
    """
    Spot work holds the headroom below the burst's priority: the on-demand burst evicts it, softly,
    and never reserved or on-demand work.
    """
    nodes, gpus = fleet()
    spot = [occupy(*gpus[k:k + 2], spot=True, priority=0.2) for k in (10, 12, 14)]
    planner = Planner(snapshot(nodes), headroom=0.25, spot_in_headroom=True)
    evicted, placed = [], []
    for _ in range(3):
        placement = planner.place(ask(VM, per_unit=2, priority=0.5, eviction_grace=GRACE))
        assert placement.start == NOW + GRACE  # it waits for the grace period
        (eviction,) = placement.evictions
        assert eviction.at == NOW + GRACE and "priority 0.500 over 0.200" in eviction.reason
        evicted.append(eviction.victim_reservation_id)
        placed.append(placement)
    assert sorted(evicted) == sorted(spot)
    # What is left is reserved work and the burst itself: nothing more to evict.
    assert planner.place(ask(VM, per_unit=2, priority=0.99, eviction_grace=GRACE)) is None
    assert all(not set(gpus_of(p)) & {g.gpu_id for g in gpus[:10]} for p in placed)


def test_spot_work_that_outranks_the_on_demand_request_keeps_the_headroom():
    """
    Spot work that has come to rank above an on-demand request (it waited long) is not evicted for
    it, in the headroom or not: evicting it would send the work that waited longest back to wait.
    """
    nodes, gpus = fleet()
    occupy(*gpus[10:], spot=True, priority=0.9)
    planner = Planner(snapshot(nodes), headroom=0.25, spot_in_headroom=True)
    assert planner.place(ask(VM, per_unit=2, priority=0.5, eviction_grace=GRACE)) is None
    assert planner.place(ask(VM, per_unit=2, priority=0.95, eviction_grace=GRACE)).evictions


def test_on_demand_work_larger_than_the_headroom_evicts_only_lower_priority_spot_work():
    nodes, gpus = fleet(busy=8)
    occupy(*gpus[8:], spot=True, priority=0.9)
    planner = Planner(snapshot(nodes), headroom=0.25, spot_in_headroom=True)
    assert planner.place(ask(VM, per_unit=8, priority=0.5, eviction_grace=GRACE)) is None
    assert planner.place(ask(VM, per_unit=8, priority=0.95, eviction_grace=GRACE)).evictions


def test_reserved_work_evicts_only_lower_priority_spot_work_and_keeps_out_of_the_headroom():
    nodes, gpus = fleet(busy=8)
    low = occupy(*gpus[8:10], spot=True, priority=0.1)
    occupy(*gpus[10:], spot=True, priority=0.9)
    planner = Planner(snapshot(nodes), headroom=0.25, spot_in_headroom=True)
    assert planner.place(ask(VM, per_unit=4, priority=0.5, on_demand=False, eviction_grace=GRACE)) is None
    placement = planner.place(ask(VM, per_unit=2, priority=0.5, on_demand=False, eviction_grace=GRACE))
    assert [e.victim_reservation_id for e in placement.evictions] == [low]


def test_gpus_only_spot_work_holds_count_as_headroom_for_reserved_work():
    """
    With spot work in the headroom, what only spot work holds is on-demand work's for the taking:
    reserved work is kept out only by what would leave fewer free or spot-held GPUs than the headroom.
    """
    nodes, gpus = fleet(busy=8)
    occupy(*gpus[8:14], spot=True, priority=0.2)  # 2 free, 6 spot-held: 8 count as headroom, 4 are kept
    planner = Planner(snapshot(nodes), headroom=0.25, spot_in_headroom=True)
    assert planner.place(ask(VM, per_unit=2, on_demand=False, may_preempt=False)) is not None  # leaves 6
    assert planner.place(ask(VM, per_unit=2, on_demand=False, priority=0.5)).evictions  # leaves exactly 4
    assert planner.place(ask(VM, per_unit=1, on_demand=False, priority=0.5)) is None
    assert "free or held by spot work" in planner.last_reason and "kept for on-demand" in planner.last_reason
    # Counted as busy when spot work is kept out of the headroom: the first already takes it.
    kept_out = Planner(snapshot(nodes), headroom=0.25, spot_in_headroom=False)
    assert kept_out.place(ask(VM, per_unit=2, on_demand=False, may_preempt=False)) is None


def test_a_gpu_spot_work_shares_with_reserved_slots_is_not_headroom():
    nodes, gpus = fleet(busy=12)
    slot(gpus[12], 0, spot=True, priority=0.2)
    slot(gpus[12], 1)  # reserved beside it: on-demand work could not have the whole GPU back
    planner = Planner(snapshot(nodes), headroom=0.25, spot_in_headroom=True)
    assert planner.capacity.free_at(GROUP, 0) == 3
    assert planner.place(ask(VM, per_unit=1, on_demand=False, may_preempt=False)) is None  # 3 free, 4 kept


def test_spot_kept_out_of_the_headroom_is_not_evicted_to_give_it_back():
    nodes, gpus = fleet()
    occupy(*gpus[10:], spot=True, priority=0.9)
    planner = Planner(snapshot(nodes), headroom=0.25, spot_in_headroom=False)
    assert planner.place(ask(VM, per_unit=2, priority=0.5, eviction_grace=GRACE)) is None


#
# Fractional shares
#

def test_a_gpu_cut_into_slots_counts_by_its_free_share():
    nodes, gpus = fleet(busy=11)
    for k in range(3):
        slot(gpus[11], k)
    capacity = Capacity(snapshot(nodes), slot_shares=True)
    assert capacity.free_at(GROUP, 0) == 4 + 5 / 8  # 4 whole GPUs and 5/8 of the cut one
    assert Capacity(snapshot(nodes), slot_shares=False).free_at(GROUP, 0) == 4


def test_reserved_slots_on_a_cut_gpu_take_only_their_share_up_to_exactly_the_headroom():
    nodes, gpus = fleet(busy=11)
    for k in range(3):
        slot(gpus[11], k)
    planner = Planner(snapshot(nodes), headroom=0.25, spot_in_headroom=True, slot_shares=True)
    first = planner.place(ask(CONTAINER, units=1, per_unit=1, slots_per_gpu=8, on_demand=False))
    assert gpus_of(first) == {gpus[11].gpu_id} and planner.capacity.free_at(GROUP, 0) == 4.5
    assert planner.place(ask(CONTAINER, units=4, per_unit=1, slots_per_gpu=8, on_demand=False))
    assert planner.capacity.free_at(GROUP, 0) == 4  # the cut GPU is full: exactly the headroom is left
    # One more slot would cut a whole free GPU: 1/8 of the headroom.
    assert planner.place(ask(CONTAINER, units=1, per_unit=1, slots_per_gpu=8, on_demand=False)) is None
    assert "taking 0.12 would leave fewer than the 4 kept" in planner.last_reason
    assert planner.place(ask(CONTAINER, units=1, per_unit=1, slots_per_gpu=8, preemptible=True, on_demand=False))


def test_slots_on_cut_gpus_leave_room_for_reserved_whole_gpus_counted_by_share():
    """Two GPUs with one slot of 8 held each are 7/4 GPUs free, not none: a reserved GPU fits beside the headroom."""
    nodes, gpus = fleet()
    slot(gpus[10], 0)
    slot(gpus[11], 0)
    shares = Planner(snapshot(nodes), headroom=0.25, slot_shares=True)
    assert shares.place(ask(VM, per_unit=1, on_demand=False)) is not None
    whole = Planner(snapshot(nodes), headroom=0.25, slot_shares=False)
    assert whole.place(ask(VM, per_unit=1, on_demand=False)) is None


def test_an_on_demand_slot_evicts_a_spot_slot_holding_the_headroom():
    nodes, gpus = fleet(busy=15)
    victims = [slot(gpus[15], k, spot=True, priority=0.2) for k in range(8)]
    planner = Planner(snapshot(nodes), headroom=0.25, spot_in_headroom=True, slot_shares=True)
    placement = planner.place(ask(CONTAINER, units=2, per_unit=1, slots_per_gpu=8, eviction_grace=GRACE))
    assert len(placement.evictions) == 2 and {e.victim_reservation_id for e in placement.evictions} <= set(victims)


@pytest.mark.parametrize("shares, spot_free", [(True, False), (True, True), (False, True)])
@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["slot", "spot", "whole", "remove", "undo"]), st.integers(0, 3),
                          st.integers(0, 7), st.integers(-2, 8), st.integers(1, 6)), max_size=25))
def test_shares_kept_for_headroom_match_a_recount_after_any_change(shares, spot_free, changes):
    """The kept counts of shares in use stay what a count from scratch says, whatever changes."""
    nodes = shared(1, gpus=4)
    held = slot(nodes[0].gpus[0], 2, n=4, start=NOW - HOUR, end=NOW + 3 * HOUR)
    capacity = Capacity(snapshot(nodes), slot_shares=shares, spot_free=spot_free)
    gpus = [capacity.gpus[g.gpu_id] for g in nodes[0].gpus]
    instants = [capacity.ticks(NOW + k * HOUR) for k in range(10)]
    for t in instants:
        capacity.free_at(GROUP, t)
    for kind, k, slot_no, start_h, hours in changes:
        gpu = gpus[k]
        s = capacity.ticks(NOW + start_h * HOUR)
        e = s + hours * HOUR // TICK
        if kind in ("slot", "spot"):  # a spot slot is evictable work of the snapshot
            capacity.add(gpu, Entry(s, e, slot_no * MEM // 8, (slot_no + 1) * MEM // 8, uuid.uuid4(),
                                    victim_priority=0.2 if kind == "spot" else None))
        elif kind == "whole":
            capacity.reload(gpu, [Busy(held, NOW + start_h * HOUR, NOW + (start_h + hours) * HOUR, 0, MEM)])
        elif kind == "remove" and gpu.entries:
            capacity.remove_owner(gpu, gpu.entries[0].owner)
        elif kind == "undo" and capacity.journal:
            capacity.journal.pop()()
    for t in instants:
        assert capacity.free_at(GROUP, t) == len(gpus) - sum(used(g, t, shares, spot_free) for g in gpus) / SHARE_UNITS
