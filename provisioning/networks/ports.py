"""
Instances' ports in their VPCs' partitions, and the proof that nothing else is there.

- ``ports_join``: an instance's port GUIDs -- a bare-metal node's HCA ports, or one SR-IOV
  virtual function of a shared host's port for a VM or container -- become full members of its
  VPC's partition, and at most limited members of the default partition 0x7FFF. The membership
  rows are written first (the database refuses a GUID live in two partitions), then the fabric is
  programmed and read back.
- ``ports_leave``: the rows are closed, the fabric forgets the ports, and a read-back proves they
  are in no tenant's partition before the hardware may be sold again.
- ``fabric_reconcile``: every partition compared with the database; a foreign port is removed
  at once and raises an incident, a missing one is added back, and what was done is recorded.

Errors are DriverErrors (the pipeline's steps turn them into node faults, retried or not).
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, Q
from django.utils import timezone

from cloud.choices import OfferingKind
from cloud.models import Fabric, HCAPort
from core.errors import DomainError
from provisioning.choices import VPCState as V
from provisioning.drivers import DriverError, fabric_driver_for
from provisioning.drivers.fabric import DEFAULT_PKEY, FULL, LIMITED, Partition, PartitionSpec
from provisioning.models import VPC, FabricReconciliation, Instance, PortMembership, VirtualFunction
from provisioning.mounts import isolation_rows
from provisioning.networks.vpcs import spec_of, vpc_sync
from security.models import Incident

log = logging.getLogger(__name__)


class VPCRefused(DriverError):
    """The VPC cannot take the instance (its subnet is full, or it is being deleted): not the node's fault."""

    def __init__(self, message: str):
        super().__init__(message, transient=False)


# A port that left its partition this recently may still be on its way out of the fabric (a
# release is between closing its rows and the fabric call): not drift yet.
LEAVING_GRACE = timedelta(minutes=2)


#
# Ports of an instance
#


def instance_ports(instance: Instance, *, assign: bool = True) -> list[str]:
    """The GUIDs an instance joins with: its node's ports (bare metal), or its virtual function."""
    if instance.kind == OfferingKind.BARE_METAL:
        return list(instance.node.ib_ports.order_by("index").values_list("guid", flat=True))
    vf = VirtualFunction.objects.filter(instance=instance).first()
    if vf is None and assign:
        vf = _assign_vf(instance)
    return [vf.guid] if vf else []


def instance_virtual_function(instance: Instance) -> VirtualFunction:
    """A VM's or container's virtual function, handed out on first ask (join_network then finds it), its port loaded."""
    vf = VirtualFunction.objects.select_related("port").filter(instance=instance).first()
    return vf or _assign_vf(instance)


def instance_ports_many(instances: list[Instance]) -> dict:
    """
    ``instance_ports`` for instances that join together, by instance key: servers' HCA ports,
    and virtual functions found or handed out, in a few statements for them all.
    """
    servers = {instance.node_id: instance.pk for instance in instances if instance.kind == OfferingKind.BARE_METAL}
    ports: dict = {}
    for node_id, guid in HCAPort.objects.filter(node__in=list(servers)).order_by("node", "index").values_list(
            "node", "guid"):
        ports.setdefault(servers[node_id], []).append(guid)
    shared = [instance for instance in instances if instance.kind != OfferingKind.BARE_METAL]
    if shared:
        have = dict(VirtualFunction.objects.filter(instance__in=shared).values_list("instance", "guid"))
        ports |= {pk: [guid] for pk, guid in have.items()}
        ports |= _assign_vfs([instance for instance in shared if instance.pk not in have])
    return ports


