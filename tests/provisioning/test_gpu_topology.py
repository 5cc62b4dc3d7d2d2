"""
GPUs chosen by topology inside a node, by the pure planner on hand-made nodes: a multi-GPU VM or
container gets GPUs that share an NVLink domain, else a PCIe switch, else a NUMA node, on a partly
used node too; one GPU goes where it leaves whole pairs and NUMA nodes free; a node without a good
set still takes the unit; several units of one request go under one leaf when one holds them.
No database.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from provisioning.scheduling.plan_types import SHARED_POOL, VM, Busy, GPUCapacity, NodeCapacity, Request, Snapshot
from provisioning.scheduling.planner import Planner
from provisioning.scheduling.planner import topology as t

NOW = datetime(2025, 6, 2, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
MEM = 81920
H100 = uuid.UUID(int=100)
FABRIC = uuid.UUID(int=7)
REGION = "us-east-1"

# (NVLink domain, PCIe switch, NUMA node) per GPU index
HGX = [(0, g // 2 * 2, g // 4) for g in range(8)]  # NVSwitch board: a switch per pair, four GPUs per NUMA node
BRIDGED = [(g // 2 * 2, g // 2 * 2, g // 2) for g in range(4)]  # PCIe cards: NVLink-bridged pairs, a switch each
PCIE = [(None, g // 2 * 2, g // 2) for g in range(4)]  # the same cards without bridges


def node(places, *, leaf_id: uuid.UUID | None = None, pod: int = 0) -> NodeCapacity:
    return NodeCapacity(uuid.uuid4(), REGION, FABRIC, leaf_id or uuid.uuid4(), pod, SHARED_POOL, H100,
                        [GPUCapacity(uuid.uuid4(), i, MEM, nvlink_domain=d, pcie_switch=s, numa_node=n)
                         for i, (d, s, n) in enumerate(places)])


def busy(host: NodeCapacity, *indexes: int) -> None:
    """Another tenant holds these GPUs of ``host`` for the next ten hours."""
    owner = uuid.uuid4()
    for i in indexes:
        host.gpus[i].busy.append(Busy(owner, NOW - HOUR, NOW + 10 * HOUR, 0, MEM))


def vm(per_unit: int, units: int = 1) -> Request:
    return Request(reservation_id=uuid.uuid4(), kind=VM, gpu_model_ids=(H100,), regions=(REGION,), units=units,
                   gpus_per_unit=per_unit, start=NOW, end=NOW + 2 * HOUR, priority=0.5)


def place(*nodes: NodeCapacity, request: Request):
    placement = Planner(Snapshot(now=NOW, nodes=list(nodes))).place(request)
    assert placement is not None
    return placement


def chosen(host: NodeCapacity, placement) -> list[int]:
    """The indexes of ``host``'s GPUs the placement took."""
    ids = {a.gpu_id for a in placement.assignments}
    return sorted(g.index for g in host.gpus if g.gpu_id in ids)


#
# Inside one node
#

def test_a_two_gpu_vm_on_a_partly_used_hgx_node_gets_a_pcie_switch_pair():
    """GPUs 0 and 3 are taken: 1 and 2 are NVLinked too, but each under its own switch; 4-5 share one."""
    host = node(HGX)
    busy(host, 0, 3)
    assert chosen(host, place(host, request=vm(2))) == [4, 5]


def test_a_four_gpu_vm_gets_one_numa_node_whole():
    """GPU 1 is taken: the four GPUs of NUMA node 1, two switches, rather than 0, 2, 3 and one across."""
    host = node(HGX)
    busy(host, 1)
    assert chosen(host, place(host, request=vm(4))) == [4, 5, 6, 7]


def test_a_two_gpu_vm_on_pcie_cards_gets_a_bridged_pair():
    """GPU 1 is taken: 0 and 2 would cross the CPUs; 2 and 3 are bridged."""
    host = node(BRIDGED)
    busy(host, 1)
    assert chosen(host, place(host, request=vm(2))) == [2, 3]


def test_one_gpu_goes_beside_a_taken_one_so_that_pairs_and_numa_nodes_stay_whole():
    host = node(HGX)
    busy(host, 4)
    assert chosen(host, place(host, request=vm(1))) == [5]  # NUMA node 0 stays whole for a 4-GPU unit
    cards = node(BRIDGED)
    busy(cards, 2)
    assert chosen(cards, place(cards, request=vm(1))) == [3]  # the bridged pair 0-1 stays whole


def test_with_no_good_set_the_unit_still_fits_across_the_cpus():
    """Unbridged cards, 0 and 3 taken: 1 and 2 are on two NUMA nodes, and the VM takes them."""
    host = node(PCIE)
    busy(host, 0, 3)
    placement = place(host, request=vm(2))
    assert chosen(host, placement) == [1, 2]
    assert t.record([1, 2], [PCIE[1], PCIE[2]]) == {"gpus": [1, 2], "link": t.SYSTEM, "numa_node": None}


