"""
From the database to the planner's plain data: capacity snapshots and requests.

Platform-wide on purpose (the scheduler sees the whole fleet). Spares, nodes that may not take
work and GPUs that are not healthy never enter a snapshot, so the planner cannot pick them.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.conf import settings
from django.db.models import Exists, OuterRef

from cloud.capacity import SELLABLE_HEALTH
from cloud.choices import GPUState, NodePool, OfferingKind
from cloud.models import GPU, Node

from .allocations import ALLOCATABLE_NODE_STATES
from .choices import BillingTerm
from .models import Allocation, Reservation
from .plan_types import Busy, GPUCapacity, NodeCapacity, Request, Snapshot

UNUSABLE_GPU_STATES = [GPUState.QUARANTINED]


def load_snapshot(*, now: datetime, until: datetime, regions=None, gpu_model_ids=None, pool=None,
                  free_only: bool = False) -> Snapshot:
    """
    Capacity of the sellable fleet (optionally narrowed), with every allocation overlapping
    [now, until). ``free_only``: only GPUs with nothing in that window (what a whole-GPU request
    can use without evicting anyone) -- a fraction of the rows when the fleet is busy.
    """
    nodes = Node.objects.filter(is_spare=False, state__in=ALLOCATABLE_NODE_STATES, health__in=SELLABLE_HEALTH)
    if regions is not None:
        nodes = nodes.filter(region__slug__in=list(regions))
    if pool is not None:
        nodes = nodes.filter(pool=pool)
    gpus = GPU.objects.filter(node__in=nodes, health__in=SELLABLE_HEALTH).exclude(state__in=UNUSABLE_GPU_STATES)
    if gpu_model_ids is not None:
        gpus = gpus.filter(model_id__in=list(gpu_model_ids))

    busy = defaultdict(list)
    in_window = Allocation.objects.filter(ends_at__gt=now, starts_at__lt=until)
    if free_only:
        gpus = gpus.exclude(Exists(in_window.filter(gpu=OuterRef("pk"))))
        in_window = in_window.none()
    allocations = in_window.filter(gpu__in=gpus).values_list(
        "gpu_id", "reservation_id", "starts_at", "ends_at", "mem_lo", "mem_hi", "reservation__billing_term",
        "reservation__score",
    )
    for gpu_id, reservation_id, start, end, lo, hi, term, score in allocations:
        busy[gpu_id].append(Busy(reservation_id=reservation_id, start=start, end=end, mem_lo=lo, mem_hi=hi,
                                 preemptible=term == BillingTerm.SPOT, priority=score))

    by_node = defaultdict(list)
    models = {}
    for gpu_id, node_id, index, memory, model_id in gpus.values_list("id", "node_id", "index", "memory_mib",
                                                                       "model_id"):
        by_node[node_id].append(GPUCapacity(gpu_id=gpu_id, index=index, memory_mib=memory,
                                            busy=sorted(busy.get(gpu_id, []), key=lambda b: b.start)))
        models[node_id] = model_id
    capacity = [
        NodeCapacity(node_id=node_id, region=region, fabric_id=fabric_id, leaf_id=leaf_id, pod=pod, pool=node_pool,
                     gpu_model_id=models[node_id], gpus=sorted(by_node[node_id], key=lambda g: g.index))
        for node_id, region, fabric_id, leaf_id, pod, node_pool in nodes.filter(pk__in=list(by_node)).values_list(
            "id", "region__slug", "fabric_id", "leaf_id", "leaf__pod", "pool")
    ]
    return Snapshot(now=now, nodes=capacity)


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
    )
