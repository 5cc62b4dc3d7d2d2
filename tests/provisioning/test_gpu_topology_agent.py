"""
Where GPUs sit in their node, from the agent's side to the inventory: the simulated NVML's raw
readings grouped into NVLink domains, PCIe switches and NUMA nodes (an HGX board, PCIe cards
bridged in pairs or not, a bridge whose links are down), the real backend's pynvml calls over
fakes, the agent reporting them with its inventory (read once, and a failed read costs no
heartbeat), and the control plane recording them on the GPU rows when a node is verified.
"""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from cloud.fleet import HGX_NUMA_CPUS, HGX_PLACES
from cloud.models import GPU, Node
from cloud.services import node_topology_observed
from operations.node_api import agents as node_agents
from provisioning.agent import topology
from provisioning.agent.agent import Agent
from provisioning.agent.nvml import RealNVML, SimulatedGPU, SimulatedNVML
from provisioning.drivers import Target
from provisioning.drivers.agent_host import AgentHost
from provisioning.drivers.simulated import SimulatedHost
from provisioning.models import Reservation
from security.models import AuditEvent
from tests.provisioning.test_nvml_backend import FakeNVML, table
from tests.world import small_fleet

PLACES = ("nvlink_domain", "pcie_switch", "numa_node")


def simulated(count: int, **layout) -> SimulatedNVML:
    board = topology.simulated_layout(count, **layout)
    return SimulatedNVML([SimulatedGPU(index=i, uuid=f"GPU-{i}", memory_mib=81920, topology=board[i])
                          for i in range(count)])


def places(found: dict) -> list[tuple]:
    return [tuple(found[i][key] for key in PLACES) for i in sorted(found)]


#
# The simulated NVML's readings, grouped
#

def test_an_hgx_board_is_one_nvswitch_domain_with_a_pcie_switch_per_pair_and_two_numa_nodes():
    found = topology.read(simulated(8), range(8))
    assert places(found) == [(0, 0, 0), (0, 0, 0), (0, 2, 0), (0, 2, 0), (0, 4, 1), (0, 4, 1), (0, 6, 1), (0, 6, 1)]
    assert [found[i]["cpus"] for i in (0, 7)] == ["0-55", "56-111"]
    assert places(found) == [tuple(p[key] for key in PLACES) for p in HGX_PLACES]  # as the demo fleet is enrolled


@pytest.mark.parametrize(("bridged", "domains"), [(True, [0, 0, 2, 2]), (False, [None] * 4)])
def test_pcie_cards_are_a_switch_and_numa_node_per_pair_and_bridged_pairs_are_nvlink_domains(bridged, domains):
    found = topology.read(simulated(4, bridged=bridged), range(4))
    assert [found[i]["nvlink_domain"] for i in range(4)] == domains
    assert [(found[i]["pcie_switch"], found[i]["numa_node"]) for i in range(4)] == [(0, 0), (0, 0), (2, 1), (2, 1)]


def test_a_bridge_whose_links_are_all_down_joins_no_domain():
    nvml = simulated(4)
    for link in range(18):
        nvml.nvlink_down(2, link)
        nvml.nvlink_down(3, link)
    assert [found["nvlink_domain"] for found in topology.read(nvml, range(4)).values()] == [0, 0, None, None]


def test_gpus_without_a_known_place_report_none_and_a_backend_without_readings_nothing():
    nvml = SimulatedNVML([SimulatedGPU(index=i, uuid=f"GPU-{i}", memory_mib=1) for i in range(2)])
    assert places(topology.read(nvml, range(2))) == [(None, None, None)] * 2
    assert topology.read(object(), range(2)) == {}


def test_cpu_lists_are_read_from_affinity_masks():
    assert topology.cpu_list([0xFF, 0, 0b11]) == "0-7,128-129"
    assert topology.cpu_list([1 << 63 | 1, 1]) == "0,63-64"


#
# The real backend's pynvml calls
#

def install_topology(monkeypatch, *, bridged: bool) -> None:
    """GPU 0's 17 active NVLinks end at NVSwitches, or (``bridged``) at GPU 1; they share a NUMA node, not a switch."""
    buses = {0: b"00000000:18:00.0", 1: b"00000000:2A:00.0"}

    def remote_type(handle, link):
        if bridged:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # an older driver: the far end's bus tells
        return pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH

    def cpu_affinity_within_scope(handle, size, scope):
        if handle == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # falls back to the older call
        return [0xF] + [0] * (size - 1)

    functions = {
        "nvmlDeviceGetPciInfo": lambda handle: SimpleNamespace(busId=buses[handle]),
        "nvmlDeviceGetTopologyCommonAncestor": lambda a, b: pynvml.NVML_TOPOLOGY_NODE,
        "nvmlDeviceGetNvLinkRemoteDeviceType": remote_type,
        "nvmlDeviceGetNvLinkRemotePciInfo": lambda handle, link: SimpleNamespace(busId=buses[1 - handle].lower()),
        "nvmlDeviceGetMemoryAffinity": lambda handle, size, scope: [0b10] + [0] * (size - 1),
        "nvmlDeviceGetCpuAffinityWithinScope": cpu_affinity_within_scope,
        "nvmlDeviceGetCpuAffinity": lambda handle, size: [0xF0] + [0] * (size - 1),
    }
    for name, function in functions.items():
        monkeypatch.setattr(pynvml, name, function)


