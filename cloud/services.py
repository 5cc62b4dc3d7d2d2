"""
State changes of the inventory and the catalogue. Each writes one audit event in its transaction.
"""

from __future__ import annotations

import re

from django.db import IntegrityError, transaction
from django.db.models import F, Model
from django.utils import timezone

from cloud.choices import NodePool, NodeState
from cloud.models import GPU, GPUModel, HCAPort, Node, Offering, Region
from cloud.transitions import NODE_RETURNABLE, NODE_TRANSITIONS
from core.errors import Conflict
from core.transitions import compare_and_set
from security.audit import audit_record, snapshot

#
# Catalogue: regions, GPU models, offerings
#


def _catalogue_save(*, actor, instance: Model, changes: dict, action: str) -> Model:
    """Apply ``changes``, validate the row (constraints included), save and audit."""
    is_new = instance._state.adding
    before = None if is_new else snapshot(instance, list(changes))
    for field, value in changes.items():
        setattr(instance, field, value)
    # Uniqueness is left to the database: a duplicate slug is a 409 (also under a race), not a 400.
    instance.full_clean(validate_unique=False)
    try:
        with transaction.atomic():
            # An update writes only its fields: two PATCHes of different fields both stand.
            instance.save(update_fields=None if is_new else list(changes))
    except IntegrityError:
        raise Conflict(f"A {instance._meta.verbose_name} with this slug already exists.", code="duplicate") from None
    audit_record(actor=actor, action=action, target=instance, before=before, after=snapshot(instance, list(changes)))
    return instance


@transaction.atomic
def region_create(*, actor, **fields) -> Region:
    """Add a region to the catalogue."""
    return _catalogue_save(actor=actor, instance=Region(), changes=fields, action="region.create")


@transaction.atomic
def region_update(*, actor, region: Region, **changes) -> Region:
    """Rename or (de)activate a region."""
    return _catalogue_save(actor=actor, instance=region, changes=changes, action="region.update")


@transaction.atomic
def gpu_model_create(*, actor, **fields) -> GPUModel:
    """Add a GPU model with its published figures."""
    return _catalogue_save(actor=actor, instance=GPUModel(), changes=fields, action="gpu_model.create")


@transaction.atomic
def gpu_model_update(*, actor, gpu_model: GPUModel, **changes) -> GPUModel:
    """Correct a GPU model's figures."""
    return _catalogue_save(actor=actor, instance=gpu_model, changes=changes, action="gpu_model.update")


@transaction.atomic
def offering_create(*, actor, **fields) -> Offering:
    """Put a new offering on sale."""
    return _catalogue_save(actor=actor, instance=Offering(), changes=fields, action="offering.create")


@transaction.atomic
def offering_update(*, actor, offering: Offering, **changes) -> Offering:
    """Change an offering's prices or terms, or take it off sale (is_active)."""
    return _catalogue_save(actor=actor, instance=offering, changes=changes, action="offering.update")


#
# Nodes
#


@transaction.atomic
def node_transition(
    *, actor, node: Node, target: str, reason: str = "", only_from: frozenset[str] | None = None
) -> Node:
    """
    Move a node to ``target`` if the transition table allows it from its current state
    (compare-and-set: a concurrent move makes this a 409 naming the state it found).
    """
    now = timezone.now()
    previous = compare_and_set(
        Node.objects.all(), node.pk, table=NODE_TRANSITIONS, target=target, only_from=only_from,
        state_reason=reason[:500], state_changed_at=now, previous_state=F("state"),
    )
    node.refresh_from_db(fields=["state", "state_reason", "state_changed_at", "previous_state"])
    audit_record(actor=actor, action="node.transition", target=node, before={"state": previous},
                 after={"state": target, "reason": reason[:500]})
    return node


@transaction.atomic
def node_enrol(*, actor, gpus: list[dict], gpu_model, ib_port_guids: list[str],
               ib_port_pci_bus_ids: list[str] | None = None, **fields) -> Node:
    """
    Enrol a node, its GPUs and its InfiniBand ports (state ``enrolled``); validation (burn-in)
    follows before it is sold. The BMC password is stored encrypted and never audited.
    """
    try:
        with transaction.atomic():
            node = Node.objects.create(state=NodeState.ENROLLED, state_changed_at=timezone.now(),
                                       gpus_installed=len(gpus), **fields)
            GPU.objects.bulk_create([GPU(node=node, model=gpu_model, memory_mib=gpu_model.memory_gib * 1024, **gpu)
                                     for gpu in gpus])
            addresses = ib_port_pci_bus_ids or [""] * len(ib_port_guids)
            HCAPort.objects.bulk_create([HCAPort(node=node, index=index, guid=guid, pci_bus_id=address.lower())
                                         for index, (guid, address) in enumerate(zip(ib_port_guids, addresses,
                                                                                     strict=True))])
    except IntegrityError as exc:
        # Two enrolments of one node (or GPU) at once: the database's unique rules decide.
        raise Conflict("This node, one of its GPUs or one of its ports is enrolled already.",
                       code="already_enrolled") from exc
    audit_record(actor=actor, action="node.enrol", target=node, tenant_id=None,
                 after={"hostname": node.hostname, "region": node.region.slug, "pool": node.pool,
                        "gpus": len(gpus), "gpu_model": gpu_model.slug, "ib_ports": len(ib_port_guids)})
    return node


