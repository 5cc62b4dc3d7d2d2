"""
What an operation's end means, per kind: a provision hands the reservation over (or places it
again, or fails it past MERIDIAN_PROVISION_FAILURES), a release frees its nodes, a validation or
attestation makes the node available -- or, on a failure for good, the node is failed and what it
held is handled (``FAILURES``).
"""

from __future__ import annotations

import logging
from collections import defaultdict

from django.conf import settings
from django.utils import timezone

from cloud.choices import GPUState, Health, NodePool, NodeState, OfferingKind
from cloud.models import Node
from cloud.services import node_transition
from core.errors import Conflict
from provisioning import addresses, cloud_init, images, notices
from provisioning.allocations import allocation_end
from provisioning.choices import InstanceState, OperationKind, OperationState
from provisioning.choices import ReservationState as R
from provisioning.lifecycle import dispatch as dispatching
from provisioning.lifecycle import moves, operation_state
from provisioning.lifecycle import release as releasing
from provisioning.lifecycle import start as starting
from provisioning.lifecycle.replacement import (
    attempt_failed,
    node_failed_in_lifecycle,
    open_incidents,
    open_incidents_of,
    reservation_restored,
    settled,
)
from provisioning.lifecycle.steps import NodeFault, instances_abandon
from provisioning.models import Instance, Operation, Reservation
from provisioning.networks.ports import ports_abandon
from provisioning.transitions import reservations_changed
from security.audit import audit_record, audit_record_many
from security.models import Incident

log = logging.getLogger(__name__)
N = NodeState


def node_failed(node: Node, reason: str, *, reservation_id=None) -> None:
    """
    The node is faulty. Other tenants' live work on it (a shared host) is replaced
    (provisioning.lifecycle.replacement); ``reservation_id``, whose step failed, is handled by the caller.
    """
    node.refresh_from_db(fields=["state"])
    if node.state != N.FAULTY:
        try:
            node_transition(actor=None, node=node, target=N.FAULTY, reason=reason)
        except Conflict:
            log.warning("Could not mark %s faulty from %s: %s", node.hostname, node.state, reason)
            return
    node_failed_in_lifecycle(node, reason, reservation_id=reservation_id)


#
# Outcomes, per kind of operation
#


def finish_many(operations: list[Operation]) -> None:
    """Operations whose last step succeeded: provisionings together, the others one by one."""
    provisioned = [operation for operation in operations if operation.kind == OperationKind.PROVISION]
    if provisioned:
        _provisioned_many(provisioned)
    for operation in operations:
        if operation.kind != OperationKind.PROVISION:
            finish(operation)


def finish(operation: Operation) -> None:
    {OperationKind.PROVISION: _provisioned, OperationKind.RELEASE: releasing.released,
     OperationKind.VALIDATE: _validated, OperationKind.ATTEST: _attested}[operation.kind](operation)


def _provisioned(operation: Operation) -> None:
    _provisioned_many([operation])