def _assign_vfs(instances: list[Instance]) -> dict:
    """
    ``_assign_vf`` for several instances: free functions taken by conditional UPDATEs, new ones
    made in one INSERT (a race for an index fails it; the caller then joins one by one).
    """
    if not instances:
        return {}
    host_ports = defaultdict(list)
    for port in HCAPort.objects.filter(node__in={instance.node_id for instance in instances}).order_by("node", "index"):
        host_ports[port.node_id].append(port)
    wanted = defaultdict(list)
    for instance in instances:
        on_host = host_ports.get(instance.node_id)
        if not on_host:
            raise DriverError(f"{instance.node.hostname} has no InfiniBand ports recorded; enrol its port GUIDs.",
                              transient=False)
        first_gpu = instance.devices[0]["index"] if instance.devices else 0
        wanted[on_host[first_gpu % len(on_host)]].append(instance)
    free = defaultdict(list)
    for vf in VirtualFunction.objects.filter(port__in=list(wanted), instance__isnull=True).order_by("port", "index"):
        free[vf.port_id].append(vf)
    made = dict(VirtualFunction.objects.filter(port__in=list(wanted)).values("port").annotate(n=Count("id"))
                .values_list("port", "n"))
    assigned, new = {}, []
    for port, group in wanted.items():
        for instance in group:
            vf = free[port.pk].pop(0) if free[port.pk] else None
            if vf is not None and VirtualFunction.objects.filter(pk=vf.pk, instance__isnull=True).update(
                    instance=instance):
                assigned[instance.pk] = [vf.guid]
                continue
            if vf is not None:  # taken meanwhile by another join: look again, one at a time
                assigned[instance.pk] = [_assign_vf(instance).guid]
                continue
            index = made.get(port.pk, 0)
            if index >= settings.MERIDIAN_VFS_PER_PORT:
                raise DriverError(f"{port} has no free virtual function ({index} in use; MERIDIAN_VFS_PER_PORT).")
            made[port.pk] = index + 1
            new.append(VirtualFunction(port=port, index=index, guid="02" + secrets.token_hex(7), instance=instance))
            assigned[instance.pk] = [new[-1].guid]
    VirtualFunction.objects.bulk_create(new)
    return assigned


def _assign_vf(instance: Instance) -> VirtualFunction:
    """
    A virtual function of the host port beside the instance's first GPU (rail affinity): a free
    one reused, or the port's next. Two instances on one host never get the same one (a
    conditional UPDATE, and a unique index for new ones).
    """
    ports = list(HCAPort.objects.filter(node=instance.node).order_by("index"))
    if not ports:
        raise DriverError(f"{instance.node.hostname} has no InfiniBand ports recorded; enrol its port GUIDs.",
                          transient=False)
    first_gpu = instance.devices[0]["index"] if instance.devices else 0
    port = ports[first_gpu % len(ports)]
    for _ in range(5):
        free = VirtualFunction.objects.filter(port=port, instance__isnull=True).order_by("index").first()
        if free is not None:
            if VirtualFunction.objects.filter(pk=free.pk, instance__isnull=True).update(instance=instance):
                free.instance = instance
                return free
            continue
        made = VirtualFunction.objects.filter(port=port).count()
        if made >= settings.MERIDIAN_VFS_PER_PORT:
            raise DriverError(f"{port} has no free virtual function ({made} in use; MERIDIAN_VFS_PER_PORT).")
        try:
            with transaction.atomic():
                # A locally administered GUID (like a MAC's): never one a vendor burnt into an HCA.
                return VirtualFunction.objects.create(port=port, index=made, guid="02" + secrets.token_hex(7),
                                                      instance=instance)
        except IntegrityError:
            continue  # another instance took that index (or, once in 2^56, the GUID): look again
    raise DriverError(f"Could not hand {instance.name} a virtual function of {port}; trying again.")


#
# Join and leave
#


def ports_join(instance: Instance, vpc: VPC) -> list[PortMembership]:
    """Put the instance's ports into ``vpc``'s partition as full members (idempotent) and read it back."""
    return ports_join_many([(instance, vpc)])[instance.pk]


def ports_join_many(joins: list[tuple[Instance, VPC]]) -> dict:
    """
    ``ports_join`` for instances that join together (reservations started together): their rows
    written under one lock per VPC, then one fabric call per partition and one read-back per
    fabric -- where a fabric manager's API takes the ports of a partition in one call anyway.
    A DriverError here names no instance: the caller joins them one by one to find whose it is.
    Returns each instance's membership rows, by instance key.
    """
    ports, guids_of = [], instance_ports_many([instance for instance, _ in joins])
    for instance, vpc in joins:
        guids = guids_of.get(instance.pk)
        if not guids:
            raise DriverError(f"{instance.node.hostname} has no InfiniBand ports recorded; enrol its port GUIDs.",
                              transient=False)
        ports.append((instance, vpc, guids))
    vpcs = {vpc.pk: vpc for _, vpc, _ in ports}
    for vpc in vpcs.values():
        _ready_for_members(vpc)
    rows, by_vpc = {}, defaultdict(list)
    for instance, vpc, guids in ports:
        by_vpc[vpc.pk].append((instance, guids))
    for vpc_pk, members in by_vpc.items():
        rows |= _memberships(vpcs[vpc_pk], members)
    by_fabric = defaultdict(list)
    for vpc in vpcs.values():
        by_fabric[vpc.fabric_id].append(vpc)
    for on_fabric in by_fabric.values():
        driver = fabric_driver_for(on_fabric[0].fabric)
        joined = {vpc.pk: [guid for _, guids in by_vpc[vpc.pk] for guid in guids] for vpc in on_fabric}
        for vpc in on_fabric:
            driver.set_members(vpc.pkey, {guid: FULL for guid in joined[vpc.pk]})
        driver.set_members(DEFAULT_PKEY, {guid: LIMITED for guids in joined.values() for guid in guids})
        seen = driver.read()
        for vpc in on_fabric:
            partition = seen.get(vpc.pkey, Partition(spec_of(vpc)))
            absent = [guid for guid in joined[vpc.pk] if partition.members.get(guid) != FULL]
            if absent:
                raise DriverError(f"The fabric does not show port {absent[0]} in partition {vpc.pkey:#06x} after "
                                  "adding it.")
    return rows


