"""
From the database to the planner's plain data: capacity snapshots and requests.

Platform-wide on purpose (the scheduler sees the whole fleet). Spares, nodes that may not take
work and GPUs that are not healthy never enter a snapshot, so the planner cannot pick them.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from uuid import UUID

from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, OuterRef, Q

from cloud.capacity import SELLABLE_HEALTH
from cloud.choices import GPUState, NodePool, OfferingKind
from cloud.models import GPU, Node

from .allocations import ALLOCATABLE_NODE_STATES
from .choices import BillingTerm, OperationKind, OperationState
from .models import Allocation, Operation, Reservation
from .plan_types import Busy, GPUCapacity, NodeCapacity, Request, Snapshot

UNUSABLE_GPU_STATES = [GPUState.QUARANTINED]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def load_snapshot(*, now: datetime, until: datetime, regions=None, gpu_model_ids=None, pool=None,
                  free_only: bool = False, node_ids=None) -> Snapshot:
    """
    Capacity of the sellable fleet (optionally narrowed), with every allocation overlapping
    [now, until). ``free_only``: only GPUs with nothing in that window (what a whole-GPU request
    can use without evicting anyone); ``node_ids``: only these nodes (see ``free_candidates``).
    """
    nodes, gpus = _sellable(now=now, until=until, regions=regions, gpu_model_ids=gpu_model_ids, pool=pool,
                            free_only=free_only)
    if node_ids is not None:
        nodes, gpus = nodes.filter(pk__in=list(node_ids)), gpus.filter(node_id__in=list(node_ids))
    busy = {} if free_only else window_allocations(now, until, gpus)

    by_node = defaultdict(list)
    models = {}
    for gpu_id, node_id, index, memory, model_id in gpus.values_list("id", "node_id", "index", "memory_mib",
                                                                       "model_id"):
        by_node[node_id].append(GPUCapacity(gpu_id=gpu_id, index=index, memory_mib=memory,
                                            busy=busy.get(gpu_id, [])))
        models[node_id] = model_id
    capacity = [
        NodeCapacity(node_id=node_id, region=region, fabric_id=fabric_id, leaf_id=leaf_id, pod=pod, pool=node_pool,
                     gpu_model_id=models[node_id], gpus=sorted(by_node[node_id], key=lambda g: g.index))
        for node_id, region, fabric_id, leaf_id, pod, node_pool in nodes.filter(pk__in=list(by_node)).values_list(
            "id", "region__slug", "fabric_id", "leaf_id", "leaf__pod", "pool")
    ]
    return Snapshot(now=now, nodes=capacity)


# A GPU that may take work (its node aside).
SELLABLE_GPU = Q(health__in=SELLABLE_HEALTH) & ~Q(state__in=UNUSABLE_GPU_STATES)


def sellable_nodes():
    """The nodes that may take work: no spare, in an allocatable state, healthy, not being attested."""
    # A node whose idle attestation is under way is not sold until it has passed.
    attesting = Operation.objects.filter(node=OuterRef("pk"), kind=OperationKind.ATTEST,
                                         state__in=[OperationState.PENDING, OperationState.RUNNING])
    return Node.objects.filter(is_spare=False, state__in=ALLOCATABLE_NODE_STATES, health__in=SELLABLE_HEALTH).exclude(
        Exists(attesting))


def _sellable(*, now, until, regions, gpu_model_ids, pool, free_only):
    """The nodes that may take work and their usable GPUs (only those free in the window, if asked)."""
    nodes = sellable_nodes()
    if regions is not None:
        nodes = nodes.filter(region__slug__in=list(regions))
    if pool is not None:
        nodes = nodes.filter(pool=pool)
    gpus = GPU.objects.filter(SELLABLE_GPU, node__in=nodes)
    if gpu_model_ids is not None:
        gpus = gpus.filter(model_id__in=list(gpu_model_ids))
    if free_only:
        in_window = Allocation.objects.filter(ends_at__gt=now, starts_at__lt=until, gpu=OuterRef("pk"))
        gpus = gpus.exclude(Exists(in_window))
    return nodes, gpus


def free_candidates(request: Request, *, now: datetime, spare: int = 4) -> list | None:
    """
    The few nodes an on-demand whole-GPU request would be placed on, from one aggregate query of
    free GPUs per node (no row per GPU): the best-fitting hosts for VMs and containers, or for
    bare metal the whole-free nodes of the leaf the planner prefers (the one with the fewest free
    nodes that holds the gang). None when that does not settle it (the caller reads the pool).
    """
    _, gpus = _sellable(now=now, until=request.end, regions=request.regions, gpu_model_ids=request.gpu_model_ids,
                        pool=pool_of(request.kind), free_only=True)
    if request.fabric_id is not None:
        gpus = gpus.filter(node__fabric_id=request.fabric_id)
    per_node = gpus.values("node_id", "node__leaf_id").annotate(free=Count("pk"))
    g = request.gpus_per_unit
    if request.kind != OfferingKind.BARE_METAL:
        chosen, units = [], 0
        for row in per_node.filter(free__gte=g).order_by("free", "node_id")[:request.units + spare]:
            chosen.append(row["node_id"])
            units += row["free"] // g
        return chosen if units >= request.units else None
    by_leaf = defaultdict(list)
    for row in per_node.filter(free=g):  # nodes whose sellable GPUs are all free: what the planner calls whole
        by_leaf[row["node__leaf_id"]].append(row["node_id"])
    holding = sorted((len(free), str(leaf), free) for leaf, free in by_leaf.items() if len(free) >= request.units)
    return [node for _, _, free in holding[:2] for node in free] or None


def pool_of(kind: str) -> str:
    return NodePool.BARE_METAL if kind == OfferingKind.BARE_METAL else NodePool.SHARED


def request_for(reservation: Reservation, now: datetime) -> Request:
    """The planner's view of a reservation: where, what, how many, when, and how it may be evicted."""
    offering = reservation.offering
    start = max(reservation.requested_start or now, now)
    return Request(
        reservation_id=reservation.pk,
        kind=offering.kind,
        gpu_model_ids=(reservation.gpu_model_id,),
        regions=tuple(reservation.regions),
        units=reservation.units,
        gpus_per_unit=offering.gpus_per_unit,
        slots_per_gpu=offering.slots_per_gpu,
        start=start,
        end=start + reservation.duration,
        priority=reservation.score,
        preemptible=reservation.billing_term == BillingTerm.SPOT,
        on_demand=reservation.billing_term == BillingTerm.ON_DEMAND,
        may_preempt=reservation.billing_term != BillingTerm.SPOT,
        eviction_grace=settings.MERIDIAN_SPOT_GRACE,
        fabric_id=reservation.vpc.fabric_id if reservation.vpc_id else None,
    )


