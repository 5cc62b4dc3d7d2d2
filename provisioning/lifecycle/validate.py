"""
Node validation (burn-in) and idle attestation: operations on a node with no reservation, started
by staff (``node_validate``) or by the tick for nodes due a fresh attestation.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef

from cloud.choices import NodeState
from cloud.models import GPU, Node
from cloud.services import node_transition
from provisioning.choices import OperationKind
from provisioning.lifecycle import dispatch as dispatching
from provisioning.lifecycle.steps import PIPELINES
from provisioning.models import Operation
from security.models import AttestationReport, ReferenceMeasurement

log = logging.getLogger(__name__)
N = NodeState


#
# Node validation (burn-in)
#


@transaction.atomic
def node_validate(*, actor, node: Node) -> Operation:
    """Validate a node (enrolment, after repair or maintenance): BMC, GPUs, burn-in -> available."""
    if node.state != N.VALIDATING:
        node = node_transition(actor=actor, node=node, target=N.VALIDATING, reason="Validation (burn-in).")
    running = Operation.objects.filter(node=node, kind=OperationKind.VALIDATE, state__in=dispatching.UNFINISHED).first()
    if running:
        return running
    steps = PIPELINES[(OperationKind.VALIDATE, None)]
    operation = Operation.objects.create(node=node, kind=OperationKind.VALIDATE, step=steps[0].name)
    dispatching.enqueue(operation, steps[0].name)
    return operation


def nodes_held_for_references(limit: int) -> list[Node]:
    """
    Nodes held for want of reference values (``reference_unavailable``) for whose GPUs a reference
    was registered since they were held: validated (and attested) again by the tick. A node held
    again afterwards waits for the next registration, so a missing value is not retried forever.
    """
    found = []
    for node in Node.objects.filter(state=N.REFERENCE_UNAVAILABLE).order_by("state_changed_at")[:limit]:
        registered = ReferenceMeasurement.objects.filter(
            gpu_model__in=GPU.objects.filter(node=node).values("model__slug"))
        if node.state_changed_at is not None:
            registered = registered.filter(created_at__gt=node.state_changed_at)
        if registered.exists():
            found.append(node)
    return found


def node_attest(node: Node) -> Operation | None:
    """Attest an idle node again (it stays in the pool meanwhile); None when one is already under way."""
    if Operation.objects.filter(node=node, kind__in=[OperationKind.ATTEST, OperationKind.VALIDATE],
                                state__in=dispatching.UNFINISHED).exists():
        return None
    steps = PIPELINES[(OperationKind.ATTEST, None)]
    operation = Operation.objects.create(node=node, kind=OperationKind.ATTEST, step=steps[0].name)
    dispatching.enqueue(operation, steps[0].name)
    return operation


def idle_nodes_due(now, limit: int):
    """Idle nodes (available bare metal, in-service shared hosts) with no passing attestation for a while."""
    since = now - settings.MERIDIAN_ATTESTATION_IDLE_INTERVAL
    recent = AttestationReport.objects.filter(node_id=OuterRef("pk"), status=AttestationReport.Status.PASS,
                                              verified_at__gte=since)
    attesting = Operation.objects.filter(node=OuterRef("pk"), kind=OperationKind.ATTEST,
                                         state__in=dispatching.UNFINISHED)
    return (Node.objects.filter(state__in=[N.AVAILABLE, N.IN_SERVICE]).exclude(Exists(recent))
            .exclude(Exists(attesting)).order_by("hostname")[:limit])
