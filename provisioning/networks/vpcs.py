"""
IB-VPCs (DESIGN.md, IB-VPC): a tenant's (or a team's) private InfiniBand network is a partition
on one fabric with an IPoIB subnet.

Creating one draws a P_Key from the fabric's pool under the fabric's row lock (the database's
unique constraint is the last word) and an IPoIB subnet under the tenant's lock (no two of a
tenant's live VPCs overlap). The partition is programmed on the fabric after the commit
(``vpc_sync``, retried by its task and by the reconciler); a deleted VPC gives its P_Key back
only once the fabric confirms the partition is gone.
"""

from __future__ import annotations

import ipaddress
import logging

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from cloud.models import Fabric
from core.errors import Conflict, Forbidden
from core.transitions import compare_and_set
from provisioning import task_names
from provisioning.admission import invalid
from provisioning.choices import VPCState as V
from provisioning.drivers import DriverError, fabric_driver_for
from provisioning.drivers.fabric import MTUS, RATE_CODES, PartitionSpec
from provisioning.models import VPC, PortMembership, Reservation
from provisioning.transitions import TERMINAL_STATES, VPC_TRANSITIONS
from security.audit import audit_record, snapshot
from tenants.choices import QuotaResource
from tenants.models import Tenant
from tenants.quotas import quota_check

