"""
The staff console's search: one box for a node (hostname), a reservation (id or name), a tenant
(name or slug), an address (an instance's private, public or IPoIB address, now or earlier) or a
GPU (UUID or serial). A fixed number of queries, each capped.
"""

from __future__ import annotations

import ipaddress
import uuid

from django.db.models import Q

from cloud.models import GPU, Node
from provisioning.access_models import AddressAssignment
from provisioning.models import PortMembership, Reservation
from tenants.models import Tenant

LIMIT = 20
MIN_LENGTH = 2


def staff_search(text: str) -> dict:
    """What matches ``text``, by kind; empty lists for a blank or too short query."""
    text = text.strip()[:200]
    found = {"nodes": [], "reservations": [], "tenants": [], "addresses": [], "gpus": []}
    if len(text) < MIN_LENGTH:
        return found
    as_id = _uuid(text)
    found["nodes"] = list(Node.objects.filter(hostname__icontains=text).select_related("region")
                          .order_by("hostname")[:LIMIT])
    reservations = Q(name__icontains=text) | (Q(pk=as_id) if as_id else Q())
    found["reservations"] = list(Reservation.objects.filter(reservations).select_related("tenant", "offering")
                                 .order_by("-submitted_at")[:LIMIT])
    found["tenants"] = list(Tenant.objects.filter(Q(name__icontains=text) | Q(slug__icontains=text))
                            .order_by("name")[:LIMIT])
    found["gpus"] = list(GPU.objects.filter(Q(uuid__iexact=text) | Q(serial__iexact=text)).select_related("node")
                         [:LIMIT])
    if _address(text):
        found["addresses"] = _addresses(text)
    return found


def _addresses(address: str) -> list[dict]:
    """Who held ``address``: instances' private and public addresses and IPoIB addresses, newest first."""
    held = [{"address": a.address, "kind": a.get_kind_display(), "since": a.assigned_at, "until": a.released_at,
             "instance": a.instance.name, "reservation": a.instance.reservation, "region": a.region}
            for a in AddressAssignment.objects.filter(address=address).select_related(
                "instance__reservation__tenant").order_by("-assigned_at")[:LIMIT]]
    held += [{"address": m.address, "kind": "IPoIB", "since": m.joined_at, "until": m.left_at,
              "instance": m.instance.name, "reservation": m.instance.reservation, "region": m.vpc.fabric.region.slug}
             for m in PortMembership.objects.filter(address=address).select_related(
                 "instance__reservation__tenant", "vpc__fabric__region").order_by("-joined_at")[:LIMIT]]
    return sorted(held, key=lambda row: row["since"], reverse=True)[:LIMIT]


def _uuid(text: str):
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _address(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True