def _ready_for_members(vpc: VPC) -> None:
    """The VPC's partition exists (made on first use: a default VPC, or a fabric that was down) and takes members."""
    if vpc.state in (V.DELETING, V.DELETED):
        raise VPCRefused(f"VPC {vpc.name} is {vpc.state}; it cannot take new members.")
    if vpc.state != V.ACTIVE:
        vpc_sync(vpc.pk)
        vpc.refresh_from_db()
        if vpc.state != V.ACTIVE:
            raise DriverError(f"VPC {vpc.name} is {vpc.state} ({vpc.state_reason or 'no reason given'}).",
                              transient=vpc.state != V.DELETING)


@transaction.atomic
def _memberships(vpc: VPC, members: list[tuple[Instance, list[str]]]) -> dict:
    """
    The live membership rows of these instances' ports in ``vpc``, made with IPoIB addresses
    where new; by instance key.
    """
    vpc = VPC.objects.select_for_update().get(pk=vpc.pk)  # addresses are handed out one join at a time
    if vpc.state != V.ACTIVE:  # deleted meanwhile: joining it now would outlive its partition
        raise VPCRefused(f"VPC {vpc.name} is {vpc.state}; it cannot take new members.")
    live = {m.guid: m for m in PortMembership.objects.filter(guid__in=[g for _, guids in members for g in guids],
                                                             left_at__isnull=True)}
    for instance, guids in members:
        foreign = [live[guid] for guid in guids if guid in live
                   and (live[guid].vpc_id, live[guid].instance_id) != (vpc.pk, instance.pk)]
        if foreign:
            raise DriverError(f"Port {foreign[0].guid} of {instance.node.hostname} is still a member of another "
                              "partition; its previous release has not finished.", transient=False)
    used = set(PortMembership.objects.filter(vpc=vpc, left_at__isnull=True).values_list("address", flat=True))
    free = (str(host) for host in ipaddress.ip_network(vpc.cidr).hosts() if str(host) not in used)
    rows, new = {}, []
    for instance, guids in members:
        mine = rows.setdefault(instance.pk, [])
        for guid in guids:
            if guid in live:
                mine.append(live[guid])
                continue
            address = next(free, None)
            if address is None:
                raise VPCRefused(f"VPC {vpc.name}'s subnet {vpc.cidr} has no free address left; use a larger VPC.")
            mine.append(PortMembership(vpc=vpc, instance=instance, guid=guid, address=address))
            new.append(mine[-1])
    PortMembership.objects.bulk_create(new)
    return rows


def ports_leave(instance: Instance) -> None:
    """
    Take the instance's ports out of every partition it joined, and prove it from the fabric: none
    of them is in any partition but the default (and there not as a full member). Idempotent: a
    retry after the rows were closed proves the same thing from the instance's ports.
    """
    # Every partition it ever joined (a retry finds the rows closed by the first try).
    rows = list(PortMembership.objects.filter(instance=instance).select_related("vpc"))
    guids = set(instance_ports(instance, assign=False)) | {row.guid for row in rows}
    # A retry after its virtual function went to another instance must leave that one's port alone.
    guids -= set(PortMembership.objects.filter(guid__in=guids, left_at__isnull=True).exclude(
        instance=instance).values_list("guid", flat=True))
    rows = [row for row in rows if row.guid in guids]
    PortMembership.objects.filter(instance=instance, left_at__isnull=True).update(left_at=timezone.now())
    fabric = instance.node.fabric
    driver = fabric_driver_for(fabric)
    by_pkey = defaultdict(set)
    for row in rows:
        by_pkey[row.vpc.pkey].add(row.guid)
    for pkey, members in by_pkey.items():
        driver.remove_members(pkey, sorted(members))
    stuck = still_members(driver.read(), guids)
    if stuck:
        guid, pkey = stuck[0]
        driver.remove_members(pkey, [guid])  # a partition it joined some other way: out too, then prove again
        raise DriverError(f"Port {guid} of {instance.node.hostname} was still in partition {pkey:#06x} after its "
                          "release; removed, checking again.")
    VirtualFunction.objects.filter(instance=instance).update(instance=None)