def _provisioned_many(operations: list[Operation]) -> None:
    """
    Provisionings whose last step succeeded (their reservations locked by the caller): instances
    active with their addresses, operations closed, reservations active and audited -- one
    statement each for them all; a reservation whose hardware is being replaced goes its own way.
    """
    now = timezone.now()
    by_login, default_images = defaultdict(list), images.defaults()
    for operation in operations:
        by_login[images.boot_of(operation.reservation, default_images=default_images).login_user].append(operation)
    for login, group in by_login.items():
        # Their addresses and DNS names were given when provisioning started (provisioning.addresses).
        operation_state.instances_of_many(group).update(state=InstanceState.ACTIVE, ssh_user=login)
    Operation.objects.filter(pk__in=[operation.pk for operation in operations]).update(
        state=OperationState.SUCCEEDED, error="", finished_at=now, progress=100)
    replacing = open_incidents_of(operation.reservation_id for operation in operations)
    for operation in operations:
        reservation, incidents = operation.reservation, replacing.get(operation.reservation_id)
        if incidents is None:
            continue
        if not settled(reservation):
            continue  # another attempt still provisions, or units still wait for capacity: the last one activates
        if moves.reservation_move(reservation, R.ACTIVE, only_from={R.PROVISIONING}, reason=""):
            audit_record(actor=None, action="reservation.active", target=reservation, after={"state": R.ACTIVE})
            reservation_restored(reservation=reservation, incidents=incidents)
    # Still provisioning (a cancel may have won): read under the caller's locks, moved in one UPDATE.
    moving = set(Reservation.objects.filter(
        pk__in=[o.reservation_id for o in operations if o.reservation_id not in replacing],
        state=R.PROVISIONING).values_list("pk", flat=True))
    if not moving:
        return
    Reservation.objects.filter(pk__in=moving, state=R.PROVISIONING).update(state=R.ACTIVE, state_reason="",
                                                                          state_changed_at=now)
    activated = [operation.reservation for operation in operations if operation.reservation_id in moving]
    for reservation in activated:
        reservation.state, reservation.state_reason, reservation.state_changed_at = R.ACTIVE, "", now
    reservations_changed(activated)
    audit_record_many(actor=None, action="reservation.active",
                      changes=[(reservation, {"state": R.ACTIVE}) for reservation in activated])
    notices.reservations_notify(activated, notices.READY)


def _validated(operation: Operation) -> None:
    node = operation.node
    target = N.IN_SERVICE if node.pool == NodePool.SHARED else N.AVAILABLE
    node_transition(actor=None, node=node, target=target, reason="Validation passed.")
    Node.objects.filter(pk=node.pk).update(health=Health.HEALTHY)
    node.gpus.update(health=Health.HEALTHY)
    # Burnt in and verified: GPUs held out after a failed scrub or provisioning are clean again.
    moves.gpus_move(node.gpus.filter(state=GPUState.QUARANTINED).values_list("pk", flat=True), GPUState.QUARANTINED,
               GPUState.AVAILABLE)
    operation_state.operation_close(operation, OperationState.SUCCEEDED)


def _provision_failed(operation: Operation, fault: NodeFault, message: str) -> None:
    """The node is faulty; the others are cleaned; the reservation is placed again or fails."""
    reservation = Reservation.objects.select_for_update().select_related("offering").get(pk=operation.reservation_id)
    if fault.blame:  # attestation holds the node (or its GPUs) itself; a request fault leaves it be
        node_failed(fault.node, f"Provisioning failed: {fault.cause}", reservation_id=reservation.pk)
    operation_state.operation_close(operation, OperationState.FAILED, message)
    instances = list(operation_state.instances_of(operation))
    on_faulty = [i for i in instances if i.node_id == fault.node.pk and (fault.blame or fault.held)]
    # Never cleaned (their node is held): their ports still leave the tenant's network now, and
    # their VMs or pods go if the host still answers.
    ports_abandon(on_faulty)
    instances_abandon(on_faulty, tenant_id=reservation.tenant_id)
    Instance.objects.filter(pk__in=[i.pk for i in on_faulty]).update(state=InstanceState.FAILED)
    addresses.release(i.pk for i in on_faulty)  # the others' go back when they are cleaned
    cloud_init.drives_forget(i.pk for i in on_faulty)
    if reservation.offering.kind != OfferingKind.BARE_METAL and reservation.offering.slots_per_gpu == 1:
        # Never scrubbed, maybe half set up: held out until the node is repaired and validated.
        moves.gpus_move({d["gpu_id"] for i in on_faulty for d in i.devices}, GPUState.ALLOCATED, GPUState.QUARANTINED)
    releasing.clean_start(reservation, [i for i in instances if i not in on_faulty])
    failures = reservation.provision_failures + 1
    Reservation.objects.filter(pk=reservation.pk).update(provision_failures=failures)

    if open_incidents(reservation):
        # Its hardware failed under it: only this attempt's units are placed again (the others keep running).
        attempt_failed(reservation=reservation, instances=instances, failures=failures, cause=fault.cause)
    elif failures < settings.MERIDIAN_PROVISION_FAILURES:
        starting.requeue(reservation, f"Provisioning failed on a node ({fault.cause}); placing the reservation again, "
                              "keeping its place in the queue.")
    else:
        allocation_end(reservation=reservation, at=timezone.now())
        if moves.reservation_move(reservation, R.FAILED, only_from={R.PROVISIONING},
                             reason=f"Provisioning failed on {failures} nodes; last: {fault.cause}"):
            notices.reservations_notify([reservation], notices.FAILED)
    audit_record(actor=None, action="reservation.provision_failed", target=reservation,
                 after={"error": message[:500], "failures": failures})


