"""
The pure planner on small hand-made fleets: topology, best fit, slots, bursting, backfill,
headroom, preemption, the plan of a queue, and a property test that nothing is double-booked.
No database: snapshots are built by hand.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioning.scheduling.plan_types import (
    BARE_METAL,
    BARE_METAL_POOL,
    CONTAINER,
    SHARED_POOL,
    VM,
    Busy,
    GPUCapacity,
    NodeCapacity,
    Placement,
    Request,
    Snapshot,
)
from provisioning.scheduling.planner import Planner, plan
from provisioning.scheduling.planner.load import SHARE_UNITS, used

NOW = datetime(2025, 6, 2, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
MEM = 81920
H100 = uuid.UUID(int=100)
A100 = uuid.UUID(int=101)
FABRIC = uuid.UUID(int=7)
REGION = "us-east-1"


#
# Building fleets and requests by hand
#

def leaf(count: int, *, pod: int = 0, pool: str = BARE_METAL_POOL, region: str = REGION, model: uuid.UUID = H100,
         gpus: int = 8, fabric: uuid.UUID = FABRIC) -> list[NodeCapacity]:
    """``count`` nodes under one new leaf switch."""
    leaf_id = uuid.uuid4()
    return [
        NodeCapacity(uuid.uuid4(), region, fabric, leaf_id, pod, pool, model,
                     [GPUCapacity(uuid.uuid4(), i, MEM) for i in range(gpus)])
        for _ in range(count)
    ]


def shared(count: int, **kwargs) -> list[NodeCapacity]:
    return leaf(count, pool=SHARED_POOL, **kwargs)


def occupy(*targets, start: datetime = NOW - HOUR, end: datetime = NOW + 10 * HOUR, lo: int = 0, hi: int = MEM,
           spot: bool = False, priority: float = 0.5, rid: uuid.UUID | None = None) -> uuid.UUID:
    """Book GPUs (every GPU of a node given whole) for one reservation; its id."""
    rid = rid or uuid.uuid4()
    for target in targets:
        for gpu in target.gpus if isinstance(target, NodeCapacity) else [target]:
            gpu.busy.append(Busy(rid, start, end, lo, hi, preemptible=spot, priority=priority))
            gpu.busy.sort(key=lambda b: b.start)
    return rid


def ask(kind: str = BARE_METAL, units: int = 1, per_unit: int = 8, *, start: datetime = NOW, hours: float = 2,
        regions: tuple[str, ...] = (REGION,), models: tuple[uuid.UUID, ...] = (H100,), **kwargs) -> Request:
    return Request(reservation_id=kwargs.pop("reservation_id", uuid.uuid4()), kind=kind, gpu_model_ids=models,
                   regions=regions, units=units, gpus_per_unit=per_unit, start=start, end=start + hours * HOUR,
                   priority=kwargs.pop("priority", 0.5), **kwargs)


def snapshot(*groups: list[NodeCapacity]) -> Snapshot:
    return Snapshot(now=NOW, nodes=[n for group in groups for n in group])


def nodes_of(placement: Placement) -> set[uuid.UUID]:
    return {a.node_id for a in placement.assignments}


def gpus_of(placement: Placement) -> set[uuid.UUID]:
    return {a.gpu_id for a in placement.assignments}


def ids(nodes: list[NodeCapacity]) -> set[uuid.UUID]:
    return {n.node_id for n in nodes}


#
# Bare metal: topology
#

def test_gang_that_fits_one_leaf_goes_under_one_leaf():
    """Two 4-node leaves with 3 and 4 free nodes: 3 nodes go under the partly used leaf, 4 under the whole one."""
    partly, whole = leaf(4), leaf(4)
    occupy(partly[0])
    planner = Planner(snapshot(partly, whole))
    three = planner.place(ask(units=3))
    assert nodes_of(three) == ids(partly[1:]) and three.leaves == 1
    four = planner.place(ask(units=4))
    assert nodes_of(four) == ids(whole) and four.leaves == 1


def test_single_node_goes_to_the_fullest_leaf_so_whole_leaves_stay_free():
    a, b, c = leaf(4), leaf(4), leaf(4)
    occupy(*a[:2])
    occupy(*c[:3])
    placement = Planner(snapshot(a, b, c)).place(ask())
    assert nodes_of(placement) == {c[3].node_id}


def test_gang_takes_the_fewest_leaves_of_one_pod():
    """Pod 0 would need three leaves (2+2+2 free); pod 1 holds 6 nodes under two leaves (3+3)."""
    pod0 = [leaf(4, pod=0) for _ in range(3)]
    pod1 = [leaf(4, pod=1) for _ in range(2)]
    for group in pod0:
        occupy(*group[:2])
    for group in pod1:
        occupy(group[0])
    placement = Planner(snapshot(*pod0, *pod1)).place(ask(units=6))
    assert placement.leaves == 2
    assert nodes_of(placement) <= ids(pod1[0] + pod1[1])


def test_gang_too_big_for_any_pod_spans_the_fewest_pods():
    pods = [[leaf(2, pod=p) for _ in range(2)] for p in range(3)]  # 4 nodes per pod
    occupy(pods[2][0][0])  # pod 2 keeps 3 free
    placement = Planner(snapshot(*[group for pod in pods for group in pod])).place(ask(units=7))
    used = {n.node_id: p for p, pod in enumerate(pods) for group in pod for n in group}
    assert len({used[node] for node in nodes_of(placement)}) == 2
    assert len(nodes_of(placement)) == 7


def test_gang_never_spans_two_fabrics():
    one, other = leaf(2), leaf(2, fabric=uuid.uuid4())
    planner = Planner(snapshot(one, other))
    assert planner.place(ask(units=3)) is None
    assert "4 whole nodes free, at most 2 on one fabric" in planner.last_reason


def test_bare_metal_takes_every_gpu_of_whole_nodes_and_never_shares_one():
    nodes = leaf(2)
    planner = Planner(snapshot(nodes, shared(2)))
    first, second = planner.place(ask()), planner.place(ask())
    assert len(first.assignments) == 8 and all((a.mem_lo, a.mem_hi) == (0, MEM) for a in first.assignments)
    assert nodes_of(first) | nodes_of(second) == ids(nodes)
    assert nodes_of(first).isdisjoint(nodes_of(second))
    assert planner.place(ask()) is None  # shared hosts are never sold as bare metal


def test_bare_metal_never_takes_a_node_with_any_gpu_busy_in_the_window():
    later, slot, done = leaf(3)
    occupy(later.gpus[5], start=NOW + HOUR, end=NOW + 3 * HOUR)  # inside the window
    occupy(slot.gpus[0], lo=0, hi=MEM // 8)  # one slot of one GPU, now
    occupy(done.gpus[2], start=NOW - 3 * HOUR, end=NOW + 2 * HOUR)  # ends where the window starts
    planner = Planner(snapshot([later, slot, done]))
    placement = planner.place(ask(start=NOW + 2 * HOUR))
    assert nodes_of(placement) == {done.node_id}
    assert planner.place(ask(start=NOW + 2 * HOUR)) is None


#
# VMs and containers
#

def test_vm_best_fit_keeps_whole_nodes_free():
    """Free GPUs 8, 3 and 2: a 2-GPU VM takes the 2, a 3-GPU VM the 3, and an 8-GPU VM still fits."""
    whole, three, two = shared(3)
    occupy(*three.gpus[:5])
    occupy(*two.gpus[:6])
    planner = Planner(snapshot([whole, three, two]))
    assert nodes_of(planner.place(ask(VM, per_unit=2))) == {two.node_id}
    assert nodes_of(planner.place(ask(VM, per_unit=3))) == {three.node_id}
    assert nodes_of(planner.place(ask(VM, per_unit=8))) == {whole.node_id}


def test_each_vm_unit_is_on_one_node():
    nodes = shared(3)
    occupy(*nodes[0].gpus[:5])
    placement = Planner(snapshot(nodes)).place(ask(VM, units=3, per_unit=4))
    per_node: dict[uuid.UUID, int] = {}
    for a in placement.assignments:
        per_node[a.node_id] = per_node.get(a.node_id, 0) + 1
    assert len(gpus_of(placement)) == 12 and all(count % 4 == 0 for count in per_node.values())


def test_vms_never_land_on_bare_metal_nodes():
    planner = Planner(snapshot(leaf(2)))
    assert planner.place(ask(VM, per_unit=1)) is None
    assert "no shared nodes" in planner.last_reason


def test_fractional_slots_pack_onto_a_gpu_already_cut_the_same_way():
    fresh, cut = shared(2)
    occupy(cut.gpus[3], lo=0, hi=MEM // 4)
    occupy(cut.gpus[3], lo=MEM // 4, hi=MEM // 2)
    placement = Planner(snapshot([fresh, cut])).place(ask(CONTAINER, units=2, per_unit=1, slots_per_gpu=4))
    assert gpus_of(placement) == {cut.gpus[3].gpu_id}
    assert sorted((a.mem_lo, a.mem_hi) for a in placement.assignments) == [(MEM // 2, 3 * MEM // 4),
                                                                           (3 * MEM // 4, MEM)]


def test_fractional_starts_a_new_gpu_on_the_node_with_fewest_free_gpus():
    roomy, tight = shared(2)
    occupy(*tight.gpus[:7])
    placement = Planner(snapshot([roomy, tight])).place(ask(CONTAINER, units=3, per_unit=1, slots_per_gpu=8))
    assert gpus_of(placement) == {tight.gpus[7].gpu_id}


def test_fractional_slots_never_overlap_in_memory():
    node = shared(1, gpus=2)[0]
    occupy(node.gpus[0])  # whole GPU 0 is taken
    planner = Planner(snapshot([node]))
    placements = [planner.place(ask(CONTAINER, units=1, per_unit=1, slots_per_gpu=4)) for _ in range(5)]
    placed = [p for p in placements if p is not None]
    assert len(placed) == 4 and placements[4] is None
    ranges = sorted((a.mem_lo, a.mem_hi) for p in placed for a in p.assignments)
    assert {a.gpu_id for p in placed for a in p.assignments} == {node.gpus[1].gpu_id}
    assert all(hi <= lo for (_, hi), (lo, _) in zip(ranges, ranges[1:], strict=False))


def test_fractional_slots_never_overlap_a_gpu_cut_another_way():
    """Halves asked of a GPU whose second quarter and second half are taken: neither half is free."""
    node = shared(1, gpus=1)[0]
    occupy(node.gpus[0], lo=MEM // 4, hi=MEM // 2)
    occupy(node.gpus[0], lo=MEM // 2, hi=MEM)
    planner = Planner(snapshot([node]))
    assert planner.place(ask(CONTAINER, units=1, per_unit=1, slots_per_gpu=2)) is None


#
# Regions and models
#

def test_a_full_region_bursts_into_the_next_in_the_requests_order():
    east, west = leaf(1, region="us-east-1"), leaf(1, region="eu-west-1")
    occupy(east[0])
    planner = Planner(snapshot(east, west))
    assert planner.place(ask(regions=("us-east-1", "eu-west-1"))).region == "eu-west-1"


def test_the_first_region_wins_when_it_has_room():
    east, west = leaf(1, region="us-east-1"), leaf(1, region="eu-west-1")
    placement = Planner(snapshot(east, west)).place(ask(regions=("us-east-1", "eu-west-1")))
    assert placement.region == "us-east-1"


def test_gpu_models_are_tried_in_the_requests_order():
    h100, a100 = leaf(1, model=H100), leaf(1, model=A100)
    planner = Planner(snapshot(h100, a100))
    assert nodes_of(planner.place(ask(models=(A100, H100)))) == ids(a100)
    assert nodes_of(planner.place(ask(models=(A100, H100)))) == ids(h100)


#
# Advance reservations and backfill
#

def test_short_work_is_backfilled_before_a_held_window_only_when_it_ends_first():
    node = leaf(1)
    occupy(node[0], start=NOW + 4 * HOUR, end=NOW + 8 * HOUR)
    planner = Planner(snapshot(node))
    assert planner.place(ask(hours=5)) is None
    assert planner.place(ask(hours=4)) is not None  # ends exactly when the held window starts


def test_long_work_goes_elsewhere_rather_than_into_a_held_window():
    held_node, other = leaf(2)
    occupy(held_node, start=NOW + 4 * HOUR, end=NOW + 8 * HOUR)
    planner = Planner(snapshot([held_node, other]))
    assert nodes_of(planner.place(ask(hours=6))) == {other.node_id}
    assert nodes_of(planner.place(ask(hours=3))) == {held_node.node_id}


def test_backfill_never_delays_a_held_window():
    """An advance reservation is booked first; the work queued behind it fits around it or waits."""
    nodes = leaf(2)
    held = ask(units=2, start=NOW + 3 * HOUR, hours=4, priority=0.9)
    short, long = ask(units=2, hours=3), ask(units=2, hours=4)
    result = plan(snapshot(nodes), [held, short, long])
    by_id = {p.reservation_id: p for p in result.placements}
    assert by_id[held.reservation_id].start == NOW + 3 * HOUR
    assert by_id[short.reservation_id].end <= by_id[held.reservation_id].start
    assert long.reservation_id in result.unplaced


#
# Headroom
#

def headroom_fleet() -> Snapshot:
    """Two shared nodes, 16 GPUs, 10 busy: 6 free, and a 25 % headroom keeps 4."""
    nodes = shared(2)
    occupy(*nodes[0].gpus, *nodes[1].gpus[:2])
    return snapshot(nodes)


def test_headroom_blocks_reserved_work_that_would_dig_into_it():
    planner = Planner(headroom_fleet(), headroom=0.25)
    assert planner.place(ask(VM, per_unit=3, on_demand=False)) is None
    assert "kept for on-demand" in planner.last_reason
    assert planner.place(ask(VM, per_unit=2, on_demand=False)) is not None


def test_spot_work_may_use_the_headroom_unless_kept_out_of_it():
    """With the setting on, spot work is evicted to give the headroom back (test_headroom.py), not kept out."""
    taken = Planner(headroom_fleet(), headroom=0.25, spot_in_headroom=True)
    assert taken.place(ask(VM, per_unit=3, on_demand=False, preemptible=True))
    kept_out = Planner(headroom_fleet(), headroom=0.25, spot_in_headroom=False)
    assert kept_out.place(ask(VM, per_unit=3, on_demand=False, preemptible=True)) is None


def test_on_demand_work_may_use_the_headroom():
    planner = Planner(headroom_fleet(), headroom=0.25)
    assert len(gpus_of(planner.place(ask(VM, per_unit=6)))) == 6


#
# Preemption
#

def test_preemption_evicts_the_fewest_victims():
    """One spot reservation of 4 GPUs beats two of 2 GPUs, even of lower priority."""
    node = shared(1)[0]
    big = occupy(*node.gpus[:4], spot=True, priority=0.3)
    occupy(*node.gpus[4:6], spot=True, priority=0.1)
    occupy(*node.gpus[6:], spot=True, priority=0.1)
    placement = Planner(snapshot([node])).place(ask(VM, per_unit=4, priority=0.9))
    assert [e.victim_reservation_id for e in placement.evictions] == [big]
    assert gpus_of(placement) == {g.gpu_id for g in node.gpus[:4]}


def test_preemption_evicts_the_lowest_priority_among_equally_few():
    node = shared(1)[0]
    occupy(*node.gpus[:4], spot=True, priority=0.3)
    cheap = occupy(*node.gpus[4:], spot=True, priority=0.1)
    placement = Planner(snapshot([node])).place(ask(VM, per_unit=4, priority=0.9))
    assert [e.victim_reservation_id for e in placement.evictions] == [cheap]


def test_preemption_never_evicts_non_spot_or_equal_or_higher_priority_work():
    node = shared(1)[0]
    occupy(*node.gpus[:4], priority=0.1)  # not spot
    occupy(*node.gpus[4:6], spot=True, priority=0.9)  # higher
    occupy(*node.gpus[6:], spot=True, priority=0.5)  # equal
    planner = Planner(snapshot([node]))
    assert planner.place(ask(VM, per_unit=1, priority=0.5)) is None
    assert "no spot work of lower priority" in planner.last_reason


def test_preemption_never_evicts_higher_priority_work_beside_an_eligible_victim():
    node = shared(1)[0]
    occupy(*node.gpus[:4], spot=True, priority=0.1)
    occupy(*node.gpus[4:], spot=True, priority=0.9)
    planner = Planner(snapshot([node]))
    assert planner.place(ask(VM, per_unit=8, priority=0.5)) is None
    assert len(planner.place(ask(VM, per_unit=4, priority=0.5)).evictions) == 1


def test_a_spot_request_never_preempts():
    node = shared(1)[0]
    occupy(node, spot=True, priority=0.1)
    planner = Planner(snapshot([node]))
    assert planner.place(ask(VM, per_unit=1, priority=0.9, preemptible=True, on_demand=False)) is None
    assert planner.place(ask(VM, per_unit=1, priority=0.9, may_preempt=False)) is None


def test_hard_eviction_ends_the_victim_now():
    node = shared(1)[0]
    victim = occupy(node, spot=True, priority=0.1)
    placement = Planner(snapshot([node])).place(ask(VM, per_unit=8, priority=0.9))
    (eviction,) = placement.evictions
    assert (eviction.victim_reservation_id, eviction.at, placement.start) == (victim, NOW, NOW)
    assert eviction.by_reservation_id == placement.reservation_id and eviction.reason


def test_soft_eviction_moves_the_start_by_the_grace_period():
    node = shared(1)[0]
    occupy(node, spot=True, priority=0.1)
    grace = timedelta(minutes=10)
    placement = Planner(snapshot([node])).place(ask(VM, per_unit=8, hours=2, priority=0.9, eviction_grace=grace))
    assert placement.evictions[0].at == NOW + grace
    assert (placement.start, placement.end) == (NOW + grace, NOW + grace + 2 * HOUR)


def test_eviction_for_a_later_window_lets_the_victim_run_until_it_starts():
    node = shared(1)[0]
    occupy(node, spot=True, priority=0.1)
    placement = Planner(snapshot([node])).place(ask(VM, per_unit=8, start=NOW + 3 * HOUR, priority=0.9))
    assert placement.evictions[0].at == placement.start == NOW + 3 * HOUR


def test_evicting_a_reservation_frees_all_its_gpus():
    one, two = shared(2)
    occupy(one, two, spot=True, priority=0.1)
    planner = Planner(snapshot([one, two]))
    assert len(planner.place(ask(VM, per_unit=8, priority=0.9)).evictions) == 1
    assert planner.place(ask(VM, per_unit=8, may_preempt=False)) is not None


def test_gang_preemption_evicts_the_fewest_reservations():
    nodes = leaf(4)
    pair = occupy(*nodes[:2], spot=True, priority=0.3)
    occupy(nodes[2], spot=True, priority=0.1)
    occupy(nodes[3], spot=True, priority=0.1)
    placement = Planner(snapshot(nodes)).place(ask(units=2, priority=0.9))
    assert [e.victim_reservation_id for e in placement.evictions] == [pair]
    assert nodes_of(placement) == ids(nodes[:2])


#
# The plan of a queue
#

def test_plan_places_in_queue_order_and_says_why_the_rest_wait():
    nodes = leaf(2)
    first, too_big, second, third = ask(), ask(units=3), ask(), ask()
    result = plan(snapshot(nodes), [first, too_big, second, third])
    assert [p.reservation_id for p in result.placements] == [first.reservation_id, second.reservation_id]
    assert set(result.unplaced) == {too_big.reservation_id, third.reservation_id}
    assert all(reason.startswith("needs ") for reason in result.unplaced.values())


def test_plan_stops_after_max_placements_and_leaves_the_rest_untried():
    nodes = leaf(4)
    first, too_big, second, third = ask(), ask(units=5), ask(), ask()
    result = plan(snapshot(nodes), [first, too_big, second, third], max_placements=2)
    assert [p.reservation_id for p in result.placements] == [first.reservation_id, second.reservation_id]
    # The one tried says why it waits; the one after the cap was not tried (next cycle's work).
    assert set(result.unplaced) == {too_big.reservation_id}


def test_why_not_names_the_shortfall_model_region_and_time():
    nodes = leaf(8)
    for node in nodes[:3]:
        occupy(node, end=NOW + 5 * HOUR)
    planner = Planner(snapshot(nodes), model_names={H100: "H100"})
    request = ask(units=8, hours=1)
    assert planner.place(request) is None
    assert planner.why_not(request) == (
        "needs 8 whole nodes (64 GPUs) from now to 10:00; H100 in us-east-1: 5 whole nodes free until 14:00, "
        "at most 5 under one leaf; no spot work of lower priority to evict makes room"
    )


def test_why_not_of_a_request_never_tried_changes_nothing():
    nodes = leaf(1)
    planner = Planner(snapshot(nodes))
    assert planner.why_not(ask()) == "it fits now"
    assert planner.place(ask()) is not None


def test_a_reservation_is_never_placed_twice():
    planner = Planner(snapshot(leaf(2)))
    request = ask()
    assert planner.place(request) is not None
    assert planner.place(request) is None and planner.last_reason == "it is placed already"


def test_a_released_placement_frees_its_gpus():
    planner = Planner(snapshot(leaf(1)))
    planner.release(planner.place(ask()))
    assert planner.place(ask()) is not None


def test_a_window_that_began_earlier_starts_now_keeping_its_length():
    placement = Planner(snapshot(leaf(1))).place(ask(start=NOW - HOUR, hours=3))
    assert (placement.start, placement.end) == (NOW, NOW + 3 * HOUR)


def test_a_window_that_has_ended_is_refused_with_a_reason():
    planner = Planner(snapshot(leaf(1)))
    assert planner.place(ask(start=NOW - 3 * HOUR, hours=2)) is None
    assert planner.last_reason == "its window has already ended"


def test_a_window_that_ends_before_it_starts_is_refused_with_a_reason():
    planner = Planner(snapshot(leaf(1)))
    assert planner.place(ask(hours=-1)) is None
    assert planner.last_reason == "its window ends before it starts"


#
# Property: nothing is ever double-booked
#

@st.composite
def scenarios(draw):
    regions = ["r1", "r2"][: draw(st.integers(1, 2))]
    nodes: list[NodeCapacity] = []
    for region in regions:
        for pool in (BARE_METAL_POOL, SHARED_POOL):
            for number in range(draw(st.integers(0, 3))):
                nodes += leaf(draw(st.integers(1, 3)), pod=number // 2, pool=pool, region=region,
                              model=draw(st.sampled_from([H100, A100])), gpus=draw(st.sampled_from([2, 4])))
    for node in nodes:  # crowd most nodes with spot work, so that requests must evict
        if draw(st.integers(0, 2)):
            occupy(node, end=NOW + draw(st.integers(1, 10)) * HOUR / 2, spot=True, priority=draw(st.floats(0, 0.6)))
    gpus = [g for n in nodes for g in n.gpus]
    if gpus:
        for _ in range(draw(st.integers(0, 16))):  # reservations of one to four GPUs, maybe on several nodes
            held = draw(st.lists(st.sampled_from(gpus), min_size=1, max_size=4, unique_by=id))
            start = NOW + draw(st.integers(-4, 8)) * HOUR / 2
            end = start + draw(st.integers(1, 8)) * HOUR / 2
            n = draw(st.sampled_from([1, 1, 2, 4]))
            k = draw(st.integers(0, n - 1))
            lo, hi = k * MEM // n, (k + 1) * MEM // n
            if not any(b.start < end and start < b.end and b.mem_lo < hi and lo < b.mem_hi
                       for gpu in held for b in gpu.busy):
                spot = draw(st.booleans())
                occupy(*held, start=start, end=end, lo=lo, hi=hi, spot=spot,
                       priority=draw(st.floats(0, 0.6) if spot else st.floats(0, 1)))
    requests = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from([BARE_METAL, VM, CONTAINER]))
        slots = draw(st.sampled_from([1, 2, 4])) if kind == CONTAINER else 1
        sizes = [2, 4] if kind == BARE_METAL else [1, 2, 4] if slots == 1 else [1]  # bare metal: whole nodes
        requests.append(ask(
            kind, units=draw(st.integers(1, 3)), per_unit=draw(st.sampled_from(sizes)),
            start=NOW + draw(st.integers(-1, 8)) * HOUR / 2, hours=draw(st.integers(1, 6)) / 2,
            regions=tuple(draw(st.permutations(regions))), models=tuple(draw(st.permutations([H100, A100]))),
            slots_per_gpu=slots, priority=draw(st.floats(0, 1)), preemptible=draw(st.booleans()),
            on_demand=draw(st.booleans()), may_preempt=draw(st.booleans()),
            headroom_from=draw(st.sampled_from([None, NOW, NOW + HOUR])),
            eviction_grace=draw(st.sampled_from([timedelta(0), timedelta(minutes=30)])),
        ))
    return snapshot(nodes), requests


def assert_evictions_allowed(snap: Snapshot, placement: Placement, request: Request) -> None:
    """
    Only spot work is evicted, and only by a request that may preempt and is not spot: spot work of
    lower priority, whatever the headroom.
    """
    for eviction in placement.evictions:
        victim = [b for n in snap.nodes for g in n.gpus for b in g.busy
                  if b.reservation_id == eviction.victim_reservation_id]
        assert victim and all(b.preemptible and b.priority < request.priority for b in victim)
        assert request.may_preempt and not request.preemptible


def assert_whole_shape(snap: Snapshot, placement: Placement, request: Request) -> None:
    """Exactly units x gpus_per_unit whole GPUs (bare metal: every GPU of its nodes), or units slots."""
    gpu_node = {g.gpu_id: n for n in snap.nodes for g in n.gpus}
    nodes = {gpu_node[a.gpu_id].node_id: gpu_node[a.gpu_id] for a in placement.assignments}.values()
    assert placement.region in request.regions and placement.start >= NOW
    assert placement.end - placement.start == request.end - request.start
    assert all(n.region == placement.region and n.gpu_model_id in request.gpu_model_ids for n in nodes)
    if request.slots_per_gpu > 1:
        slot = MEM // request.slots_per_gpu
        assert len(placement.assignments) == request.units
        assert all(a.mem_hi - a.mem_lo in (slot, slot + 1) for a in placement.assignments)
    else:
        assert len(placement.assignments) == len(gpus_of(placement)) == request.units * request.gpus_per_unit
        assert all((a.mem_lo, a.mem_hi) == (0, MEM) for a in placement.assignments)
    if request.kind == BARE_METAL:
        assert all(n.pool == BARE_METAL_POOL for n in nodes)
        assert gpus_of(placement) == {g.gpu_id for n in nodes for g in n.gpus}
    else:
        assert all(n.pool == SHARED_POOL for n in nodes)


def bookings_after(snap: Snapshot, placements: list[Placement]) -> dict[uuid.UUID, list[tuple]]:
    """Every GPU's (start, end, mem_lo, mem_hi) from now on: the snapshot's, cut short by evictions, and the plan's."""
    ended: dict[uuid.UUID, datetime] = {}
    for p in placements:
        for e in p.evictions:
            ended[e.victim_reservation_id] = min(e.at, ended.get(e.victim_reservation_id, e.at))
    bookings: dict[uuid.UUID, list[tuple]] = {}
    for n in snap.nodes:
        for g in n.gpus:
            for b in g.busy:
                end = min(b.end, ended.get(b.reservation_id, b.end))
                if end > b.start and end > NOW:
                    bookings.setdefault(g.gpu_id, []).append((b.start, end, b.mem_lo, b.mem_hi))
    for p in placements:
        for a in p.assignments:
            bookings.setdefault(a.gpu_id, []).append((p.start, p.end, a.mem_lo, a.mem_hi))
    return bookings


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_no_gpu_memory_is_ever_booked_twice_and_every_placement_is_whole(scenario):
    snap, requests = scenario
    result = plan(snap, requests)
    asked = {r.reservation_id: r for r in requests}
    assert len(result.placements) + len(result.unplaced) == len(requests)
    assert all(result.unplaced.values())
    for p in result.placements:
        assert_evictions_allowed(snap, p, asked[p.reservation_id])
        assert_whole_shape(snap, p, asked[p.reservation_id])
    for booked in bookings_after(snap, result.placements).values():
        for i, (s1, e1, lo1, hi1) in enumerate(booked):
            for s2, e2, lo2, hi2 in booked[i + 1:]:
                assert not (s1 < e2 and s2 < e1 and lo1 < hi2 and lo2 < hi1)


