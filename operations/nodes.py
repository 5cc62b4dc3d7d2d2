"""
Staff actions on a node that reach beyond the inventory: maintenance (refused while it holds a
tenant's work) and the end of a repair (the node is validated again before it is sold).
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from cloud.choices import NodeState
from cloud.models import Node
from cloud.services import node_transition
from core.errors import Conflict
from provisioning.lifecycle.replacement import NODE_FAILURE
from provisioning.lifecycle.validate import node_validate
from provisioning.models import Allocation
from security.models import Incident


def node_maintenance_start(*, actor, node: Node, reason: str) -> Node:
    """
    Hold a node for the operator. A node a tenant holds -- allocated bare metal, or a shared
    host with live allocations -- cannot be held (409): drain it first.
    """
    now = timezone.now()
    if Allocation.objects.holding(now).filter(node=node).exists():
        raise Conflict(f"Node {node.hostname} carries tenants' work now; drain it before maintenance.",
                       code="node_in_use")
    return node_transition(actor=actor, node=node, target=NodeState.MAINTENANCE, reason=reason)


@transaction.atomic
def node_repair_done(*, actor, node: Node) -> Node:
    """
    The repair is finished: the node moves ``repair`` -> ``validating`` and its validation
    (burn-in, attestation) starts unless one runs already; only a passed validation sells it
    again. Its open failure incidents are resolved. 409 when the node is not in repair.
    """
    node = node_transition(actor=actor, node=node, target=NodeState.VALIDATING,
                           reason="Repaired: validation (burn-in) before it is sold again.",
                           only_from=frozenset({NodeState.REPAIR}))
    node_validate(actor=actor, node=node)
    Incident.objects.filter(kind=NODE_FAILURE, node_id=node.pk, tenant_id__isnull=True,
                            resolved_at__isnull=True).update(resolved_at=timezone.now())
    return node
