"""
The scheduler loop's snapshots: the fleet's shape kept between cycles, what changes read each cycle.

A cycle used to read every node and GPU row again (10,240 GPUs: a third of its time) although
where a GPU sits -- its node, leaf, pod, fabric, region, pool, model and memory, and its place in
the node (NVLink domain, PCIe switch, NUMA node: planner.topology) -- changes only
when hardware is enrolled, removed or recabled. ``FleetShape`` keeps that and reads, per cycle,
only what moves: which nodes and GPUs may not take work now (a few rows: spares, nodes out of
service or being attested, unhealthy or quarantined GPUs) and the allocations in the window.
The scheduler loop's kept index reads it again when the capacity change feed says hardware came,
went or was recabled (``kept_capacity``); other callers every ``refresh_s`` seconds and at once
when the number of nodes or GPUs changed (a node recabled in between is placed by its old leaf
for at most that long: a worse topology, never a double booking).

``snapshot`` gives what ``snapshot.load_snapshot`` gives for the same arguments (tested).
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from django.db import connection

from cloud.models import GPU, Node
from provisioning.scheduling.plan_types import GPUCapacity, NodeCapacity, Snapshot, capacity_pool
from provisioning.scheduling.snapshot import SELLABLE_GPU, sellable_nodes, window_allocations


class GpuShape(NamedTuple):
    gpu_id: UUID
    index: int
    memory_mib: int
    model_id: UUID
    # Its place in the node (planner.topology): read with the shape, as it changes only with the hardware.
    nvlink_domain: int | None = None
    pcie_switch: int | None = None
    numa_node: int | None = None


class NodeShape(NamedTuple):
    node_id: UUID
    region: str
    fabric_id: UUID
    leaf_id: UUID
    pod: int
    pool: str
    gpus: tuple[GpuShape, ...]  # by index


class FleetShape:
    """The fleet's shape, read at most every ``refresh_s`` seconds, and the snapshots made from it."""

    def __init__(self, refresh_s: float = 30.0):
        self.refresh_s = refresh_s
        self.nodes: list[NodeShape] = []  # by hostname, as load_snapshot orders them
        self.counts: tuple | None = None
        self.read_at = float("-inf")
        self.version = 0  # moves only when a read found the shape changed
        self._by_id: dict = {}
        self._node_of_gpu: dict = {}
        self._by_id_version = -1

    def snapshot(self, *, now: datetime, until: datetime, regions=None, gpu_model_ids=None,
                 blocked: tuple[set, set] | None = None) -> Snapshot:
        """
        The sellable fleet (optionally narrowed) with every allocation overlapping [now, until);
        ``blocked``: what ``blocked_now()`` answered a moment ago, when the caller has it.
        """
        self.refresh()
        blocked_nodes, blocked_gpus = blocked or blocked_now()
        busy = window_allocations(now, until)
        regions = set(regions) if regions is not None else None
        models = set(gpu_model_ids) if gpu_model_ids is not None else None
        nodes = []
        for node in self.nodes:
            if node.node_id in blocked_nodes or (regions is not None and node.region not in regions):
                continue
            if (capacity := node_capacity(node, blocked_gpus, busy, models)) is not None:
                nodes.append(capacity)
        return Snapshot(now=now, nodes=nodes)

    def node(self, node_id) -> NodeShape | None:
        """One node's shape by id (None: not in the fleet as last read)."""
        return self._maps()[0].get(node_id)

    def node_of_gpu(self, gpu_id):
        """The id of the node a GPU sits on (None: not in the fleet as last read)."""
        return self._maps()[1].get(gpu_id)

    def _maps(self) -> tuple[dict, dict]:
        if self._by_id_version != self.version:  # made again only when the shape changed
            self._by_id = {node.node_id: node for node in self.nodes}
            self._node_of_gpu = {g.gpu_id: node.node_id for node in self.nodes for g in node.gpus}
            self._by_id_version = self.version
        return self._by_id, self._node_of_gpu

    def refresh(self) -> None:
        """Read the shape again if it is older than ``refresh_s`` or hardware was added or removed."""
        counts = _hardware_counts()
        if counts == self.counts and time.monotonic() - self.read_at < self.refresh_s:
            return
        self.read(counts)

    def read(self, counts: tuple | None = None) -> None:
        """Read the shape now (the loop's kept index: when the change feed says hardware moved)."""
        gpus = defaultdict(list)
        for gpu_id, node_id, index, memory, model_id, *place in GPU.objects.order_by("node_id", "index").values_list(
                "id", "node_id", "index", "memory_mib", "model_id", "nvlink_domain", "pcie_switch", "numa_node"):
            gpus[node_id].append(GpuShape(gpu_id, index, memory, model_id, *place))
        nodes = [
            NodeShape(node_id, region, fabric_id, leaf_id, pod, capacity_pool(pool, confidential), tuple(gpus[node_id]))
            for node_id, region, fabric_id, leaf_id, pod, pool, confidential in Node.objects.order_by(
                "hostname").values_list("id", "region__slug", "fabric_id", "leaf_id", "leaf__pod", "pool",
                                        "confidential")
        ]
        if nodes != self.nodes:
            self.nodes, self.version = nodes, self.version + 1
        self.counts, self.read_at = counts or _hardware_counts(), time.monotonic()


