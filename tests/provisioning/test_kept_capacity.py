"""
The scheduler loop's kept planning index (provisioning.scheduling.kept_capacity) answers as an index built
afresh would: after placements, releases, deletions, spot work and allocations that ended on
their own between cycles, after what a plan wrote without committing, and across a moved "now"
(a later cycle plans and evicts from its own now, not from the build's).
"""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from cloud.models import GPU, Node
from provisioning.choices import OperationKind, OperationState
from provisioning.models import Allocation, Operation, Reservation
from provisioning.scheduling.fleet_shape import FleetShape
from provisioning.scheduling.kept_capacity import AHEAD, KeptCapacity
from provisioning.scheduling.plan_types import VM, Busy, GPUCapacity, NodeCapacity, Request, Snapshot
from provisioning.scheduling.planner import Planner, plan
from provisioning.scheduling.planner.state import Capacity
from tests.provisioning.test_loop_memory import hold, sellable_nodes
from tests.world import h100, small_fleet


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(8)


def index_view(capacity: Capacity) -> dict:
    """What an index says from its origin on, in absolute times: per GPU its work, and who may be evicted."""
    now = capacity.origin
    gpus = {}
    for gpu_id, gpu in capacity.gpus.items():
        gpus[gpu_id] = sorted((capacity.time(max(x.start, now)), capacity.time(x.end), x.lo, x.hi, x.owner,
                               x.victim_priority) for x in gpu.entries if x.end > now)
    held = {owner: {g.gpu_id for g in gpus_held} for owner, gpus_held in capacity.holdings.items() if gpus_held}
    pools = {(p.region, p.model, p.kind, p.fabric): {v: n for v, n in p.victims.items() if n}
             for pools in capacity.pools.values() for p in pools}
    shape = {(group, p.fabric): (p.max_size, sorted(str(n.node_id) for n in p.nodes),
                                 {str(leaf.leaf_id): sorted(str(n.node_id) for n in leaf.nodes) for leaf in p.leaves},
                                 sorted(map(str, p.pods)), {n: len(g) for n, g in p.layout_gpus.items() if g})
             for group, pools_of in capacity.pools.items() for p in pools_of}
    return {"gpus": gpus, "victims": {v: p for v, p in capacity.victim_priority.items() if v in held},
            "held": held, "pools": pools, "shape": shape,
            "group_gpus": {group: n for group, n in capacity.group_gpus.items() if n}}


def fresh_index(now) -> Capacity:
    """The index a cycle at ``now`` would build from nothing."""
    return Capacity(FleetShape().snapshot(now=now, until=now + AHEAD))


def test_the_kept_index_catches_up_with_what_changed_between_cycles(world, fleet):
    now = timezone.now()
    nodes = sellable_nodes()
    spot = hold(world, nodes[0].gpus.all()[:2], start=now - timedelta(hours=1), end=now + timedelta(hours=2),
                term="spot", score=0.2)
    released = hold(world, nodes[1].gpus.all()[:1], start=now - timedelta(hours=1), end=now + timedelta(hours=3))
    gone = hold(world, nodes[2].gpus.all()[:4], start=now + timedelta(hours=1), end=now + timedelta(hours=2))
    ending = hold(world, nodes[3].gpus.all()[:1], start=now - timedelta(hours=1), end=now + timedelta(minutes=1))
    kept = KeptCapacity(FleetShape(refresh_s=3600), rebuild_s=3600, rebuild_share=1)
    assert index_view(kept.for_cycle(now)) == index_view(fresh_index(now))

    later = now + timedelta(minutes=2)  # ``ending`` ended on its own meanwhile
    Allocation.objects.filter(reservation=released).update(ends_at=later)  # released early
    Allocation.objects.filter(reservation=gone).delete()
    new_spot = hold(world, nodes[4].gpus.all()[:8], start=later, end=later + timedelta(hours=1), term="spot",
                    score=0.1)
    hold(world, nodes[0].gpus.all()[2:3], start=later, end=later + timedelta(hours=1))
    capacity = kept.for_cycle(later)
    assert capacity.origin == capacity.ticks(later)
    assert index_view(capacity) == index_view(fresh_index(later))
    assert kept.rebuilds == 1  # caught up, not built again ...
    assert kept.caught_up == 5  # ... by reading the five nodes that changed
    assert set(capacity.victim_priority) >= {spot.pk, new_spot.pk}
    assert not any(x.owner == ending.pk for g in capacity.gpus.values() for x in g.entries)


