"""
Release: a reservation's instances are cleaned by a release operation (wipe, leave the network,
attest after), started when the tenant releases or the window ends.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from cloud.choices import GPUState, NodeState, OfferingKind
from cloud.models import Node
from cloud.services import node_transition
from core.errors import Conflict
from provisioning import addresses, cloud_init
from provisioning.allocations import allocation_end
from provisioning.choices import InstanceState, OperationKind, OperationState
from provisioning.choices import ReservationState as R
from provisioning.lifecycle import dispatch as dispatching
from provisioning.lifecycle import moves, operation_state
from provisioning.lifecycle.steps import PIPELINES
from provisioning.models import Instance, Operation, Reservation
from provisioning.transitions import reservation_audited, reservation_transition
from security.audit import audit_record

log = logging.getLogger(__name__)
N = NodeState


#
# Release (cleaning)
#


def release_start(reservation: Reservation) -> Operation:
    """
    Clean up after a reservation that is ``releasing`` (inside the caller's transaction): stop
    its provisioning, mark its instances releasing, take its nodes or GPUs into cleaning, and
    enqueue the first cleaning step. With no instances it is released at once.
    """
    Operation.objects.filter(reservation=reservation, kind=OperationKind.PROVISION,
                             state__in=dispatching.UNFINISHED).update(
        state=OperationState.CANCELLED, error="Stopped: the reservation was released.", finished_at=timezone.now())
    live = list(reservation.instances.filter(state__in=[InstanceState.PROVISIONING, InstanceState.ACTIVE]))
    return clean_start(reservation, live)


def clean_start(reservation: Reservation, instances: list[Instance]) -> Operation:
    offering = reservation.offering
    steps = PIPELINES[(OperationKind.RELEASE, offering.kind)]
    operation = Operation.objects.create(tenant_id=reservation.tenant_id, reservation=reservation,
                                         kind=OperationKind.RELEASE, step=steps[0].name)
    Instance.objects.filter(pk__in=[i.pk for i in instances]).update(state=InstanceState.RELEASING,
                                                                     released_by=operation)
    if offering.kind == OfferingKind.BARE_METAL:
        for node in Node.objects.filter(pk__in={i.node_id for i in instances}, state=N.ALLOCATED):
            node_transition(actor=None, node=node, target=N.RELEASING, reason=f"Cleaning after {reservation.pk}.")
    elif offering.slots_per_gpu == 1:
        moves.gpus_move({d["gpu_id"] for i in instances for d in i.devices}, GPUState.ALLOCATED, GPUState.SCRUBBING)
    if instances:
        dispatching.enqueue(operation, steps[0].name)
    else:
        released(operation)  # nothing to clean: released at once
    return operation


def released(operation: Operation, *, outcome: str = OperationState.SUCCEEDED, error: str = "") -> None:
    reservation = operation.reservation
    instances = list(operation_state.instances_of(operation))
    Instance.objects.filter(pk__in=[i.pk for i in instances]).update(state=InstanceState.RELEASED)
    addresses.release(i.pk for i in instances)  # cleaned: their addresses go back to the pools
    cloud_init.drives_forget(i.pk for i in instances)
    if reservation.offering.kind == OfferingKind.BARE_METAL:
        for node in Node.objects.filter(pk__in={i.node_id for i in instances}, state=N.RELEASING):
            node_transition(actor=None, node=node, target=N.AVAILABLE, reason="Cleaned.")
    elif reservation.offering.slots_per_gpu == 1:
        moves.gpus_move({d["gpu_id"] for i in instances for d in i.devices}, GPUState.SCRUBBING, GPUState.AVAILABLE)
    operation_state.operation_close(operation, outcome, error)
    if reservation.instances.filter(state__in=[InstanceState.PROVISIONING, InstanceState.ACTIVE,
                                               InstanceState.RELEASING]).exists():
        return  # another attempt's instances are still live or being cleaned: that operation finishes it
    if moves.reservation_move(reservation, R.RELEASED, only_from={R.RELEASING}, reason=""):
        audit_record(actor=None, action="reservation.released", target=reservation, after={"state": R.RELEASED})


@transaction.atomic
def reservation_expire(*, reservation: Reservation) -> bool:
    """
    The window ended: release what is provisioning or running, or expire what never started
    (its capacity was never taken up). The system's act, audited. False if it moved on.
    """
    now = timezone.now()
    if reservation.state == R.SCHEDULED:
        try:
            reservation_transition(reservation, R.EXPIRED, only_from={R.SCHEDULED},
                                   reason="The window ended before it could start.")
        except Conflict:
            return False
        allocation_end(reservation=reservation, at=now)
        audit_record(actor=None, action="reservation.expire", target=reservation,
                     after=reservation_audited(reservation))
        return True
    try:
        reservation_transition(reservation, R.RELEASING, only_from={R.PROVISIONING, R.ACTIVE},
                               reason="The reservation's window ended.", released_at=now)
    except Conflict:
        return False
    allocation_end(reservation=reservation, at=now)
    release_start(reservation)
    audit_record(actor=None, action="reservation.expire", target=reservation, after=reservation_audited(reservation))
    return True


@transaction.atomic
def reservation_no_show(*, reservation: Reservation, evidence: dict, warned_at: str | None = None) -> bool:
    """
    Release an active reservation whose GPUs were never used as a no-show (provisioning.lifecycle.no_shows
    decides, with the evidence): it ends ``no_show`` at once -- counted against its team's
    fulfilment -- its capacity is free from now and its GPUs are cleaned like any release (the
    cleaning operation finishes without moving the reservation again). The system's act,
    audited with the evidence. False if it moved on meanwhile.
    """
    now = timezone.now()
    try:
        reservation_transition(
            reservation, R.NO_SHOW, only_from={R.ACTIVE}, released_at=now,
            reason="Released as a no-show: its GPUs showed no use after its start and after the warning.")
    except Conflict:
        return False
    allocation_end(reservation=reservation, at=now)
    release_start(reservation)
    audit_record(actor=None, action="reservation.no_show", target=reservation,
                 after={**reservation_audited(reservation), "warned_at": warned_at, "evidence": evidence})
    return True


@transaction.atomic
def reservation_reclaim(*, reservation: Reservation, evidence: dict) -> bool:
    """
    Take back the GPUs of a provisioning or active reservation held past its end plus its
    offering's release grace (provisioning.lifecycle.no_shows): released now, so ``released_at - ends_at``
    is the release delay its team's record reads. The system's act, audited with the delay and
    the evidence. False if it moved on meanwhile.
    """
    now = timezone.now()
    try:
        reservation_transition(reservation, R.RELEASING, only_from={R.PROVISIONING, R.ACTIVE}, released_at=now,
                               reason="Reclaimed: its GPUs were held past its end and the release grace.")
    except Conflict:
        return False
    allocation_end(reservation=reservation, at=now)
    release_start(reservation)
    audit_record(actor=None, action="reservation.reclaim", target=reservation,
                 after={**reservation_audited(reservation), "released_at": now.isoformat(),
                        "release_delay_s": round((now - reservation.ends_at).total_seconds(), 3),
                        "evidence": evidence})
    return True
