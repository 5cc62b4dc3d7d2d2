"""
Where each GPU sits in its node, as NVML tells it: which GPUs it reaches over NVLink (a bridge to
a neighbour, or an NVSwitch that joins them all), which it shares a PCIe switch with (their
common ancestor in the PCIe tree is a switch, not a host bridge), and the NUMA node it hangs off
with that node's CPUs. The agent reads it once (it changes only with the hardware) and reports
it with each GPU of its inventory; the control plane keeps it on the GPU rows (cloud.services
``node_topology_observed``) and the planner gives a multi-GPU unit GPUs that share the best link
(provisioning.scheduling.planner.topology). ``read`` groups the raw readings into, per GPU:

- ``nvlink_domain``: the lowest index of the GPUs it is joined to by NVLink, directly or through
  NVSwitches (None: no active NVLink);
- ``pcie_switch``: the lowest index of the GPUs under the same PCIe switch (itself when alone);
- ``numa_node``: the host's NUMA node nearest to it; ``cpus``: that node's CPUs ("0-55,112-167").

The raw readings come from the backend: ``RealReadings`` (pynvml, mixed into nvml.RealNVML) or
``SimulatedReadings`` (each SimulatedGPU's ``topology``, mixed into nvml.SimulatedNVML); a backend
with neither reports none, and the planner then places as before it knew. ``simulated_layout``
describes realistic servers for the simulated ones.
"""

from __future__ import annotations

from itertools import combinations

# NVML's nvmlGpuTopologyLevel_t, a stable part of its ABI (the simulated backend runs without pynvml).
SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM = 10, 20, 30, 40, 50
NVSWITCH = "nvswitch"  # the far end of an NVLink that is an NVSwitch rather than a GPU
CPU_WORDS, NUMA_WORDS = 64, 4  # 64-bit words of the affinity masks asked for: 4,096 CPUs, 256 NUMA nodes
# PCI bus ids of the eight SXM GPUs of an HGX baseboard, as nvidia-smi lists them.
HGX_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


def read(nvml, indexes) -> dict[int, dict]:
    """Per GPU index, its place in the node (see the module); {} from a backend without topology readings."""
    if not hasattr(nvml, "common_ancestor"):
        return {}
    indexes = sorted(indexes)
    switch, domain = {i: i for i in indexes}, {i: i for i in indexes}
    placed = set(indexes) if len(indexes) == 1 else set()  # PCIe places known (a lone GPU is its own switch)
    for a, b in combinations(indexes, 2):
        level = nvml.common_ancestor(a, b)
        if level is not None:
            placed |= {a, b}
            if level <= MULTIPLE:  # one switch, or a tree of switches: no host bridge between them
                _join(switch, a, b)
    buses = {bus.lower(): i for i in indexes if (bus := nvml.pci_bus_id(i))}
    linked, switched = set(), []
    for i in indexes:
        for far in nvml.nvlink_remotes(i) or ():
            j = buses.get(far.lower()) if far and far != NVSWITCH else None
            if j is not None and j != i:
                _join(domain, i, j)
                linked |= {i, j}
            elif far:  # an NVSwitch (or a far end that is no GPU of this node): the switch joins them
                switched.append(i)
                linked.add(i)
    for i in switched[1:]:
        _join(domain, switched[0], i)
    return {i: {"nvlink_domain": _root(domain, i) if i in linked else None,
                "pcie_switch": _root(switch, i) if i in placed else None,
                "numa_node": nvml.numa_node(i), "cpus": nvml.cpus(i)} for i in indexes}


def _root(parent: dict, i: int) -> int:
    while parent[i] != i:
        i = parent[i]
    return i


def _join(parent: dict, a: int, b: int) -> None:
    """Union by the lowest index, so a group is named by its lowest GPU index."""
    ra, rb = _root(parent, a), _root(parent, b)
    parent[max(ra, rb)] = min(ra, rb)


def cpu_list(words) -> str:
    """An affinity bitmask (64-bit words, lowest CPUs first) as a Linux CPU list: "0-55,112-167"."""
    cpus = [64 * w + bit for w, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1]
    runs: list[list[int]] = []
    for cpu in cpus:
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in runs)


def _lowest_bit(words) -> int | None:
    return next((64 * w + bit for w, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1), None)