def test_of_equally_full_nodes_the_one_whose_free_gpus_share_a_switch_wins():
    """Both nodes have two GPUs free (the best fit); only the second's share a PCIe switch and a NUMA node."""
    across, paired = node(PCIE), node(PCIE)
    busy(across, 0, 3)
    busy(paired, 0, 1)
    placement = place(across, paired, request=vm(2))
    assert {a.node_id for a in placement.assignments} == {paired.node_id}
    assert chosen(paired, placement) == [2, 3]


def test_packing_comes_before_the_link():
    """A node with exactly two free GPUs across the CPUs is still chosen over an empty one: whole nodes stay free."""
    across, empty = node(PCIE), node(PCIE)
    busy(across, 0, 3)
    assert {a.node_id for a in place(across, empty, request=vm(2)).assignments} == {across.node_id}


def test_a_node_whose_topology_is_not_known_takes_its_first_free_gpus():
    host = node([t.UNKNOWN] * 8)
    busy(host, 0)
    assert chosen(host, place(host, request=vm(2))) == [1, 2]


def test_two_units_on_one_node_each_get_a_pair():
    host = node(HGX)
    busy(host, 0, 2, 4, 6)
    placement = place(host, request=vm(2, units=2))
    assert chosen(host, placement) == [1, 3, 5, 7]  # the only free GPUs: a unit each side
    host = node(HGX)
    placement = place(host, request=vm(2, units=2))
    taken = [[g.index for g in host.gpus if g.gpu_id == a.gpu_id][0] for a in placement.assignments]
    assert [sorted(taken[:2]), sorted(taken[2:])] == [[0, 1], [2, 3]]


#
# Several units: one leaf
#

def test_several_units_go_under_one_leaf_when_one_holds_them():
    """Leaf A's two nodes have one GPU free each (the best fit one by one); leaf B's node holds all three units."""
    leaf_a, leaf_b = uuid.uuid4(), uuid.uuid4()
    tight = [node(HGX, leaf_id=leaf_a) for _ in range(2)]
    for host in tight:
        busy(host, *range(7))
    roomy = node(HGX, leaf_id=leaf_b)
    busy(roomy, *range(5))
    placement = place(*tight, roomy, request=vm(1, units=3))
    assert placement.leaves == 1
    assert {a.node_id for a in placement.assignments} == {roomy.node_id}


def test_units_that_no_leaf_holds_take_the_fewest_leaves():
    leaves = [uuid.uuid4() for _ in range(3)]
    hosts = [node(HGX, leaf_id=leaf) for leaf in leaves]
    for host in hosts:
        busy(host, *range(6))  # two GPUs free on each
    placement = place(*hosts, request=vm(2, units=2))
    assert placement.leaves == 2


def test_one_leaf_is_the_fullest_that_holds_them():
    """Two leaves hold both units; the one with fewer free places is used, the emptier stays whole."""
    fuller, emptier = uuid.uuid4(), uuid.uuid4()
    a = node(HGX, leaf_id=fuller)
    busy(a, *range(4))
    b, c = node(HGX, leaf_id=emptier), node(HGX, leaf_id=emptier)
    placement = place(a, b, c, request=vm(2, units=2))
    assert {x.node_id for x in placement.assignments} == {a.node_id}
    assert placement.leaves == 1


#
# The pure choice
#

@pytest.mark.parametrize(("places", "link"), [
    ([HGX[0], HGX[7]], t.NVLINK),
    ([PCIE[0], PCIE[1]], t.PCIE_SWITCH),
    ([(None, 0, 0), (None, 2, 0)], t.NUMA),
    ([PCIE[1], PCIE[2]], t.SYSTEM),
    ([t.UNKNOWN, t.UNKNOWN], None),
    ([HGX[3]], None),
])
def test_link_class_of_a_set(places, link):
    assert t.link_of(places) == link


def test_split_gives_each_unit_a_best_linked_set():
    """Four GPUs of two units taken in index order (0, 2 | 1, 3) would split the bridged pairs; split keeps them."""
    places = [BRIDGED[0], BRIDGED[2], BRIDGED[1], BRIDGED[3]]  # allocations ordered otherwise than the pairs
    assert sorted(sorted(u) for u in t.split(places, 2)) == [[0, 2], [1, 3]]


def test_choose_prefers_one_numa_node_for_a_set_spanning_switches():
    places = HGX
    free = [places[i] for i in (1, 2, 3, 4, 5, 7)]
    picked = [(1, 2, 3, 4, 5, 7)[i] for i in t.choose(free, 3)]
    assert t.numa_of([places[i] for i in picked]) == 0 and picked == [1, 2, 3]