def _hardware_counts() -> tuple:
    """
    What hardware added or removed changes (removing one and adding another too): the nodes,
    the newest node's enrolment, the GPUs, and how many nodes are confidential capacity (a node
    moves between pools when its CC mode does). One round trip; it is asked every cycle.
    """
    qn = connection.ops.quote_name
    nodes, gpus = qn(Node._meta.db_table), qn(GPU._meta.db_table)
    created = qn(Node._meta.get_field("created_at").column)
    confidential = qn(Node._meta.get_field("confidential").column)
    with connection.cursor() as cursor:
        # Only quoted names from the models' metadata are formatted in.
        cursor.execute(f"SELECT (SELECT count(*) FROM {nodes}), (SELECT max({created}) FROM {nodes}), "  # noqa: S608
                       f"(SELECT count(*) FROM {gpus}), (SELECT count(*) FROM {nodes} WHERE {confidential})")
        return tuple(cursor.fetchone())


def node_capacity(node: NodeShape, blocked_gpus: set, busy: dict, models: set | None = None) -> NodeCapacity | None:
    """A sellable node as a snapshot holds it: its usable GPUs (of ``models``) with their allocations; None if none."""
    usable = [g for g in node.gpus if g.gpu_id not in blocked_gpus and (models is None or g.model_id in models)]
    if not usable:
        return None
    gpus = [GPUCapacity(gpu_id=g.gpu_id, index=g.index, memory_mib=g.memory_mib, busy=busy.get(g.gpu_id, []),
                        nvlink_domain=g.nvlink_domain, pcie_switch=g.pcie_switch, numa_node=g.numa_node)
            for g in usable]
    # A node's GPUs are of one model (enrolment checks it); its last usable GPU's, as load_snapshot.
    return NodeCapacity(node_id=node.node_id, region=node.region, fabric_id=node.fabric_id, leaf_id=node.leaf_id,
                        pod=node.pod, pool=node.pool, gpu_model_id=usable[-1].model_id, gpus=gpus)


def blocked_now(node_ids=None) -> tuple[set, set]:
    """
    The nodes and GPUs that may not take work now: load_snapshot's rules (snapshot.py), as
    exceptions; only among ``node_ids`` (and their GPUs) when given.
    """
    sql, params = _blocked_statement(connection.vendor) if node_ids is None else _blocked_among(node_ids)
    nodes, gpus = set(), set()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for is_gpu, pk in cursor.fetchall():
            (gpus if is_gpu else nodes).add(pk if isinstance(pk, UUID) else UUID(pk))
    return nodes, gpus


@functools.cache
def _blocked_statement(vendor: str) -> tuple[str, tuple]:
    """
    ``blocked_now``'s two questions as one statement, built by the ORM from the same rules once
    per process: compiling them took as long as running them, every cycle. The parameters are
    the rules' own constants.
    """
    return _blocked_union(Node.objects.all(), GPU.objects.all())


def _blocked_among(node_ids) -> tuple[str, tuple]:
    """The same statement for a few nodes (the ones the change feed named)."""
    node_ids = list(node_ids)
    return _blocked_union(Node.objects.filter(pk__in=node_ids), GPU.objects.filter(node_id__in=node_ids))


def _blocked_union(nodes, gpus) -> tuple[str, tuple]:
    nodes = nodes.order_by().exclude(pk__in=sellable_nodes().order_by().values("pk")).values("id")
    gpus = gpus.order_by().exclude(SELLABLE_GPU).values("id")
    nodes_sql, nodes_params = nodes.query.sql_with_params()
    gpus_sql, gpus_params = gpus.query.sql_with_params()
    # Only the ORM's own SQL is formatted in.
    sql = (f"SELECT 0 AS is_gpu, q.id FROM ({nodes_sql}) AS q "  # noqa: S608
           f"UNION ALL SELECT 1, q.id FROM ({gpus_sql}) AS q")
    return sql, (*nodes_params, *gpus_params)
