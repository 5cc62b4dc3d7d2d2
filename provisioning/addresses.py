"""
Instance addresses: a private address for every instance and, when its reservation asks, a public
one, each from its region's pool (MERIDIAN_ADDRESS_POOLS), and a DNS name
``<instance>.<tenant>.<region>.<zone>``. Assigned when provisioning starts, released once the
instance is cleaned (or lost with failed hardware). The database refuses a second live owner of an
address (``address_one_live_owner``): two starts racing for the last address never both get it --
the loser takes another, or finds the pool exhausted and its reservation waits.
"""

from __future__ import annotations

import hashlib
import ipaddress

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from core.errors import Conflict
from provisioning.models import AddressAssignment, Instance

PRIVATE, PUBLIC = AddressAssignment.Kind.PRIVATE, AddressAssignment.Kind.PUBLIC
TRIES = 8  # a lost race takes the next free addresses; this many losses in a row give up (the task retries)


class PoolExhausted(Conflict):
    default_code = "address_pool_exhausted"


def pool(region: str, kind: str) -> ipaddress.IPv4Network:
    """The region's pool of ``kind`` addresses (its own, else the default)."""
    pools = settings.MERIDIAN_ADDRESS_POOLS
    cidr = (pools.get(region) or {}).get(kind) or pools["default"][kind]
    return ipaddress.ip_network(cidr)


def free(region: str, kind: str) -> int:
    """How many addresses of the pool have no live owner."""
    network = pool(region, kind)
    usable = network.num_addresses - (2 if network.prefixlen < 31 else 0)
    return usable - AddressAssignment.objects.filter(region=region, kind=kind, released_at__isnull=True).count()


def needed(reservation, units: int) -> dict[str, int]:
    """The addresses ``units`` instances of ``reservation`` take, by kind."""
    return {PRIVATE: units, **({PUBLIC: units} if reservation.public_ip else {})}


def dns_name(instance: Instance, tenant_slug: str, region: str) -> str:
    return f"{instance.name}.{tenant_slug}.{region}.{settings.MERIDIAN_DNS_ZONE}".lower()


def assign(instances: list[Instance], *, region: str, public: bool, tenant_slug: str) -> None:
    """
    Give each of ``instances`` (of one reservation, in ``region``) its private address -- and a
    public one when ``public`` -- and its DNS name; PoolExhausted (409) when a pool has too few.
    """
    if not instances:
        return
    kinds = [PRIVATE] + ([PUBLIC] if public else [])
    picked = {kind: _take(instances, region, kind) for kind in kinds}
    for instance in instances:
        instance.private_ip = picked[PRIVATE][instance.pk]
        instance.public_ip = picked[PUBLIC][instance.pk] if public else None
        instance.address = dns_name(instance, tenant_slug, region)
    Instance.objects.bulk_update(instances, ["private_ip", "public_ip", "address"])


def _take(instances: list[Instance], region: str, kind: str) -> dict:
    """The lowest free addresses of the pool, one per instance, inserted under a savepoint (a lost race retries)."""
    network = pool(region, kind)
    _lock_pool(region, kind)
    for _ in range(TRIES):
        taken = set(AddressAssignment.objects.filter(region=region, released_at__isnull=True)
                    .values_list("address", flat=True))
        chosen = []
        for host in network.hosts():
            if str(host) not in taken:
                chosen.append(str(host))
                if len(chosen) == len(instances):
                    break
        if len(chosen) < len(instances):
            raise PoolExhausted(f"No free {kind} address in {region} ({network} is full); the reservation waits "
                                "for one to be released.", region=region, kind=kind)
        rows = [AddressAssignment(tenant_id=instance.tenant_id, instance=instance, region=region, kind=kind,
                                  address=address) for instance, address in zip(instances, chosen, strict=True)]
        try:
            with transaction.atomic():
                AddressAssignment.objects.bulk_create(rows)
        except IntegrityError:
            continue  # another start took one of them first: look again
        return {row.instance_id: row.address for row in rows}
    raise Conflict(f"Lost the race for {kind} addresses in {region} {TRIES} times; the start is tried again.",
                   code="address_race")


def _lock_pool(region: str, kind: str) -> None:
    """
    Starts that draw from one pool take turns until they commit (a transaction-scoped advisory
    lock; SQLite serialises writers anyway): without it, every racer picks the same lowest free
    address and all but one retry. The unique constraint stays the rule; this only spares the retries.
    """
    if connection.vendor == "postgresql":
        key = int.from_bytes(hashlib.sha256(f"meridian:addresses:{region}:{kind}".encode()).digest()[:8], "big",
                             signed=True)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])


def release(instance_ids) -> int:
    """The instances' live addresses go back to their pools; returns how many."""
    ids = list(instance_ids)
    if not ids:
        return 0
    return AddressAssignment.objects.filter(instance_id__in=ids, released_at__isnull=True).update(
        released_at=timezone.now())


def waiting_reason(reservation, units: int) -> str | None:
    """Why ``reservation`` cannot start for want of addresses now (None: its pools have enough)."""
    short = [kind for kind, count in needed(reservation, units).items() if free(reservation.region.slug, kind) < count]
    if not short:
        return None
    return (f"Waiting for a free {' and '.join(short)} address in {reservation.region.slug}: the pool is full; "
            "it starts once addresses are released.")


__all__ = ["PoolExhausted", "assign", "dns_name", "free", "release", "waiting_reason"]