def ports_abandon(instances) -> None:
    """
    Instances that will never be cleaned (their node failed or was quarantined) leave their
    partitions at once: their memberships close, their virtual functions are freed, and the
    fabric is asked to forget their ports (what it cannot do now, the reconciler removes as drift).
    """
    instances = list(instances)
    rows = list(PortMembership.objects.filter(instance__in=instances, left_at__isnull=True).select_related(
        "vpc__fabric__region"))
    PortMembership.objects.filter(pk__in=[row.pk for row in rows]).update(left_at=timezone.now())
    VirtualFunction.objects.filter(instance__in=instances).update(instance=None)
    by_vpc = defaultdict(set)
    for row in rows:
        by_vpc[row.vpc].add(row.guid)
    for vpc, guids in by_vpc.items():
        try:
            fabric_driver_for(vpc.fabric).remove_members(vpc.pkey, sorted(guids))
        except DriverError as exc:
            log.warning("Could not take %d port(s) out of %s now (the reconciler will): %s", len(guids), vpc, exc)


def still_members(partitions: dict[int, Partition], guids) -> list[tuple[str, int]]:
    """Which of ``guids`` a tenant could still reach someone through: in a partition, or full in the default."""
    found = []
    for pkey, partition in sorted(partitions.items()):
        for guid in sorted(set(guids) & partition.members.keys()):
            if pkey != DEFAULT_PKEY or partition.members[guid] == FULL:
                found.append((guid, pkey))
    return found


#
# Reconciliation
#


def fabric_reconcile(fabric: Fabric) -> FabricReconciliation:
    """
    Compare ``fabric``'s partitions (read back through its driver) with the database and repair
    the difference: VPCs waiting on the fabric are pushed through; a missing partition is made
    again; a port the database does not put in a partition is removed at once (an incident); a
    missing one is added back; a partition no VPC owns is removed (an incident); a tenant port
    that is a full member of the default partition is made limited (an incident).
    """
    run = FabricReconciliation.objects.create(fabric=fabric, started_at=timezone.now())
    drift: list[dict] = []
    failed = []
    for vpc_id in VPC.objects.filter(fabric=fabric, state__in=[V.PENDING, V.DELETING, V.ERROR]).values_list(
            "pk", flat=True):
        try:
            vpc_sync(vpc_id)
        except (DriverError, DomainError) as exc:  # one stuck VPC must not stop the repair of the others
            failed.append(f"VPC {vpc_id}: {exc}")
    try:
        driver = fabric_driver_for(fabric)
        _repair(fabric, driver, driver.read(), drift)
        run.ok = not failed
        run.error = "; ".join(failed)[:2000]
    except DriverError as exc:
        run.error = "; ".join([*failed, str(exc)])[:2000]
    run.drift, run.finished_at = drift, timezone.now()
    run.save(update_fields=["drift", "finished_at", "ok", "error"])
    return run