def _release_failed(operation: Operation, fault: NodeFault, message: str) -> None:
    """
    Cleaning failed for good on one node: that node goes faulty (never back to the pool) with
    the reason, its instance is released; cleaning goes on for the others. A scrub that cannot be
    verified quarantines what held the tenant's memory instead: the GPUs of a shared host (its
    other tenants go on), or the whole bare-metal node -- never re-sold until validated again.
    """
    reservation = operation.reservation
    shared = reservation.offering.kind != OfferingKind.BARE_METAL
    if fault.blame and operation.step == "scrub":
        _scrub_unverified(fault.node, fault.cause, whole_node=not shared)
    elif fault.blame:  # attestation holds the node (or its GPUs) itself
        node_failed(fault.node, f"Cleaning failed: {fault.cause}", reservation_id=reservation.pk)
    on_node = list(operation_state.instances_of(operation).filter(node=fault.node))
    ports_abandon(on_node)
    Instance.objects.filter(pk__in=[i.pk for i in on_node]).update(state=InstanceState.RELEASED)
    if shared:
        moves.gpus_move({d["gpu_id"] for i in on_node for d in i.devices}, GPUState.SCRUBBING, GPUState.QUARANTINED)
    if operation_state.instances_of(operation).exists():
        Operation.objects.filter(pk=operation.pk).update(attempt=0, error=message)
        dispatching.enqueue(operation, operation.step)
        return
    releasing.released(operation, outcome=OperationState.FAILED, error=message)


def _scrub_unverified(node: Node, cause: str, *, whole_node: bool) -> None:
    Incident.objects.create(kind="scrub_unverified", node_id=node.pk, summary=f"{node.hostname}: {cause}"[:500],
                            evidence={"cause": cause[:1000], "whole_node": whole_node})
    if whole_node:
        node.refresh_from_db(fields=["state"])
        try:
            node_transition(actor=None, node=node, target=N.QUARANTINED, reason=f"Scrub not verified: {cause}")
        except Conflict:
            node_failed(node, f"Scrub not verified: {cause}")


def _validation_failed(operation: Operation, fault: NodeFault, message: str) -> None:
    if fault.blame:  # attestation holds the node itself
        node_failed(operation.node, f"Validation failed: {fault.cause}")
    operation_state.operation_close(operation, OperationState.FAILED, message)


def _attested(operation: Operation) -> None:
    operation_state.operation_close(operation, OperationState.SUCCEEDED)


def _attestation_failed(operation: Operation, fault: NodeFault, message: str) -> None:
    """
    An idle node that fails (or cannot answer) is held: quarantined by its verdict, or faulty. A
    shared host in service carries tenants' work even when "idle": held, that work is replaced.
    """
    if fault.blame:
        node_failed(operation.node, f"Attestation could not run: {fault.cause}")
    elif fault.held:
        from provisioning.lifecycle.replacement import node_failed_in_lifecycle

        node_failed_in_lifecycle(operation.node, f"Attestation failed: {fault.cause}")
    operation_state.operation_close(operation, OperationState.FAILED, message)


FAILURES = {OperationKind.PROVISION: _provision_failed, OperationKind.RELEASE: _release_failed,
            OperationKind.VALIDATE: _validation_failed, OperationKind.ATTEST: _attestation_failed}
