"""
Picking replacement capacity for a reservation's lost units, always in the failed node's fabric
(the tenant's IB-VPC lives there): spares first -- the same leaf switch, then the same pod, then
any leaf -- then, when MERIDIAN_REPLACEMENT_FROM_POOL is on, ordinary free capacity of that fabric.
Whole servers for bare metal, whole GPUs for VMs and containers, slots for fractional offerings.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import Case, Exists, IntegerField, OuterRef, Q, Value, When

from cloud.choices import GPUState, NodePool, NodeState, OfferingKind
from cloud.models import GPU, Node
from provisioning.capacity import SELLABLE_HEALTH
from provisioning.choices import InstanceState, OperationKind, OperationState
from provisioning.models import Allocation, Instance, Operation
from provisioning.scheduling.plan_types import Assignment
from provisioning.scheduling.planner.state import slot_layout, slot_range

N = NodeState
UNFINISHED = (OperationState.PENDING, OperationState.RUNNING)


@dataclass(frozen=True)
class Pick:
    """One unit's new capacity: its node and the GPU memory it takes there."""
    node: Node
    assignments: tuple[Assignment, ...]
    spare: bool
    same_leaf: bool


def pick(reservation, failed: Node, units: int, *, start: datetime, end: datetime, exclude=()) -> list[Pick]:
    """
    Capacity for up to ``units`` units of the reservation in ``failed``'s fabric, free for
    ``[start, end)``, never on the failed node, never held by anyone: spares first, then (when
    MERIDIAN_REPLACEMENT_FROM_POOL) ordinary capacity; within each, the failed node's leaf
    switch, then its pod, then any leaf. Fewer than asked when that is all there is.
    """
    offering = reservation.offering
    if offering.kind == OfferingKind.BARE_METAL:
        return _pick_nodes(reservation, failed, units, start, end, exclude)
    if offering.slots_per_gpu == 1:
        return _pick_gpus(reservation, failed, units, start, end, exclude)
    return _pick_slots(reservation, failed, units, start, end, exclude)


def _nearness(failed: Node, prefix: str = ""):
    """0 on the failed node's leaf, 1 on its pod, 2 elsewhere in the fabric (lower is nearer)."""
    return Case(When(**{f"{prefix}leaf_id": failed.leaf_id}, then=Value(0)),
                When(**{f"{prefix}leaf__pod": failed.leaf.pod}, then=Value(1)),
                default=Value(2), output_field=IntegerField())


def _hosts(reservation, failed: Node, pool: str, states, exclude):
    """
    Nodes of the failed node's fabric that may take the work (spares only, unless the pool may be
    used), of the reservation's kind of capacity: confidential work only on confidential nodes and
    ordinary work never there.
    """
    attesting = Operation.objects.filter(node=OuterRef("pk"), kind=OperationKind.ATTEST, state__in=UNFINISHED)
    nodes = (Node.objects.filter(fabric_id=failed.fabric_id, pool=pool, state__in=states, health__in=SELLABLE_HEALTH,
                                 confidential=reservation.offering.confidential)
             .exclude(pk__in=[failed.pk, *exclude]).exclude(Exists(attesting)))
    return nodes if settings.MERIDIAN_REPLACEMENT_FROM_POOL else nodes.filter(is_spare=True)


def _pick_nodes(reservation, failed, units, start, end, exclude) -> list[Pick]:
    """Whole available nodes of the GPU model with every GPU sound and nothing held on them in the window."""
    busy = Allocation.objects.filter(node=OuterRef("pk"), starts_at__lt=end, ends_at__gt=start)
    unsound = GPU.objects.filter(node=OuterRef("pk")).filter(
        ~Q(health__in=SELLABLE_HEALTH) | Q(state=GPUState.QUARANTINED) | ~Q(model_id=reservation.gpu_model_id))
    nodes = (_hosts(reservation, failed, NodePool.BARE_METAL, [N.AVAILABLE], exclude)
             .filter(gpus_installed=reservation.offering.gpus_per_unit).exclude(Exists(busy)).exclude(Exists(unsound))
             .annotate(nearness=_nearness(failed))
             .select_related("fabric", "leaf").order_by("-is_spare", "nearness", "hostname")[:units])
    picks = []
    for node in nodes:
        gpus = node.gpus.order_by("index").values_list("pk", "memory_mib")
        picks.append(Pick(node=node, assignments=tuple(Assignment(node.pk, gpu, 0, memory) for gpu, memory in gpus),
                          spare=node.is_spare, same_leaf=node.leaf_id == failed.leaf_id))
    return picks