def _repair(fabric: Fabric, driver, actual: dict[int, Partition], drift: list[dict]) -> None:
    vpcs = {vpc.pkey: vpc for vpc in VPC.objects.filter(fabric=fabric).exclude(state=V.DELETED)}
    now = timezone.now()
    desired, leaving = defaultdict(set), defaultdict(set)
    for pkey, guid, left_at in PortMembership.objects.filter(vpc__fabric=fabric).exclude(vpc__state=V.DELETED).filter(
            Q(left_at__isnull=True) | Q(left_at__gt=now - LEAVING_GRACE)).values_list("vpc__pkey", "guid", "left_at"):
        (leaving if left_at else desired)[pkey].add(guid)
    live = set().union(*desired.values()) if desired else set()
    for pkey in leaving:
        leaving[pkey] -= live - desired[pkey]  # a port live in another partition now has no grace here
    for pkey, vpc in sorted(vpcs.items()):
        if vpc.state != V.ACTIVE:
            continue
        have = actual.get(pkey)
        if have is None or not same_settings(have.spec, spec_of(vpc)):
            driver.ensure_partition(spec_of(vpc))
            drift.append(_entry(vpc, "missing_partition" if have is None else "settings", "programmed again"))
            have = have or Partition(spec_of(vpc))
        extra = sorted(have.members.keys() - desired[pkey] - leaving[pkey])
        if extra:
            driver.remove_members(pkey, extra)
            drift.append(_entry(vpc, "extra_member", "removed", guids=extra))
            _incident(fabric, vpc, f"{len(extra)} port(s) found in partition {pkey:#06x} that no instance of the "
                                   "VPC holds; removed.", {"pkey": pkey, "guids": extra})
        missing = sorted(g for g in desired[pkey] if have.members.get(g) != FULL)
        if missing:
            driver.set_members(pkey, {guid: FULL for guid in missing})
            drift.append(_entry(vpc, "missing_member", "added back", guids=missing))
    for pkey, partition in sorted(actual.items()):
        if pkey == DEFAULT_PKEY:
            _repair_default(fabric, driver, partition, drift)
        elif pkey not in vpcs and fabric.pkey_min <= pkey <= fabric.pkey_max:
            driver.delete_partition(pkey)
            drift.append({"pkey": pkey, "vpc": None, "kind": "unknown_partition", "action": "deleted",
                          "guids": sorted(partition.members)})
            _incident(fabric, None, f"Partition {pkey:#06x} on the fabric belongs to no VPC; deleted.",
                      {"pkey": pkey, "guids": sorted(partition.members)})


def _repair_default(fabric: Fabric, driver, default: Partition, drift: list[dict]) -> None:
    """Tenant ports (every node port and virtual function of this fabric) are never full members of 0x7FFF."""
    full = [guid for guid, membership in default.members.items() if membership == FULL]
    if not full:
        return
    ours = set(HCAPort.objects.filter(node__fabric=fabric, guid__in=full).values_list("guid", flat=True))
    ours |= set(VirtualFunction.objects.filter(port__node__fabric=fabric, guid__in=full).values_list("guid", flat=True))
    if ours:
        driver.set_members(DEFAULT_PKEY, {guid: LIMITED for guid in ours})
        drift.append({"pkey": DEFAULT_PKEY, "vpc": None, "kind": "full_default_member", "action": "made limited",
                      "guids": sorted(ours)})
        _incident(fabric, None, f"{len(ours)} tenant port(s) were full members of the default partition; made "
                                "limited.", {"pkey": DEFAULT_PKEY, "guids": sorted(ours)})


def same_settings(actual: PartitionSpec, wanted: PartitionSpec) -> bool:
    """
    Whether a partition as read back has the settings wanted. Its name is not compared (UFM keeps
    the name it was created with), nor its rate when none was asked (the fabric reports its own).
    """
    return (actual.mtu, actual.service_level, actual.ipoib) == (wanted.mtu, wanted.service_level, wanted.ipoib) \
        and (wanted.rate_gbps is None or actual.rate_gbps == wanted.rate_gbps)


def _entry(vpc: VPC, kind: str, action: str, guids=()) -> dict:
    return {"pkey": vpc.pkey, "vpc": str(vpc.pk), "kind": kind, "action": action, "guids": list(guids)}


def _incident(fabric: Fabric, vpc: VPC | None, summary: str, evidence: dict) -> None:
    Incident.objects.create(kind="fabric_drift", summary=summary, fabric_id=fabric.pk,
                            tenant_id=vpc.tenant_id if vpc else None,
                            evidence={**evidence, "fabric": str(fabric), "vpc": str(vpc.pk) if vpc else None})


#
# Reports
#


def isolation_violations(fabric: Fabric) -> list[str]:
    """
    What the fabric shows that isolation forbids, read from the driver: a port in partitions of
    two tenants, or a tenant port that is a full member of the default partition. Empty is good.
    """
    actual = fabric_driver_for(fabric).read()
    owner = dict(VPC.objects.filter(fabric=fabric).exclude(state=V.DELETED).values_list("pkey", "tenant_id"))
    tenants_of = defaultdict(set)
    for pkey, partition in actual.items():
        if pkey != DEFAULT_PKEY:
            for guid in partition.members:
                tenants_of[guid].add(owner.get(pkey, f"unowned {pkey:#06x}"))
    problems = [f"port {guid} is in partitions of {len(owners)} owners" for guid, owners in sorted(tenants_of.items())
                if len(owners) > 1]
    ports = set(HCAPort.objects.filter(node__fabric=fabric).values_list("guid", flat=True))
    ports |= set(VirtualFunction.objects.filter(port__node__fabric=fabric).values_list("guid", flat=True))
    default = actual.get(DEFAULT_PKEY, Partition(spec=None))
    problems += [f"tenant port {guid} is a full member of the default partition"
                 for guid, membership in sorted(default.members.items()) if membership == FULL and guid in ports]
    return problems


