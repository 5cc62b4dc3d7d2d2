"""
An operation's own records, as every part of the lifecycle reads and keeps them: its instances,
the context its steps run in, its row locks (in the order of ``provisioning.lock_objects``) and
closing it in a final state.
"""

from __future__ import annotations

import logging

from django.utils import timezone

from cloud.choices import NodeState
from provisioning import lock_objects
from provisioning.choices import InstanceState, OperationKind, OperationState
from provisioning.drivers import drivers_for
from provisioning.lifecycle.steps import Context
from provisioning.models import Instance, Operation

log = logging.getLogger(__name__)
N = NodeState


OPERATION_WITH = ("reservation__offering", "reservation__region", "reservation__vpc__fabric__region", "node__region")


def instances_of(operation: Operation):
    """The instances this operation works on: its own, still in the state it moves them from."""
    return instances_of_many([operation])


def instances_of_many(operations: list[Operation]):
    """The instances these operations work on (a provisioning's or a cleaning's, not both)."""
    if operations[0].kind == OperationKind.RELEASE:
        return Instance.objects.filter(released_by__in=operations, state=InstanceState.RELEASING)
    return Instance.objects.filter(provisioned_by__in=operations, state=InstanceState.PROVISIONING)


def context(operation: Operation) -> Context:
    return contexts([operation])[operation.pk]


def contexts(operations: list[Operation]) -> dict:
    """Each operation's context, their instances read in one query per kind of operation."""
    instances: dict = {operation.pk: [] for operation in operations}
    releasing = [operation for operation in operations if operation.kind == OperationKind.RELEASE]
    for group in (releasing, [operation for operation in operations if operation.kind != OperationKind.RELEASE]):
        with_reservation = [operation for operation in group if operation.reservation_id]
        if not with_reservation:
            continue
        owner = "released_by_id" if group is releasing else "provisioned_by_id"
        for instance in instances_of_many(with_reservation).select_related("node__region", "node__fabric__region"):
            instances[getattr(instance, owner)].append(instance)
    contexts = {}
    for operation in operations:
        mine = instances[operation.pk]
        # The hardware's region picks the drivers (a re-queued reservation has no region of its own).
        node = operation.node or (mine[0].node if mine else None)
        region = node.region.slug if node else operation.reservation.region.slug
        contexts[operation.pk] = Context(operation=operation, drivers=drivers_for(region),
                                         reservation=operation.reservation, instances=mine, node=operation.node)
    return contexts


def operation_lock(operation: Operation) -> Operation:
    """
    Lock the reservation, then the operation (``provisioning.lock_objects``' order).
    """
    if operation.reservation_id:
        lock_objects.reservations_lock([operation.reservation_id])
    return Operation.objects.select_for_update(of=("self",)).select_related(*OPERATION_WITH).get(pk=operation.pk)


def operations_lock(operations: list[Operation], *, reservations_too: bool = True) -> dict:
    """
    ``operation_lock`` for a batch: the reservations, then the operations, each in key order (no deadlock
    between batches). Without ``reservations_too`` only the operations: a transaction that will
    not touch the reservations cannot close a cycle with one that holds a reservation and waits
    for its operation. Returns what may have changed since the batch read them: each
    operation's state, step and dispatch token, by key (the rest it already holds).
    """
    reservations = sorted({operation.reservation_id for operation in operations if operation.reservation_id})
    if reservations and reservations_too:
        lock_objects.reservations_lock(reservations)
    return lock_objects.operations_lock([operation.pk for operation in operations])


def operation_close(operation: Operation, state: str, error: str = "") -> None:
    Operation.objects.filter(pk=operation.pk).update(
        state=state, error=error[:2000], finished_at=timezone.now(),
        **({"progress": 100} if state == OperationState.SUCCEEDED else {}))
