"""
The scheduler loop's snapshots: the fleet's shape kept between cycles, what changes read each cycle.

A cycle used to read every node and GPU row again (10,240 GPUs: a third of its time) although
where a GPU sits -- its node, leaf, pod, fabric, region, pool, model and memory -- changes only
when hardware is enrolled, removed or recabled. ``FleetShape`` keeps that and reads, per cycle,
only what moves: which nodes and GPUs may not take work now (a few rows: spares, nodes out of
service or being attested, unhealthy or quarantined GPUs) and the allocations in the window.
The shape is read again every ``refresh_s`` seconds and at once when the number of nodes or GPUs
changed; a node recabled in between is placed by its old leaf for at most that long (a worse
topology, never a double booking: the database still refuses overlapping allocations).

``snapshot`` gives what ``snapshot.load_snapshot`` gives for the same arguments (tested).
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import NamedTuple
from uuid import UUID

from django.db import connection
from django.db.models import Count, Max, Q

from cloud.capacity import SELLABLE_HEALTH
from cloud.models import GPU, Node

from .allocations import ALLOCATABLE_NODE_STATES
from .choices import BillingTerm, OperationKind, OperationState
from .models import Allocation, Operation, Reservation
from .plan_types import Busy, GPUCapacity, NodeCapacity, Snapshot
from .snapshot import UNUSABLE_GPU_STATES

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class GpuShape(NamedTuple):
    gpu_id: UUID
    index: int
    memory_mib: int
    model_id: UUID


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

    def snapshot(self, *, now: datetime, until: datetime, regions=None, gpu_model_ids=None) -> Snapshot:
        """The sellable fleet (optionally narrowed) with every allocation overlapping [now, until)."""
        self._refresh()
        blocked_nodes, blocked_gpus = _blocked()
        busy = window_allocations(now, until)
        regions = set(regions) if regions is not None else None
        models = set(gpu_model_ids) if gpu_model_ids is not None else None
        nodes = []
        for node in self.nodes:
            if node.node_id in blocked_nodes or (regions is not None and node.region not in regions):
                continue
            usable = [g for g in node.gpus if g.gpu_id not in blocked_gpus and (models is None or g.model_id in models)]
            if usable:
                gpus = [GPUCapacity(gpu_id=g.gpu_id, index=g.index, memory_mib=g.memory_mib,
                                    busy=busy.get(g.gpu_id, [])) for g in usable]
                # A node's GPUs are of one model (enrolment checks it); its last usable GPU's, as load_snapshot.
                nodes.append(NodeCapacity(node_id=node.node_id, region=node.region, fabric_id=node.fabric_id,
                                          leaf_id=node.leaf_id, pod=node.pod, pool=node.pool,
                                          gpu_model_id=usable[-1].model_id, gpus=gpus))
        return Snapshot(now=now, nodes=nodes)

    def _refresh(self) -> None:
        # Hardware added or removed changes one of these (removing one and adding another too).
        counts = (*Node.objects.aggregate(n=Count("pk"), newest=Max("created_at")).values(), GPU.objects.count())
        if counts == self.counts and time.monotonic() - self.read_at < self.refresh_s:
            return
        gpus = defaultdict(list)
        for gpu_id, node_id, index, memory, model_id in GPU.objects.order_by("node_id", "index").values_list(
                "id", "node_id", "index", "memory_mib", "model_id"):
            gpus[node_id].append(GpuShape(gpu_id, index, memory, model_id))
        self.nodes = [
            NodeShape(node_id, region, fabric_id, leaf_id, pod, pool, tuple(gpus[node_id]))
            for node_id, region, fabric_id, leaf_id, pod, pool in Node.objects.order_by("hostname").values_list(
                "id", "region__slug", "fabric_id", "leaf_id", "leaf__pod", "pool")
        ]
        self.counts, self.read_at = counts, time.monotonic()


def _blocked() -> tuple[set, set]:
    """The nodes and GPUs that may not take work now (load_snapshot's rules, as exceptions)."""
    nodes = set(Node.objects.exclude(is_spare=False, state__in=ALLOCATABLE_NODE_STATES, health__in=SELLABLE_HEALTH)
                .values_list("id", flat=True))
    # A node whose idle attestation is under way is not sold until it has passed.
    nodes.update(Operation.objects.filter(kind=OperationKind.ATTEST, node__isnull=False,
                                          state__in=[OperationState.PENDING, OperationState.RUNNING])
                 .values_list("node_id", flat=True))
    gpus = set(GPU.objects.filter(~Q(health__in=SELLABLE_HEALTH) | Q(state__in=UNUSABLE_GPU_STATES))
               .values_list("id", flat=True))
    return nodes, gpus


def window_allocations(now: datetime, until: datetime) -> dict[UUID, list[Busy]]:
    """Every allocation overlapping [now, until), per GPU, sorted by start."""
    busy = defaultdict(list)
    if connection.vendor == "postgresql":
        rows = _window_rows_postgresql(now, until)
    else:
        rows = (Allocation.objects.filter(ends_at__gt=now, starts_at__lt=until).order_by("starts_at").values_list(
            "gpu_id", "reservation_id", "starts_at", "ends_at", "mem_lo", "mem_hi", "reservation__billing_term",
            "reservation__score"))
        rows = ((g, r, s, e, lo, hi, term == BillingTerm.SPOT, score) for g, r, s, e, lo, hi, term, score in rows)
    for gpu_id, reservation_id, start, end, lo, hi, spot, score in rows:
        busy[gpu_id].append(Busy(reservation_id, start, end, lo, hi, spot, score))
    return busy


def _window_rows_postgresql(now: datetime, until: datetime):
    """
    The same rows with times as microseconds since the epoch: parsing 20,000 timestamps as text
    cost more than the query; integers cost a tenth of that.
    """
    a, r = Allocation._meta.db_table, Reservation._meta.db_table
    # Only the models' table names are formatted in; every value is a parameter.
    sql = (f"SELECT a.gpu_id, a.reservation_id, (EXTRACT(EPOCH FROM a.starts_at) * 1000000)::bigint, "  # noqa: S608
           f"(EXTRACT(EPOCH FROM a.ends_at) * 1000000)::bigint, a.mem_lo, a.mem_hi, r.billing_term = %s, r.score "
           f"FROM {a} a JOIN {r} r ON r.id = a.reservation_id WHERE a.ends_at > %s AND a.starts_at < %s "
           f"ORDER BY a.starts_at")
    with connection.cursor() as cursor:
        cursor.execute(sql, [BillingTerm.SPOT, now, until])
        rows = cursor.fetchall()
    micro = timedelta(microseconds=1)
    return ((g, rid, EPOCH + s * micro, EPOCH + e * micro, lo, hi, spot, score)
            for g, rid, s, e, lo, hi, spot, score in rows)
