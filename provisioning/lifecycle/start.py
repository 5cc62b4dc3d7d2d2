"""
Start provisioning: reservations whose window opened get a provision operation, instances on
their allocations and the first step sent; a reservation that cannot start goes back to the
queue keeping its place (``requeue``), and each re-placement is recorded on it (``replaced``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import timedelta

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from cloud.choices import GPUState, NodeState, OfferingKind
from cloud.services import node_transition
from core.errors import Conflict
from provisioning import addresses, lock_objects
from provisioning.allocations import allocation_end
from provisioning.choices import InstanceState, OperationKind
from provisioning.choices import ReservationState as R
from provisioning.lifecycle import dispatch as dispatching
from provisioning.lifecycle import moves
from provisioning.lifecycle.steps import PIPELINES
from provisioning.models import Allocation, Instance, Operation, Reservation
from provisioning.scheduling.planner import topology
from provisioning.transitions import reservations_changed
from security.audit import audit_record_many

log = logging.getLogger(__name__)
N = NodeState


def reservations_start(reservation_ids: list[str]) -> int:
    """
    Start reservations placed together in one transaction (their rows read and written in a
    statement or two for them all); if that fails, each is started in its own, and one that fails
    then is logged and left to the tick while the others go on. The operations started go through
    their steps together: one message for those at the same first step. Returns how many started.

    A message that names fewer than STARTS_PER_TASK takes on others placed moments ago whose own
    messages are still queued (creates placed at once send one each): under a burst they are
    started in batches, and their messages, when they come, find them started.
    """
    reservation_ids = [str(pk) for pk in reservation_ids]
    also = _placed_just_now(exclude=reservation_ids, limit=dispatching.STARTS_PER_TASK - len(reservation_ids))
    try:
        operations = provision_start_many(reservation_ids, also=also)
    except Exception:
        log.warning("Starting %d reservations together failed; starting each alone.", len(reservation_ids),
                    exc_info=True)
        operations = []
        for reservation_id in reservation_ids + also:
            try:
                operations += provision_start_many([reservation_id])
            except Exception:
                log.exception("Starting reservation %s failed; the lifecycle tick tries again.", reservation_id)
    started: dict[str, list[Operation]] = defaultdict(list)
    for operation in operations:
        started[operation.step].append(operation)
    # A worker lost before this (autocommitted) dispatch leaves them pending: the reaper resumes them.
    for step, batch in started.items():
        dispatching.enqueue(batch, step)
    return len(operations)


# A reservation placed this recently and not started has its start message on the way (or queued).
JUST_PLACED = timedelta(seconds=30)


def _placed_just_now(*, exclude: list[str], limit: int) -> list[str]:
    if limit <= 0:
        return []
    now = timezone.now()
    due = (Reservation.objects.filter(state=R.SCHEDULED, scheduled_at__gte=now - JUST_PLACED,
                                      starts_at__lte=now + timedelta(seconds=1))
           .exclude(pk__in=exclude).order_by("scheduled_at").values_list("pk", flat=True)[:limit])
    return [str(pk) for pk in due]


#
# Start provisioning
#


@transaction.atomic
def reservation_provision_start(reservation_id, *, now=None) -> Operation | None:
    """
    Begin provisioning a scheduled reservation whose window has opened: one instance per unit,
    its nodes (bare metal) or GPUs (whole GPUs on shared hosts) taken, the first step enqueued.
    None when it is not due, moved on, or its nodes are still being cleaned (the tick retries).
    """
    operations = provision_start_many([reservation_id], now=now)
    for operation in operations:
        dispatching.enqueue(operation, operation.step)
    return operations[0] if operations else None


@transaction.atomic
def provision_start_many(reservation_ids, *, now=None, also=()) -> list[Operation]:
    """
    ``reservation_provision_start`` for several reservations, their first steps not yet sent:
    each read, locked and written in one statement for them all (locks in key order). ``also``:
    more to start if no one else holds them (their locks skipped, not waited for, and taken after
    the others': this transaction never waits once it holds one of them, so closes no cycle).
    """
    now = now or timezone.now()
    rows = Reservation.objects.select_related("offering", "region", "tenant").order_by("pk")
    named = list(rows.select_for_update(of=("self",)).filter(pk__in=list(reservation_ids)))
    extra = list(rows.select_for_update(of=("self",), skip_locked=True).filter(pk__in=list(also))) if also else []
    reservations = [r for r in named + extra if r.state == R.SCHEDULED and r.starts_at <= now + timedelta(seconds=1)]
    # Only what they hold now: an earlier attempt's allocations stay as history, ended.
    held = defaultdict(list)
    for allocation in (Allocation.objects.filter(reservation__in=reservations, ends_at__gt=now)
                       .select_related("gpu", "node").order_by("node__hostname", "gpu__index", "mem_lo")):
        held[allocation.reservation_id].append(allocation)
    scrubbing = _previous_tenant_still_there([a for allocations in held.values() for a in allocations])
    whole_gpus = {a.gpu_id for r in reservations if r.offering.kind != OfferingKind.BARE_METAL
                  and r.offering.slots_per_gpu == 1 for a in held[r.pk]}
    gpu_states = lock_objects.gpus_lock(whole_gpus)
    ready, taking = [], set()
    for reservation in reservations:
        allocations = held[reservation.pk]
        nodes = {a.node_id: a.node for a in allocations}
        lost = [node for node in nodes.values() if node.state in dispatching.LOST_NODE_STATES]
        if lost:
            requeue(reservation, f"Node {lost[0].hostname} became {lost[0].state} before the start; "
                                  "placing the reservation again.")
            continue
        if any((a.gpu_id, a.mem_lo, a.mem_hi) in scrubbing for a in allocations):
            continue  # the memory is still being scrubbed after its previous tenant: the tick tries again
        short = addresses.waiting_reason(reservation, reservation.units)
        if short:
            # Stays scheduled with its capacity, nothing taken; the tick tries again once addresses are released.
            Reservation.objects.filter(pk=reservation.pk).update(state_reason=short[:500])
            continue
        offering = reservation.offering
        if offering.kind == OfferingKind.BARE_METAL:
            if any(node.state != N.AVAILABLE for node in nodes.values()):
                continue  # the previous tenant's cleaning is still running: the tick tries again
            for node in nodes.values():
                node_transition(actor=None, node=node, target=N.ALLOCATED, reason=f"Reservation {reservation.pk}.")
        elif offering.slots_per_gpu == 1:
            states = {gpu_states.get(a.gpu_id) for a in allocations}
            if GPUState.QUARANTINED in states:
                requeue(reservation, "A GPU was quarantined before the start; placing the reservation again.")
                continue
            if states != {GPUState.AVAILABLE}:
                continue  # a GPU is still being scrubbed after its previous tenant
            taking |= {a.gpu_id for a in allocations}
        ready.append(reservation)
    if not ready:
        return []
    if taking:
        moves.gpus_move(taking, GPUState.AVAILABLE, GPUState.ALLOCATED)
    # Locked above and still scheduled: all of them move, or the transaction is undone.
    moved = Reservation.objects.filter(pk__in=[r.pk for r in ready], state=R.SCHEDULED).update(
        state=R.PROVISIONING, state_reason="Provisioning.", state_changed_at=now)
    if moved != len(ready):
        raise Conflict("A reservation moved on while provisioning started.", code="invalid_transition")
    for reservation in ready:
        reservation.state, reservation.state_reason, reservation.state_changed_at = R.PROVISIONING, "Provisioning.", now
    reservations_changed(ready)
    operations = Operation.objects.bulk_create([
        Operation(tenant_id=r.tenant_id, reservation=r, kind=OperationKind.PROVISION,
                  step=PIPELINES[(OperationKind.PROVISION, r.offering.kind)][0].name) for r in ready])
    for reservation in ready:
        reservation.state, reservation.state_reason, reservation.state_changed_at = R.PROVISIONING, "Provisioning.", now
    instances_create_many([(r, held[r.pk], operation) for r, operation in zip(ready, operations, strict=True)])
    audit_record_many(actor=None, action="reservation.provision", changes=[
        (r, {"state": R.PROVISIONING, "operation": str(operation.pk)}) for r, operation in zip(ready, operations,
                                                                                             strict=True)])
    return operations


def _previous_tenant_still_there(allocations: list) -> set:
    """
    The allocations' memory (gpu, mem_lo, mem_hi) that still belongs to an instance being cleaned
    (a slot's scrub has no other gate).
    """
    if not allocations:
        return set()
    busy = set()
    for devices in Instance.objects.filter(state=InstanceState.RELEASING, node_id__in={a.node_id for a in allocations}
                                           ).values_list("devices", flat=True):
        for d in devices:
            busy |= {(gpu, lo, hi) for gpu, lo, hi in ((a.gpu_id, a.mem_lo, a.mem_hi) for a in allocations)
                     if str(gpu) == d["gpu_id"] and lo < d["mem_hi"] and d["mem_lo"] < hi}
    return busy


def instances_create(reservation: Reservation, allocations: list, operation: Operation) -> list[Instance]:
    return instances_create_many([(reservation, allocations, operation)])


def instances_create_many(starts: list[tuple[Reservation, list, Operation]]) -> list[Instance]:
    """One instance per unit: a bare-metal node, a VM's GPUs on one host, or a container's GPUs or slot."""
    # Serial numbers go on after earlier attempts' instances (a re-placed reservation keeps them).
    last = dict(Instance.objects.filter(reservation__in=[r for r, _, _ in starts]).values("reservation")
                .annotate(last=Max("index")).values_list("reservation", "last"))
    instances = []
    for reservation, allocations, operation in starts:
        offering = reservation.offering
        units: list[tuple] = []
        by_node: dict = {}
        for a in allocations:
            by_node.setdefault(a.node_id, []).append(a)
        for on_node in by_node.values():
            per_unit = len(on_node) if offering.kind == OfferingKind.BARE_METAL else (
                1 if offering.slots_per_gpu > 1 else offering.gpus_per_unit)
            # Several multi-GPU units on one host split as the planner chose them: the best-linked sets.
            split = (topology.split([_place(a.gpu) for a in on_node], per_unit) if 1 < per_unit < len(on_node)
                     else [range(i, min(i + per_unit, len(on_node))) for i in range(0, len(on_node), per_unit)])
            units += [(on_node[0].node, [on_node[i] for i in unit]) for unit in split]
        first = last[reservation.pk] + 1 if reservation.pk in last else 0

        def name(node, index, reservation=reservation, offering=offering):
            # A server is its node; a VM or pod is named for the host's hypervisor or kubelet.
            return node.hostname if offering.kind == OfferingKind.BARE_METAL else f"r{reservation.pk.hex[:12]}-{index}"

        instances += [
            Instance(tenant_id=reservation.tenant_id, team_id=reservation.team_id, reservation=reservation, node=node,
                     provisioned_by=operation, index=first + i, kind=offering.kind, name=name(node, first + i),
                     devices=[{"gpu_id": str(a.gpu_id), "index": a.gpu.index, "pci_bus_id": a.gpu.pci_bus_id,
                               "mem_lo": a.mem_lo, "mem_hi": a.mem_hi} for a in on_node],
                     topology=topology.record([a.gpu.index for a in on_node], [_place(a.gpu) for a in on_node]))
            for i, (node, on_node) in enumerate(units)
        ]
    made = Instance.objects.bulk_create(instances)
    for reservation, _, _ in starts:
        addresses.assign([i for i in made if i.reservation_id == reservation.pk], region=reservation.region.slug,
                         public=reservation.public_ip, tenant_slug=reservation.tenant.slug)
    return made


def _place(gpu) -> topology.Place:
    return gpu.nvlink_domain, gpu.pcie_switch, gpu.numa_node


def requeue(reservation: Reservation, reason: str) -> None:
    """
    Back to the queue keeping its place (submitted_at is unchanged), its capacity given back (the
    time it held stays in its allocations, and in its spend); the reason stays on it as its last
    re-placement's once the state has moved on.
    """
    now = timezone.now()
    allocation_end(reservation=reservation, at=now)
    moves.reservation_move(reservation, R.QUEUED, only_from={R.SCHEDULED, R.PROVISIONING}, reason=reason[:500],
                      starts_at=None, ends_at=None, region=None, **replaced(reservation, reason, now))


def replaced(reservation: Reservation, reason: str, now) -> dict:
    """The fields that record one more re-placement of ``reservation`` (what the tenant reads on it)."""
    return {"replacements": reservation.replacements + 1, "replaced_at": now, "replacement_reason": reason[:500]}