def _free_gpus(reservation, failed, start, end, exclude, *, whole: bool):
    """Sound GPUs of the model on in-service hosts of the fabric, nearest first; whole: nothing held in the window."""
    hosts = _hosts(reservation, failed, NodePool.SHARED, [N.IN_SERVICE, N.AVAILABLE], exclude)
    gpus = GPU.objects.filter(node__in=hosts, model_id=reservation.gpu_model_id, health__in=SELLABLE_HEALTH,
                              state=GPUState.AVAILABLE)
    if whole:
        busy = Allocation.objects.filter(gpu=OuterRef("pk"), starts_at__lt=end, ends_at__gt=start)
        gpus = gpus.exclude(Exists(busy))
    return (gpus.annotate(nearness=_nearness(failed, "node__")).select_related("node__leaf")
            .order_by("-node__is_spare", "nearness", "node__hostname", "index"))


def _pick_gpus(reservation, failed, units, start, end, exclude) -> list[Pick]:
    """Whole GPUs, ``gpus_per_unit`` on one host per unit: spares and near hosts first, then the fullest (best fit)."""
    size = reservation.offering.gpus_per_unit
    by_host: dict = {}
    for gpu in _free_gpus(reservation, failed, start, end, exclude, whole=True):
        by_host.setdefault(gpu.node_id, []).append(gpu)
    picks = []
    for _ in range(units):
        holding = [gpus for gpus in by_host.values() if len(gpus) >= size]
        if not holding:
            break
        # Spares, then nearness, then best fit: the host with the fewest free GPUs that holds the unit.
        gpus = min(holding, key=lambda g: (not g[0].node.is_spare, g[0].nearness, len(g), g[0].node.hostname))
        taken, by_host[gpus[0].node_id] = gpus[:size], gpus[size:]
        node = taken[0].node
        picks.append(Pick(node=node, assignments=tuple(Assignment(node.pk, g.pk, 0, g.memory_mib) for g in taken),
                          spare=node.is_spare, same_leaf=node.leaf_id == failed.leaf_id))
    return picks


def _pick_slots(reservation, failed, units, start, end, exclude) -> list[Pick]:
    """
    Fractional slots: a free slot of the offering's layout on a GPU that carries only that layout
    in the window (so its MIG layout stays), and whose memory no instance is still being cleaned
    from. GPUs already carrying slots come first among equals (packing keeps whole GPUs free).
    """
    n = reservation.offering.slots_per_gpu
    gpus = list(_free_gpus(reservation, failed, start, end, exclude, whole=False))
    held: dict = {}  # by GPU id as text: an instance's devices name their GPUs so
    for gpu_id, lo, hi in Allocation.objects.filter(gpu__in=[g.pk for g in gpus], starts_at__lt=end,
                                                    ends_at__gt=start).values_list("gpu_id", "mem_lo", "mem_hi"):
        held.setdefault(str(gpu_id), []).append((lo, hi))
    for devices in Instance.objects.filter(state=InstanceState.RELEASING, node_id__in={g.node_id for g in gpus}
                                           ).values_list("devices", flat=True):
        for d in devices:  # memory still being scrubbed after its previous tenant
            held.setdefault(d["gpu_id"], []).append((d["mem_lo"], d["mem_hi"]))
    free = []
    for gpu in gpus:
        ranges = held.get(str(gpu.pk), [])
        if any(slot_layout(gpu.memory_mib, lo, hi) != n for lo, hi in ranges):
            continue  # a whole-GPU holder, or another layout: the GPU cannot be cut into this one now
        for k in range(n):
            lo, hi = slot_range(gpu.memory_mib, n, k)
            if not any(lo < other_hi and other_lo < hi for other_lo, other_hi in ranges):
                free.append((not gpu.node.is_spare, gpu.nearness, -len(ranges), gpu.node.hostname, gpu.index, k,
                             gpu, lo, hi))
    free.sort(key=lambda f: f[:6])
    return [Pick(node=gpu.node, assignments=(Assignment(gpu.node_id, gpu.pk, lo, hi),), spare=gpu.node.is_spare,
                 same_leaf=gpu.node.leaf_id == failed.leaf_id) for *_, gpu, lo, hi in free[:units]]