log = logging.getLogger(__name__)
AUDITED = ["name", "fabric_id", "pkey", "cidr", "mtu", "service_level", "rate_gbps", "state", "team_id"]
# IPoIB subnets: large enough for a rack of 8-port nodes, no larger than a tenant could use.
SMALLEST_PREFIX, LARGEST_PREFIX = 28, 16
# RFC 1918: what the IPoIB subnets come from (ipaddress's is_private also admits loopback, link-local...).
PRIVATE_RANGES = [ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")]


#
# Create and delete
#


@transaction.atomic
def vpc_create(*, actor, fabric: Fabric, name: str, cidr: str | None = None, pkey: int | None = None,
               mtu: int = 4096, service_level: int = 0, rate_gbps: float | None = None, team=None) -> VPC:
    """
    A VPC in the actor's tenant (for ``team`` when given) on ``fabric``: its P_Key drawn from the
    fabric's pool (or ``pkey`` if free), its subnet ``cidr`` or the first free one. Bad input is a
    400, a full pool, a taken key or an overlapping subnet a 409, over quota a 409 with numbers.
    """
    if actor.tenant is None:
        raise Forbidden("VPCs are made inside a tenant; choose one with the X-Meridian-Tenant header.")
    _check_settings(mtu=mtu, service_level=service_level, rate_gbps=rate_gbps)
    tenant = Tenant.objects.select_for_update().get(pk=actor.tenant.pk)  # one create at a time per tenant
    if name.startswith(DEFAULT_PREFIX):
        raise invalid("name", f"Names starting with '{DEFAULT_PREFIX}' are kept for the default VPCs Meridian makes.",
                      "name_reserved")
    if VPC.objects.filter(tenant=tenant, name=name).exclude(state=V.DELETED).exists():
        raise Conflict(f"You already have a VPC named '{name}'.", code="name_taken")
    quota_check(tenant=tenant, team=team, resource=QuotaResource.VPCS, asked=1,
                in_use=lambda limit: _counted(tenant, team if limit.scope == "team" else None))
    subnet = _subnet(tenant, cidr)
    vpc = _insert(tenant=tenant, team=team, fabric=fabric, name=name, pkey=pkey, cidr=subnet, mtu=mtu,
                  service_level=service_level, rate_gbps=rate_gbps, created_by=actor.user)
    audit_record(actor=actor, action="vpc.create", target=vpc, after=snapshot(vpc, AUDITED))
    _sync_after_commit(vpc)
    return vpc


def default_vpc(*, tenant_id, fabric: Fabric, team_id=None) -> VPC:
    """
    The tenant's default VPC on ``fabric``, made on first use (by provisioning, for reservations
    that name none). It does not count against the VPC quota: the tenant did not ask for it.
    Two first uses at once make one (the constraint decides, the loser reads the winner's).
    """
    existing = VPC.objects.filter(tenant_id=tenant_id, fabric=fabric, is_default=True).exclude(
        state=V.DELETED).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            tenant = Tenant.objects.select_for_update().get(pk=tenant_id)
            existing = VPC.objects.filter(tenant_id=tenant_id, fabric=fabric, is_default=True).exclude(
                state=V.DELETED).first()
            if existing is not None:  # made by a racing first use while this one waited for the lock
                return existing
            vpc = _insert(tenant=tenant, team=None, fabric=fabric, name=_default_name(tenant, fabric), pkey=None,
                          cidr=_subnet(tenant, None, prefix=settings.MERIDIAN_DEFAULT_VPC_PREFIX), is_default=True)
            audit_record(actor=None, action="vpc.create", target=vpc, after=snapshot(vpc, AUDITED))
            return vpc
    except IntegrityError:
        return VPC.objects.filter(tenant_id=tenant_id, fabric=fabric, is_default=True).exclude(
            state=V.DELETED).get()


@transaction.atomic
def vpc_delete(*, actor, vpc: VPC) -> VPC:
    """
    Ask for the VPC to go: 409 while any instance is in it or any reservation not ended names it.
    It is ``deleting`` until the fabric confirms the partition is gone (then ``deleted``).
    """
    vpc = VPC.objects.select_for_update().get(pk=vpc.pk)
    live = PortMembership.objects.filter(vpc=vpc, left_at__isnull=True).values("instance").distinct().count()
    waiting = Reservation.objects.filter(vpc=vpc).exclude(state__in=TERMINAL_STATES).count()
    if live or waiting:
        raise Conflict(f"The VPC is in use: {live} instance(s) in it, {waiting} reservation(s) not ended name it. "
                       "Release them first.", code="vpc_in_use", instances=live, reservations=waiting)
    if vpc.state == V.DELETING:
        return vpc
    _move(vpc, V.DELETING, reason="Deleting: waiting for the fabric to remove the partition.")
    audit_record(actor=actor, action="vpc.delete", target=vpc, after={"state": vpc.state})
    _sync_after_commit(vpc)
    return vpc


def _insert(*, tenant, team, fabric: Fabric, name: str, pkey: int | None, cidr: str, is_default: bool = False,
            **settings_) -> VPC:
    fabric = Fabric.objects.select_for_update().get(pk=fabric.pk)  # one draw at a time per fabric
    key = _draw_pkey(fabric, pkey)
    try:
        with transaction.atomic():
            return VPC.objects.create(tenant=tenant, team=team, fabric=fabric, name=name, pkey=key, cidr=cidr,
                                      is_default=is_default, **settings_)
    except IntegrityError as exc:
        # The constraints hold even if a writer skipped the lock: a key drawn twice loses here.
        raise Conflict("That P_Key or name was taken meanwhile; try again.", code="pkey_unavailable") from exc


def _draw_pkey(fabric: Fabric, wanted: int | None) -> int:
    """The lowest free P_Key of the fabric's pool, or ``wanted`` when it is in the pool and free."""
    taken = set(VPC.objects.filter(fabric=fabric).exclude(state=V.DELETED).values_list("pkey", flat=True))
    pool = f"{fabric.pkey_min:#06x}-{fabric.pkey_max:#06x}"
    if wanted is not None:
        if not fabric.pkey_min <= wanted <= fabric.pkey_max:
            raise invalid("pkey", f"P_Key {wanted:#06x} is outside this fabric's pool {pool} "
                                  "(0x7fff is the default partition and is never handed out).", "pkey_out_of_range")
        if wanted in taken:
            # Says only that the key is in use, never whose.
            raise Conflict(f"P_Key {wanted:#06x} is not available; choose another or leave it out to have one "
                           "drawn.", code="pkey_unavailable")
        return wanted
    for key in range(fabric.pkey_min, fabric.pkey_max + 1):
        if key not in taken:
            return key
    raise Conflict(f"Fabric {fabric} has no free P_Key left in its pool {pool}; delete unused VPCs or ask the "
                   "operator to widen the pool.", code="pkey_pool_exhausted")


def _subnet(tenant: Tenant, cidr: str | None, *, prefix: int | None = None) -> str:
    """The given subnet checked (``parse_cidr``, overlapping none of the tenant's), or the first free one."""
    mine = [ipaddress.ip_network(c) for c in VPC.objects.filter(tenant=tenant).exclude(
        state=V.DELETED).values_list("cidr", flat=True)]
    if cidr is None:
        supernet = ipaddress.ip_network(settings.MERIDIAN_VPC_SUPERNET)
        prefix = prefix or settings.MERIDIAN_VPC_PREFIX
        for candidate in supernet.subnets(new_prefix=prefix):
            if not any(candidate.overlaps(other) for other in mine):
                return str(candidate)
        raise Conflict(f"No free /{prefix} is left in {supernet}; name a subnet.", code="no_free_subnet")
    net = parse_cidr(cidr)
    clash = next((other for other in mine if net.overlaps(other)), None)
    if clash is not None:
        name = VPC.objects.filter(tenant=tenant, cidr=str(clash)).exclude(state=V.DELETED).values_list(
            "name", flat=True).first()
        raise Conflict(f"{net} overlaps {clash} of your VPC '{name}'; choose a subnet that does not.",
                       code="cidr_overlap")
    return str(net)


def parse_cidr(cidr: str) -> ipaddress.IPv4Network:
    """A private IPv4 network of /16 to /28 written as its network address; 400s say what to fix."""
    text = str(cidr).strip()
    try:
        net = ipaddress.IPv4Network(text)
    except ValueError:
        try:
            loose = ipaddress.IPv4Network(text, strict=False)
        except ValueError:
            raise invalid("cidr", f"'{cidr}' is not an IPv4 network in CIDR form, like 10.20.0.0/24.",
                          "cidr_invalid") from None
        raise invalid("cidr", f"'{cidr}' has host bits set: the network is {loose}.", "cidr_not_network") from None
    if not LARGEST_PREFIX <= net.prefixlen <= SMALLEST_PREFIX:
        raise invalid("cidr", f"A VPC subnet is /{LARGEST_PREFIX} to /{SMALLEST_PREFIX}; /{net.prefixlen} is "
                              f"{'too small' if net.prefixlen > SMALLEST_PREFIX else 'too large'}.", "cidr_size")
    if not any(net.subnet_of(private) for private in PRIVATE_RANGES):
        raise invalid("cidr", f"{net} is not a private range (10/8, 172.16/12 or 192.168/16).",
                      "cidr_not_private")
    return net


def _check_settings(*, mtu: int, service_level: int, rate_gbps: float | None) -> None:
    if mtu not in MTUS:
        raise invalid("mtu", f"The IB MTU is one of {', '.join(map(str, MTUS))} bytes.", "mtu_invalid")
    if not 0 <= service_level <= 15:
        raise invalid("service_level", "The service level is 0 to 15.", "service_level_invalid")
    if rate_gbps is not None and rate_gbps not in RATE_CODES:
        rates = ", ".join(f"{r:g}" for r in sorted(RATE_CODES))
        raise invalid("rate_gbps", f"The rate limit is an InfiniBand rate in Gb/s: {rates}.", "rate_invalid")


def _counted(tenant: Tenant, team) -> int:
    """The VPCs that count against a quota: the tenant's (or the team's) that are not deleted, defaults aside."""
    qs = VPC.objects.filter(tenant=tenant, is_default=False).exclude(state=V.DELETED)
    return qs.filter(team=team).count() if team is not None else qs.count()


DEFAULT_PREFIX = "default-"


def _default_name(tenant: Tenant, fabric: Fabric) -> str:
    return f"{DEFAULT_PREFIX}{fabric.region.slug}-{fabric.slug}"[:63]


#
# Programming the fabric
#


def spec_of(vpc: VPC) -> PartitionSpec:
    return PartitionSpec(pkey=vpc.pkey, name=vpc.partition_name, mtu=vpc.mtu, rate_gbps=vpc.rate_gbps,
                         service_level=vpc.service_level)


def vpc_sync(vpc_id) -> str:
    """
    Bring the fabric to what the VPC says (outside any transaction: a driver call may be slow):
    a pending or errored VPC's partition is created (then ``active``); a deleting one's is removed
    and, once the fabric no longer shows it, the VPC is ``deleted`` and its P_Key free again.
    A transient fabric error is raised for a retry; a lasting one parks the VPC in ``error``.
    Returns the VPC's state.
    """
    vpc = VPC.objects.select_related("fabric__region").get(pk=vpc_id)
    if vpc.state == V.DELETED:
        return vpc.state
    try:
        driver = fabric_driver_for(vpc.fabric)
        if vpc.state == V.DELETING:
            live = PortMembership.objects.filter(vpc=vpc, left_at__isnull=True).count()
            if live:  # a join that raced the delete: the partition stays until its ports have left
                raise DriverError(f"VPC {vpc.name} still has {live} port(s) in it; deleting it waits.")
            driver.delete_partition(vpc.pkey)
            if vpc.pkey in driver.read():
                raise DriverError(f"The fabric still shows partition {vpc.pkey:#06x} after deleting it.")
            _move(vpc, V.DELETED, reason="", deleted_at=timezone.now())
            with transaction.atomic():
                audit_record(actor=None, action="vpc.deleted", target=vpc, after={"state": V.DELETED})
        else:
            driver.ensure_partition(spec_of(vpc))
            if vpc.state != V.ACTIVE:
                _move(vpc, V.ACTIVE, reason="")
    except DriverError as exc:
        if exc.transient:
            raise
        log.warning("Fabric refused VPC %s: %s", vpc.pk, exc)
        if vpc.state == V.DELETING:
            # Never parked in error: a VPC in error is programmed again, and this one was asked to go.
            VPC.objects.filter(pk=vpc.pk, state=V.DELETING).update(
                state_reason=f"The fabric refused to delete the partition (retried by the reconciler): {exc}"[:500])
        elif vpc.state != V.ERROR:
            _move(vpc, V.ERROR, reason=f"The fabric refused the partition: {exc}"[:500])
    return vpc.state


def _sync_after_commit(vpc: VPC) -> None:
    transaction.on_commit(lambda: task_names.send(task_names.VPC_SYNC, (str(vpc.pk),)))


def _move(vpc: VPC, target: str, *, reason: str, **also) -> None:
    """Compare-and-set; another sync that got there first is not an error."""
    try:
        compare_and_set(VPC.objects.all(), vpc.pk, table=VPC_TRANSITIONS, target=target, state_reason=reason, **also)
    except Conflict:
        vpc.refresh_from_db(fields=["state"])
        if vpc.state != target:
            raise
    vpc.refresh_from_db(fields=["state", "state_reason", *also])