@pytest.mark.parametrize(("bridged", "domains"), [(False, [0, None]), (True, [0, 0])])
def test_the_real_backend_reads_nvlink_far_ends_common_ancestors_and_affinity(monkeypatch, bridged, domains):
    fake = FakeNVML(table())
    fake.install(monkeypatch)
    install_topology(monkeypatch, bridged=bridged)
    backend = RealNVML()
    try:
        found = topology.read(backend, [0, 1])
    finally:
        backend.shutdown()
    assert [found[i]["nvlink_domain"] for i in (0, 1)] == domains  # GPU 1 has no NVLink of its own
    assert [(found[i]["pcie_switch"], found[i]["numa_node"], found[i]["cpus"]) for i in (0, 1)] == [
        (0, 1, "0-3"), (1, 1, "4-7")]  # a host bridge between them: a switch each


#
# The agent reports it
#

class Counting(SimulatedNVML):
    def __init__(self, gpus):
        super().__init__(gpus)
        self.asked = 0

    def common_ancestor(self, a, b):
        self.asked += 1
        return super().common_ancestor(a, b)


def test_the_agent_reports_each_gpus_place_with_its_inventory_reading_it_once():
    board = topology.simulated_layout(8)
    nvml = Counting([SimulatedGPU(index=i, uuid=f"GPU-{i}", memory_mib=1, topology=board[i]) for i in range(8)])
    agent = Agent(None, nvml)
    first = agent.inventory()
    assert [(g["nvlink_domain"], g["pcie_switch"], g["numa_node"], g["cpus"]) for g in first[3:5]] == [
        (0, 2, 0, "0-55"), (0, 4, 1, "56-111")]
    asked = nvml.asked
    assert agent.heartbeat()["gpus"] == first and nvml.asked == asked == 28  # 8 GPUs' pairs, once


def test_a_topology_that_cannot_be_read_leaves_the_inventory_as_it_was(caplog):
    class Broken(SimulatedNVML):
        def common_ancestor(self, a, b):
            raise RuntimeError("the driver went away")

    agent = Agent(None, Broken([SimulatedGPU(index=i, uuid=f"GPU-{i}", memory_mib=1) for i in range(2)]))
    assert [set(g) & set(PLACES) for g in agent.heartbeat()["gpus"]] == [set(), set()]
    assert "could not read where the GPUs sit" in caplog.text


#
# The control plane records it
#

@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(4)


def shared_host() -> Node:
    return Node.objects.filter(pool="shared").order_by("hostname").first()


def test_the_demo_fleet_is_enrolled_with_its_topology(world, fleet):
    for node in Node.objects.all():
        assert node.numa_cpus == HGX_NUMA_CPUS
        assert [tuple(p) for p in node.gpus.order_by("index").values_list(*PLACES)] == [
            tuple(p[key] for key in PLACES) for p in HGX_PLACES]


def test_an_agents_places_reach_the_gpu_rows_through_its_heartbeat(world, fleet, django_assert_num_queries):
    """A node enrolled without a topology learns it from its agent's heartbeat at its next verify."""
    node = shared_host()
    GPU.objects.filter(node=node).update(nvlink_domain=None, pcie_switch=None, numa_node=None)
    Node.objects.filter(pk=node.pk).update(numa_cpus={})
    node.refresh_from_db()
    board = topology.simulated_layout(4, bridged=True)  # the host turned out to carry PCIe cards in bridged pairs
    gpus = list(node.gpus.order_by("index"))
    nvml = SimulatedNVML([SimulatedGPU(index=g.index, uuid=g.uuid, memory_mib=g.memory_mib,
                                       topology=board[g.index % 4]) for g in gpus])
    node_agents.heartbeat(node=node, agent_version="1", gpus=Agent(None, nvml).inventory())
    seen = AgentHost().inventory(Target(node_id=node.pk, hostname=node.hostname))
    assert node_topology_observed(node=node, gpus=gpus, seen=seen)
    assert [tuple(p) for p in node.gpus.order_by("index").values_list(*PLACES)][:4] == [
        (0, 0, 0), (0, 0, 0), (2, 2, 1), (2, 2, 1)]
    assert node.numa_cpus == {"0": "0-55", "1": "56-111"}
    assert AuditEvent.objects.filter(action="node.topology_observed").count() == 1
    with django_assert_num_queries(0):  # unchanged: nothing written
        assert not node_topology_observed(node=node, gpus=gpus, seen=seen)


def test_a_malformed_place_keeps_what_is_stored(world, fleet):
    node = shared_host()
    gpus = list(node.gpus.order_by("index"))
    seen = [{"uuid": g.uuid, "nvlink_domain": "0", "pcie_switch": 99, "numa_node": -1, "cpus": "all of them"}
            for g in gpus]
    assert not node_topology_observed(node=node, gpus=gpus, seen=seen)
    assert node.numa_cpus == HGX_NUMA_CPUS


def test_the_simulated_host_reports_the_catalogues_places_or_a_realistic_boards(world, fleet):
    node = shared_host()
    target = Target(node_id=node.pk, hostname=node.hostname)
    host = SimulatedHost()
    reported = host.inventory(target)
    assert [(g["nvlink_domain"], g["pcie_switch"], g["numa_node"], g["cpus"]) for g in reported][3:5] == [
        (0, 2, 0, "0-55"), (0, 4, 1, "56-111")]
    GPU.objects.filter(node=node).update(nvlink_domain=None, pcie_switch=None, numa_node=None)
    assert host.inventory(target) == reported  # not in the catalogue: an HGX board's, as its 8 GPUs make it
    host.set_topology(target, {0: {"numa_node": 1}})
    assert host.inventory(target)[0]["numa_node"] == 1