def node_cc_observed(*, node: Node, cc_mode: str) -> bool:
    """
    Record the GPUs' confidential-computing mode a passing attestation showed; the node is
    confidential capacity when it is on and, for a shared host's VMs, its CPUs run confidential VMs.
    """
    confidential = cc_mode == "on" and (node.pool == NodePool.BARE_METAL or node.cvm_host)
    if (node.gpu_cc_mode, node.confidential) != (cc_mode, confidential):
        Node.objects.filter(pk=node.pk).update(gpu_cc_mode=cc_mode, confidential=confidential)
        node.gpu_cc_mode, node.confidential = cc_mode, confidential
    return confidential


# Where a GPU sits in its node (GPU.nvlink_domain, pcie_switch, numa_node), as an agent reports it.
TOPOLOGY_FIELDS = ("nvlink_domain", "pcie_switch", "numa_node")
TOPOLOGY_LIMITS = {"nvlink_domain": 15, "pcie_switch": 15, "numa_node": 1023}  # GPU indexes; NUMA node numbers
CPU_LIST = re.compile(r"^\d{1,5}(-\d{1,5})?(,\d{1,5}(-\d{1,5})?){0,255}$")  # "0-55,112-167"


def node_topology_observed(*, node: Node, gpus: list[GPU], seen: list[dict]) -> bool:
    """
    Record where the node's GPUs sit as its host reports them (``seen``: the agent's inventory,
    provisioning.agent.topology): each GPU's NVLink domain, PCIe switch and NUMA node, and the
    CPUs of each NUMA node. ``gpus``: the node's GPU rows, read by the caller and kept in step.
    Only a change is written, with an audit event -- nothing, nearly always: it changes only with
    the hardware. A GPU reported without a place (an agent that cannot read it) keeps what is
    stored, and so does a value out of range. The scheduler's kept fleet shape reads it at its
    next refresh (provisioning.scheduling.fleet_shape). Returns whether anything changed.
    """
    reports = {g.get("uuid"): g for g in seen if isinstance(g, dict)}
    changed = []
    for gpu in gpus:
        report = reports.get(gpu.uuid) or {}
        if not any(field in report for field in TOPOLOGY_FIELDS):
            continue
        place = {field: _topology_value(report.get(field), TOPOLOGY_LIMITS[field], getattr(gpu, field))
                 for field in TOPOLOGY_FIELDS}
        if place != {field: getattr(gpu, field) for field in TOPOLOGY_FIELDS}:
            for field, value in place.items():
                setattr(gpu, field, value)
            changed.append(gpu)
    cpus = {str(g["numa_node"]): g["cpus"] for g in reports.values()
            if _topology_value(g.get("numa_node"), TOPOLOGY_LIMITS["numa_node"], None) is not None
            and isinstance(g.get("cpus"), str) and CPU_LIST.match(g["cpus"])}
    numa_cpus = dict(sorted({**node.numa_cpus, **cpus}.items()))
    if not changed and numa_cpus == node.numa_cpus:
        return False
    with transaction.atomic():
        if changed:
            GPU.objects.bulk_update(changed, list(TOPOLOGY_FIELDS))
        if numa_cpus != node.numa_cpus:
            Node.objects.filter(pk=node.pk).update(numa_cpus=numa_cpus)
            node.numa_cpus = numa_cpus
        audit_record(actor=None, action="node.topology_observed", target=node, tenant_id=None, after={
            "gpus": {str(g.index): [getattr(g, field) for field in TOPOLOGY_FIELDS] for g in changed},
            "numa_cpus": numa_cpus})
    return True


def _topology_value(value, limit: int, kept):
    """A reported place: None (not known), a number in range, or else what is stored (a malformed report)."""
    if value is None or (type(value) is int and 0 <= value <= limit):
        return value
    return kept


def node_maintenance_end(*, actor, node: Node) -> Node:
    """
    End a hold: back to ``available``/``in_service`` when the node was there before it, else to
    ``validating`` -- a node held while quarantined, faulty or unproven must pass burn-in again.
    """
    node.refresh_from_db(fields=["previous_state"])
    target = node.previous_state if node.previous_state in NODE_RETURNABLE else NodeState.VALIDATING
    return node_transition(actor=actor, node=node, target=target, only_from=frozenset({NodeState.MAINTENANCE}))


def node_repair_start(*, actor, node: Node, reason: str = "") -> Node:
    """
    Send a faulty or quarantined node to repair (an operator's step; 409 from any other state).
    It is never sold from there: only ``node_repair_done`` and a passed validation bring it back.
    """
    return node_transition(actor=actor, node=node, target=NodeState.REPAIR, reason=reason or "Sent to repair.",
                           only_from=frozenset({NodeState.FAULTY, NodeState.QUARANTINED}))


