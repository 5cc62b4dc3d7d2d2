"""
The row locks provisioning takes, and the one order it takes them in: a tenant, then its
reservations, then their operations, then nodes, then GPUs -- each set in primary-key order. Two
transactions that lock in the same order never wait on each other in a deadlock, so every
service, step and reaper that locks more than one kind of row locks it through these functions,
in this order (a cancel moves the reservation, then stops its operations; a failed step holds
its reservation, then marks the node).
"""

from __future__ import annotations

from django.db import connection

from cloud.models import GPU, Node
from core.db import fast_cursor
from core.errors import Forbidden
from provisioning.models import Operation, Reservation
from tenants.models import Tenant


def tenant_lock(tenant: Tenant) -> Tenant:
    """
    The tenant's row, locked for the transaction: one create at a time per tenant, so two racing
    requests cannot both pass the quota check (SQLite serialises writers anyway). The caller's
    copy of the tenant serves; only the lock is asked for, by a statement of the same short text
    every time (prepared: its plan is the primary key's, whatever the id).
    """
    if connection.vendor == "postgresql":
        table = connection.ops.quote_name(Tenant._meta.db_table)
        with fast_cursor() as cursor:
            cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", [tenant.pk])  # noqa: S608
            if cursor.fetchone() is None:
                raise Forbidden("This tenant no longer exists.")
    return tenant


def reservations_lock(ids) -> list:
    """These reservations' rows, locked in key order; the keys of those that still exist."""
    ids = sorted(set(ids))
    if not ids:
        return []
    return list(Reservation.objects.select_for_update().filter(pk__in=ids).order_by("pk").values_list("pk", flat=True))


def operations_lock(ids) -> dict:
    """These operations' rows, locked in key order: each one's state, step and dispatch token, by key."""
    locked = (Operation.objects.select_for_update().filter(pk__in=sorted(set(ids)))
              .order_by("pk").values_list("pk", "state", "step", "dispatch"))
    return {pk: (state, step, dispatch) for pk, state, step, dispatch in locked}


def node_lock(node_id) -> Node:
    """The node's row, locked, with its region, fabric and leaf switch."""
    return Node.objects.select_for_update().select_related("region", "fabric", "leaf").get(pk=node_id)


def gpus_lock(ids) -> dict:
    """These GPUs' rows, locked in key order: each one's state, by key."""
    ids = sorted(set(ids))
    if not ids:
        return {}
    return dict(GPU.objects.select_for_update().filter(pk__in=ids).order_by("pk").values_list("pk", "state"))