def test_a_plan_leaves_its_index_to_be_freed_without_the_cyclic_collector():
    """
    The scheduler pauses the collector in a cycle: the planner's index must not need it afterwards.
    Only the index's own objects are looked for among what the collector finds, so garbage another
    thread of the test process makes meanwhile does not count.
    """
    import gc

    from provisioning.scheduling.planner.state import Capacity, GpuState, Leaf, NodeState, Pool

    fleet = snapshot(leaf(4), shared(4))
    occupy(fleet.nodes[0], spot=True)
    occupy(fleet.nodes[5].gpus[0], hi=MEM // 2)
    requests = [ask(), ask(kind=VM, per_unit=2), ask(kind=CONTAINER, per_unit=1, slots_per_gpu=2),
                ask(kind=CONTAINER, per_unit=1, slots_per_gpu=4, share_class="realtime"),
                ask(units=2, priority=0.9, may_preempt=True)]
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        result = plan(fleet, requests)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, (Capacity, Pool, Leaf, NodeState, GpuState))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert result.placements and left == []


@pytest.mark.parametrize("spot_free", [False, True])
@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "spot", "reload", "remove", "evict", "undo"]), st.integers(0, 7),
                          st.integers(-3, 12), st.integers(1, 8)), max_size=25))
def test_busy_counts_kept_for_headroom_match_a_recount_after_any_change(spot_free, changes):
    """
    The index keeps, per region, model and pool, how many GPUs are busy at the instants headroom
    asks about; a change counts again only instants inside an allocation that came or went.
    """
    from provisioning.scheduling.planner.state import TICK, Capacity, Entry

    fleet = snapshot(shared(2, gpus=4))
    held = occupy(fleet.nodes[0].gpus[0], fleet.nodes[1].gpus[2], start=NOW - HOUR, end=NOW + 3 * HOUR)
    capacity = Capacity(fleet, spot_free=spot_free)  # spot_free: what only spot work holds counts free
    group = (REGION, H100, SHARED_POOL)
    gpus = [capacity.gpus[g.gpu_id] for n in fleet.nodes for g in n.gpus]
    instants = [capacity.ticks(NOW + k * HOUR) for k in range(12)]
    for t in instants:
        capacity.free_at(group, t)  # asked once: counted and kept from now on
    for kind, k, start_h, hours in changes:
        gpu = gpus[k]
        s = capacity.ticks(NOW + start_h * HOUR)
        if kind == "add":
            capacity.add(gpu, Entry(s, s + hours * HOUR // TICK, 0, MEM, uuid.uuid4()))
        elif kind == "reload":
            capacity.reload(gpu, [Busy(held, NOW + start_h * HOUR, NOW + (start_h + hours) * HOUR, 0, MEM)])
        elif kind == "spot":  # spot work read from the database: a victim
            capacity.reload(gpu, [Busy(uuid.uuid4(), NOW + start_h * HOUR, NOW + (start_h + hours) * HOUR, 0, MEM,
                                       preemptible=True, priority=0.2)])
        elif kind == "evict" and capacity.victim_priority:
            capacity.evict(next(iter(capacity.victim_priority)), capacity.ticks(NOW + start_h * HOUR))
        elif kind == "remove" and gpu.entries:
            capacity.remove_owner(gpu, gpu.entries[0].owner)
        elif kind == "undo" and capacity.journal:
            capacity.journal.pop()()
    for t in instants:
        busy = sum(used(g, t, False, spot_free) for g in gpus) / SHARE_UNITS
        assert capacity.free_at(group, t) == len(gpus) - busy
    # The nodes filed by their GPUs free now (a best fit without a scan) are filed right.
    pool = capacity.pools[group][0]
    filed = {node: count for count, nodes in pool.free_nodes.items() for node in nodes}
    assert filed == {node: node.clean + node.ahead for node in pool.nodes}