def test_what_a_plan_wrote_is_read_again_from_the_database(world, fleet):
    """A plan's placements that never committed (refused, lost) leave the next cycle's index."""
    now = timezone.now()
    kept = KeptCapacity(FleetShape(refresh_s=3600), rebuild_s=3600, rebuild_share=1)
    capacity = kept.for_cycle(now)
    model = h100().pk
    asked = [Request(reservation_id=uuid.uuid4(), kind=VM, gpu_model_ids=(model,), regions=("us-east-1",), units=1,
                     gpus_per_unit=2, start=now, end=now + timedelta(hours=1), priority=0.5) for _ in range(3)]
    result = plan(None, asked, headroom=0, capacity=capacity)
    assert len(result.placements) == 3
    assert capacity.touched  # the plan's writes are tracked ...
    later = now + timedelta(seconds=1)
    assert index_view(kept.for_cycle(later)) == index_view(fresh_index(later))  # ... and undone by the database
    assert kept.caught_up == len({a.node_id for p in result.placements for a in p.assignments})


def test_nodes_and_gpus_that_stop_or_start_taking_work_leave_and_rejoin_the_kept_index(world, fleet):
    """Out of service, under attestation, a quarantined GPU: caught up node by node, as a fresh build sees it."""
    now = timezone.now()
    nodes = sellable_nodes()
    spot = hold(world, nodes[0].gpus.all()[:2], start=now, end=now + timedelta(hours=2), term="spot", score=0.2)
    kept = KeptCapacity(FleetShape(refresh_s=3600), rebuild_s=3600, rebuild_share=1)
    kept.for_cycle(now)
    Node.objects.filter(pk=nodes[0].pk).update(state="maintenance")  # the spot holder's node
    Operation.objects.create(node=nodes[1], kind=OperationKind.ATTEST, state=OperationState.RUNNING)
    GPU.objects.filter(pk=nodes[2].gpus.first().pk).update(state="quarantined")
    capacity = kept.for_cycle(now)
    assert index_view(capacity) == index_view(fresh_index(now))
    assert {nodes[0].pk, nodes[1].pk}.isdisjoint(kept.nodes) and spot.pk not in capacity.victim_priority
    assert len(kept.nodes[nodes[2].pk].gpus) == nodes[2].gpus.count() - 1

    Node.objects.filter(pk=nodes[0].pk).update(state="available")
    Operation.objects.filter(node=nodes[1]).update(state=OperationState.SUCCEEDED)
    GPU.objects.filter(pk=nodes[2].gpus.first().pk).update(state="available")
    later = now + timedelta(seconds=1)
    capacity = kept.for_cycle(later)
    assert index_view(capacity) == index_view(fresh_index(later))
    assert spot.pk in capacity.victim_priority
    assert kept.rebuilds == 1  # all of it caught up, node by node
    placed = plan(None, [Request(reservation_id=uuid.uuid4(), kind=VM, gpu_model_ids=(h100().pk,),
                                 regions=("us-east-1",), units=1, gpus_per_unit=8, start=later,
                                 end=later + timedelta(hours=1), priority=0.5)], headroom=0, capacity=capacity)
    assert placed.placements  # a whole host free again is found


def test_the_index_is_built_again_when_it_is_old(world, fleet):
    now = timezone.now()
    kept = KeptCapacity(FleetShape(refresh_s=3600), rebuild_s=3600)
    kept.for_cycle(now)
    kept.for_cycle(now)
    assert kept.rebuilds == 1
    kept.rebuild_s = 0
    kept.for_cycle(now)
    assert kept.rebuilds == 2


def test_a_kept_index_plans_and_evicts_from_its_own_now():
    """Windows that began before the moved now start at it; a hard eviction ends the victim then, not at the build."""
    built = timezone.now()
    later = built + timedelta(minutes=10)
    victim, model = uuid.uuid4(), uuid.uuid4()
    busy = [Busy(victim, built - timedelta(hours=1), built + timedelta(hours=5), 0, 80, True, 0.1)]
    node = NodeCapacity(uuid.uuid4(), "r", uuid.uuid4(), uuid.uuid4(), 0, "shared", model,
                        [GPUCapacity(uuid.uuid4(), i, 80, list(busy)) for i in range(2)])
    capacity = Capacity(Snapshot(now=built, nodes=[node]))
    capacity.advance(later)
    placement = Planner(capacity=capacity, headroom=0).place(Request(
        reservation_id=uuid.uuid4(), kind=VM, gpu_model_ids=(model,), regions=("r",), units=1, gpus_per_unit=2,
        start=built, end=built + timedelta(hours=1), priority=0.9))
    assert placement is not None
    assert (placement.start, placement.end) == (later, later + timedelta(hours=1))
    assert [e.at for e in placement.evictions] == [later]
    assert "at once" in placement.evictions[0].reason
    assert all(x.end == capacity.ticks(later) for g in capacity.gpus.values() for x in g.entries
               if x.owner == victim)