def window_allocations(now: datetime, until: datetime, gpus=None) -> dict[UUID, list[Busy]]:
    """Every allocation overlapping [now, until) (on ``gpus``, a GPU queryset, when given), per GPU, by start."""
    busy = defaultdict(list)
    if connection.vendor == "postgresql":
        rows = _window_rows_postgresql(now, until, gpus)
    else:
        in_window = Allocation.objects.filter(ends_at__gt=now, starts_at__lt=until, archived=False)
        if gpus is not None:
            in_window = in_window.filter(gpu__in=gpus)
        rows = in_window.order_by("starts_at").values_list(
            "gpu_id", "reservation_id", "starts_at", "ends_at", "mem_lo", "mem_hi", "reservation__billing_term",
            "reservation__score")
        rows = ((g, r, s, e, lo, hi, term == BillingTerm.SPOT, score) for g, r, s, e, lo, hi, term, score in rows)
    for gpu_id, reservation_id, start, end, lo, hi, spot, score in rows:
        busy[gpu_id].append(Busy(reservation_id, start, end, lo, hi, spot, score))
    return busy


def _window_rows_postgresql(now: datetime, until: datetime, gpus):
    """
    The same rows with times as microseconds since the epoch: parsing 20,000 timestamps as text
    cost more than the query; integers cost a tenth of that.
    """
    a, r = Allocation._meta.db_table, Reservation._meta.db_table
    on_gpus, params = "", []
    if gpus is not None:
        subquery, params = gpus.values("pk").query.sql_with_params()
        on_gpus = f"AND a.gpu_id IN ({subquery}) "
    # Only the models' table names and the ORM's own SQL are formatted in; every value is a parameter.
    sql = (f"SELECT a.gpu_id, a.reservation_id, (EXTRACT(EPOCH FROM a.starts_at) * 1000000)::bigint, "  # noqa: S608
           f"(EXTRACT(EPOCH FROM a.ends_at) * 1000000)::bigint, a.mem_lo, a.mem_hi, r.billing_term = %s, r.score "
           f"FROM {a} a JOIN {r} r ON r.id = a.reservation_id WHERE a.ends_at > %s AND a.starts_at < %s "
           f"AND NOT a.archived {on_gpus}"
           f"ORDER BY a.starts_at")
    with connection.cursor() as cursor:
        cursor.execute(sql, [BillingTerm.SPOT, now, until, *params])
        rows = cursor.fetchall()
    micro = timedelta(microseconds=1)
    return ((g, rid, EPOCH + s * micro, EPOCH + e * micro, lo, hi, spot, score)
            for g, rid, s, e, lo, hi, spot, score in rows)