class RealReadings:
    """The raw readings through pynvml, for nvml.RealNVML (its ``device``, ``_read``, ``_handle`` and ``_nvml``)."""

    def _optional(self, what: str, name: str, index: int, *args):
        """A reading an older nvidia-ml-py may not have at all: None then, as for one the driver does not offer."""
        return self.device(what, name, index, *args) if hasattr(self._nvml, name) else None

    def pci_bus_id(self, index: int) -> str | None:
        info = self.device("PCI info", "nvmlDeviceGetPciInfo", index)
        busid = None if info is None else info.busId
        return busid.decode() if isinstance(busid, bytes) else busid

    def common_ancestor(self, a: int, b: int) -> int | None:
        """NVML's topology level of the nearest PCIe ancestor GPUs ``a`` and ``b`` share."""
        return self._read(f"common ancestor of GPUs {a} and {b}", self._nvml.nvmlDeviceGetTopologyCommonAncestor,
                          self._handle(a), self._handle(b))

    def nvlink_remotes(self, index: int) -> list[str | None]:
        """
        The far end of each active NVLink: NVSWITCH, or the PCI bus id of the GPU it reaches (None
        where NVML does not say). A link the GPU does not have answers "invalid argument".
        """
        nvml, handle = self._nvml, self._handle(index)
        absent = self._unsupported | {nvml.NVML_ERROR_INVALID_ARGUMENT}
        remotes: list[str | None] = []
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                    continue
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) in absent:
                    continue
                raise
            what = f"NVLink {link} far end"
            kind = self._optional(what, "nvmlDeviceGetNvLinkRemoteDeviceType", index, link)
            if kind == getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", object()):
                remotes.append(NVSWITCH)
                continue
            info = self.device(what, "nvmlDeviceGetNvLinkRemotePciInfo", index, link)
            busid = None if info is None else info.busId
            remotes.append(busid.decode() if isinstance(busid, bytes) else busid)
        return remotes

    def numa_node(self, index: int) -> int | None:
        """The NUMA node of the host memory nearest to the GPU (NVML's memory affinity, node scope)."""
        mask = self._optional("NUMA affinity", "nvmlDeviceGetMemoryAffinity", index, NUMA_WORDS,
                              getattr(self._nvml, "NVML_AFFINITY_SCOPE_NODE", 0))
        return None if mask is None else _lowest_bit(mask)

    def cpus(self, index: int) -> str | None:
        """The CPUs nearest to the GPU (NVML's CPU affinity: its NUMA node's), as a CPU list."""
        mask = self._optional("CPU affinity", "nvmlDeviceGetCpuAffinityWithinScope", index, CPU_WORDS,
                              getattr(self._nvml, "NVML_AFFINITY_SCOPE_NODE", 0))
        if mask is None:
            mask = self._optional("CPU affinity", "nvmlDeviceGetCpuAffinity", index, CPU_WORDS)
        return (cpu_list(mask) or None) if mask is not None else None


class SimulatedReadings:
    """
    The raw readings of simulated GPUs (nvml.SimulatedNVML), from each one's ``topology``: ``bus``,
    ``switch`` and ``numa`` (any numbers: GPUs that share one share it), ``cpus``, and ``nvlink``:
    NVSWITCH, the indexes of the GPUs it is bridged to, or None. A GPU without it has no place known.
    """

    def pci_bus_id(self, index: int) -> str | None:
        return self.gpus[index].topology.get("bus")

    def common_ancestor(self, a: int, b: int) -> int | None:
        one, other = self.gpus[a].topology, self.gpus[b].topology
        if one.get("switch") is None or other.get("switch") is None:
            return None
        if one["switch"] == other["switch"]:
            return SINGLE
        return NODE if one.get("numa") == other.get("numa") else SYSTEM

    def nvlink_remotes(self, index: int) -> list[str | None] | None:
        gpu = self.gpus[index]
        links = self.nvlinks(index)
        far = gpu.topology.get("nvlink")
        if not links or not links["up"] or not far:
            return None
        if far == NVSWITCH:
            return [NVSWITCH] * links["up"]
        return [self.gpus[peer].topology.get("bus") for peer in far if peer in self.gpus]

    def numa_node(self, index: int) -> int | None:
        return self.gpus[index].topology.get("numa")

    def cpus(self, index: int) -> str | None:
        return self.gpus[index].topology.get("cpus")


def simulated_layout(count: int, *, cores: int = 112, bridged: bool = True) -> list[dict]:
    """
    A realistic server of ``count`` GPUs, as SimulatedGPU ``topology`` per index: 8 or 16 SXM GPUs
    on an HGX board (all on NVSwitches, a PCIe switch per pair, half on each of two NUMA nodes);
    4 PCIe cards (a PCIe switch and NUMA node per pair, each pair NVLink-bridged unless ``bridged``
    is off); 2 cards on one switch (bridged likewise); otherwise a switch per pair, no NVLink.
    ``cores`` are shared evenly between the NUMA nodes.
    """
    hgx = count in (8, 16)
    numa_nodes = 2 if count >= 4 else 1
    per_node = max(1, cores // numa_nodes)
    layout = []
    for i in range(count):
        numa = i * numa_nodes // count
        bridge = [i ^ 1] if bridged and count in (2, 4) else None  # PCIe cards: a bridge to the pair's other card
        nvlink = NVSWITCH if hgx else bridge
        bus = HGX_BUSES[i % 8] if hgx else f"{0x18 + 0x20 * (i % 8):02x}"
        layout.append({"bus": f"0000000{i // 8}:{bus}:00.0", "switch": i // 2, "numa": numa, "nvlink": nvlink,
                       "cpus": f"{numa * per_node}-{(numa + 1) * per_node - 1}"})
    return layout


class _Board(SimulatedReadings):
    """A simulated layout read without an NVML backend (``simulated_places``), every NVLink up."""

    def __init__(self, layout: list[dict]):
        self.gpus = {i: _Placed(place) for i, place in enumerate(layout)}

    @staticmethod
    def nvlinks(index: int) -> dict:
        return {"up": 18, "total": 18}


class _Placed:
    def __init__(self, topology: dict):
        self.topology = topology


def simulated_places(count: int, cores: int = 112, *, bridged: bool = True) -> dict[int, dict]:
    """What the agent of ``simulated_layout``'s server reports (``read``), per GPU index."""
    return read(_Board(simulated_layout(count, cores=cores, bridged=bridged)), range(count))