def two_gpu_node(model, busy=()):
    return NodeCapacity(uuid.uuid4(), "r", uuid.uuid4(), uuid.uuid4(), 0, "shared", model,
                        [GPUCapacity(uuid.uuid4(), i, 80, list(busy)) for i in range(2)])


def test_a_kept_index_says_when_work_placed_after_its_build_frees_up():
    """Work that starts at the moved now is busy now, and the waiting reason names its end."""
    built = timezone.now().replace(hour=9, minute=0, second=0, microsecond=0)
    later = built + timedelta(minutes=10)
    model = uuid.uuid4()
    long = Busy(uuid.uuid4(), built - timedelta(hours=1), built + timedelta(hours=5), 0, 80)
    node = two_gpu_node(model)
    node.gpus[0].busy.append(long)
    capacity = Capacity(Snapshot(now=built, nodes=[node]))
    capacity.advance(later)
    short = Busy(uuid.uuid4(), later, built + timedelta(hours=1), 0, 80)
    capacity.reload(capacity.gpus[node.gpus[1].gpu_id], [short])
    planner = Planner(capacity=capacity, headroom=0)
    assert planner.place(Request(reservation_id=uuid.uuid4(), kind=VM, gpu_model_ids=(model,), regions=("r",),
                                 units=1, gpus_per_unit=1, start=later, end=later + timedelta(hours=1),
                                 priority=0.5)) is None
    assert "until 10:00" in planner.last_reason  # the short work's end, not the long work's 14:00


def test_the_headroom_is_a_share_of_the_gpus_of_the_model_asked():
    """Free GPUs of another model do not make room in this one's headroom, nor do busy ones take it."""
    now = timezone.now()
    h100, a100 = uuid.uuid4(), uuid.uuid4()
    held = Busy(uuid.uuid4(), now, now + timedelta(hours=1), 0, 80)
    # H100: 4 GPUs, 2 busy; a 50 % headroom keeps 2. A100: 8 GPUs, all free.
    nodes = [two_gpu_node(h100, [held]), two_gpu_node(h100)] + [two_gpu_node(a100) for _ in range(4)]

    def reserved(model):
        return Request(reservation_id=uuid.uuid4(), kind=VM, gpu_model_ids=(model,), regions=("r",), units=1,
                       gpus_per_unit=1, start=now, end=now + timedelta(hours=1), priority=0.5, on_demand=False)

    planner = Planner(Snapshot(now=now, nodes=nodes), headroom=0.5)
    assert planner.place(reserved(h100)) is None  # counted region-wide, 10 free of 12 would have left room
    assert "kept for on-demand" in planner.last_reason
    assert planner.place(reserved(a100)) is not None


def test_the_shape_read_again_unchanged_does_not_rebuild_the_index(world, fleet):
    now = timezone.now()
    kept = KeptCapacity(FleetShape(refresh_s=0), rebuild_s=3600)
    kept.for_cycle(now)
    kept.for_cycle(now + timedelta(seconds=1))
    assert kept.rebuilds == 1


def test_a_whole_pool_that_leaves_and_comes_back_is_rebuilt_with_its_leaves(world, fleet):
    now = timezone.now()
    # Never built again for the share of nodes moved (here more come back than the index holds).
    kept = KeptCapacity(FleetShape(refresh_s=3600), rebuild_s=3600, rebuild_share=100)
    kept.for_cycle(now)
    bare_metal = [n.pk for n in sellable_nodes() if n.pool == "bare_metal"]
    assert bare_metal
    Node.objects.filter(pk__in=bare_metal).update(state="maintenance")
    capacity = kept.for_cycle(now)
    assert not any(kind == "bare_metal" for _, _, kind in capacity.pools)
    assert index_view(capacity) == index_view(fresh_index(now))
    Node.objects.filter(pk__in=bare_metal).update(state="available")
    assert index_view(kept.for_cycle(now)) == index_view(fresh_index(now))
    assert kept.rebuilds == 1