@dataclass
class Member:
    """An instance in a VPC now: how many of its ports are members, and their IPoIB addresses."""

    instance: Instance
    ports: int
    addresses: list[str]
    joined_at: datetime


def _address_key(address: str | None) -> tuple:
    return (1, 0) if not address else (0, int(ipaddress.IPv4Address(address)))


def vpc_members(vpc: VPC, *, related: tuple[str, ...] = ()) -> tuple[list[Member], set[str]]:
    """
    The instances in ``vpc`` now, in address order -- numerically, .9 before .10, whatever the
    database (SQLite sorts addresses as text) -- each with its addresses in that order; and the
    live port GUIDs. ``related``: more of the instance to read along (``reservation``).
    """
    rows = PortMembership.objects.filter(vpc=vpc, left_at__isnull=True).select_related(
        *(["instance"] + [f"instance__{name}" for name in related]))
    members: dict = {}
    guids = set()
    for row in rows:
        guids.add(row.guid)
        member = members.setdefault(row.instance_id, Member(row.instance, 0, [], row.joined_at))
        member.ports += 1
        member.joined_at = min(member.joined_at, row.joined_at)
        if row.address:
            member.addresses.append(row.address)
    for member in members.values():
        member.addresses.sort(key=_address_key)
    ordered = sorted(members.values(), key=lambda m: (_address_key(m.addresses[0] if m.addresses else None),
                                                      m.instance.name))
    return ordered, guids


def isolation_report(vpc: VPC) -> dict:
    """
    What a tenant can show its auditors about one VPC: its partition, its members (instances, not
    raw port GUIDs), what the fabric shows right now, and the reconciler's findings.
    """
    members, guids = vpc_members(vpc)
    report = {"vpc": str(vpc.pk), "name": vpc.name, "fabric": str(vpc.fabric), "pkey": f"{vpc.pkey:#06x}",
              "cidr": vpc.cidr, "state": vpc.state,
              "members": [{"ports": m.ports, "addresses": m.addresses, "instance": str(m.instance.pk),
                           "name": m.instance.name, "reservation": str(m.instance.reservation_id),
                           "joined_at": m.joined_at.isoformat()} for m in members],
              "generated_at": timezone.now().isoformat()}
    report["fabric_now"] = _fabric_now(vpc, guids)
    report["storage_exports"] = isolation_rows(vpc.tenant_id)
    last = FabricReconciliation.objects.filter(fabric=vpc.fabric, finished_at__isnull=False).first()
    mine = [d for d in (last.drift if last else []) if d.get("vpc") == str(vpc.pk)]
    report["last_reconciliation"] = None if last is None else {
        "at": last.finished_at.isoformat(), "ok": last.ok, "drift_found": len(mine),
        "repairs": [{"kind": d["kind"], "action": d["action"], "ports": len(d.get("guids", []))} for d in mine]}
    since = timezone.now() - timedelta(days=30)
    history = FabricReconciliation.objects.filter(fabric=vpc.fabric, started_at__gte=since).exclude(drift=[])
    report["drift_last_30_days"] = [
        {"at": run.started_at.isoformat(), "kind": d["kind"], "action": d["action"], "ports": len(d.get("guids", []))}
        for run in history[:200] for d in run.drift if d.get("vpc") == str(vpc.pk)]
    return report


def _fabric_now(vpc: VPC, guids: set[str]) -> dict:
    """The partition as the fabric shows it now: counts only, so no other tenant's port is named."""
    try:
        actual = fabric_driver_for(vpc.fabric).read()
    except DriverError as exc:
        return {"checked": False, "error": str(exc)}
    partition = actual.get(vpc.pkey)
    if partition is None:
        return {"checked": True, "partition_present": False}
    default = actual.get(DEFAULT_PKEY, Partition(spec=None)).members
    return {"checked": True, "partition_present": True,
            "members_full": sum(1 for g in guids if partition.members.get(g) == FULL),
            "members_expected": len(guids),
            "foreign_ports": len(partition.members.keys() - guids),
            "ports_full_in_default_partition": sum(1 for g in guids if default.get(g) == FULL)}
