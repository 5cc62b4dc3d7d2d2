"""
What can be sold right now, per offering and region: aggregate counts only, never identities.

Read-only selectors. A bare-metal unit is a whole available node; a VM or container unit needs
``gpus_per_unit`` available GPUs on one shared host; a fractional unit is one slot of a GPU.
Spares, nodes that are not serving or being attested, unhealthy GPUs and GPUs held by a reservation
now never count.
"""

from collections import defaultdict
from uuid import UUID

from django.db import connection
from django.db.models import Count, Exists, OuterRef, QuerySet, Subquery, UUIDField
from django.utils import timezone

from cloud.choices import GPUState, Health, NodePool, NodeState, OfferingKind
from cloud.models import GPU, Node, Offering

SELLABLE_HEALTH = [Health.HEALTHY, Health.DEGRADED]


def availability(offerings: list[Offering]) -> dict:
    """``{offering_id: {region_slug: {"units": n, "gpus": g}}}`` in two queries, whatever the fleet size."""
    from provisioning.choices import OperationKind, OperationState
    from provisioning.models import Allocation, Operation  # provisioning builds on the inventory, not the reverse

    now = timezone.now()
    held_now = Allocation.objects.holding(now)
    # An idle node proving itself again is not sold until it has passed (as placement reads it,
    # provisioning.scheduling.snapshot): a count that took it in promised "now" to work that then queued.
    attesting = Operation.objects.filter(kind=OperationKind.ATTEST,
                                         state__in=[OperationState.PENDING, OperationState.RUNNING])
    model_ids = {o.gpu_model_id for o in offerings}
    # Whole available bare-metal nodes per (region, GPU model, confidential capacity or not).
    nodes = defaultdict(int)
    if any(o.kind == OfferingKind.BARE_METAL for o in offerings):
        # A node's GPUs are of one model (enrolment checks it): the node is counted under it, one
        # row per node -- joining its GPUs made eight rows a node to sort and count distinct.
        of_model = GPU.objects.filter(node=OuterRef("pk"), model_id__in=model_ids)
        rows = (
            Node.objects.filter(Exists(of_model), pool=NodePool.BARE_METAL, state=NodeState.AVAILABLE,
                                is_spare=False, health__in=SELLABLE_HEALTH)
            # a whole node sells only whole (read from gpu_unsellable_idx, which holds only such GPUs)
            .exclude(Exists(GPU.objects.filter(node=OuterRef("pk"), health__in=[Health.FAILED, Health.UNKNOWN])))
            .exclude(Exists(held_now.filter(node=OuterRef("pk"))))
            .exclude(Exists(attesting.filter(node=OuterRef("pk"))))
            # typed, so SQLite's text ids come back as UUIDs like the offerings' model ids
            .annotate(gpu_model=Subquery(of_model.order_by().values("model_id")[:1], output_field=UUIDField()))
            .values("region__slug", "gpu_model", "confidential")
            .annotate(n=Count("id"))
        )
        for row in rows:
            nodes[(row["region__slug"], row["gpu_model"], row["confidential"])] += row["n"]
    # Shared hosts per (region, GPU model) by how many GPUs each has free: a unit cannot span hosts,
    # so the count of hosts with n free is all the arithmetic needs -- a handful of rows (n is at
    # most a host's GPUs) rather than one per host.
    hosts_with_free = defaultdict(list)  # (region, model, confidential) -> [(free GPUs, hosts with that many)]
    if any(o.kind != OfferingKind.BARE_METAL for o in offerings):
        per_host = (
            GPU.objects.filter(node__pool=NodePool.SHARED, node__state=NodeState.IN_SERVICE, node__is_spare=False,
                               state=GPUState.AVAILABLE, health__in=SELLABLE_HEALTH, model_id__in=model_ids)
            .exclude(Exists(held_now.filter(gpu=OuterRef("pk"))))
            .exclude(Exists(attesting.filter(node=OuterRef("node_id"))))
            .values("node_id", "node__region__slug", "model_id", "node__confidential")
            .annotate(n=Count("id"))
        )
        for region, model, confidential, free, hosts in _histogram(
                per_host, ("node__region__slug", "model_id", "node__confidential", "n")):
            # SQLite hands the model id back as its stored hex text (and the flag as 0 or 1)
            model = model if isinstance(model, UUID) else UUID(model)
            hosts_with_free[(region, model, bool(confidential))].append((free, hosts))
    regions = {key[0] for key in nodes} | {key[0] for key in hosts_with_free}

    result = {}
    for offering in offerings:
        by_region = {}
        for region in sorted(regions):
            key = (region, offering.gpu_model_id, offering.confidential)
            if offering.kind == OfferingKind.BARE_METAL:
                units = nodes.get(key, 0)
                gpus = units * offering.gpus_per_unit
            else:
                counts = hosts_with_free.get(key, [])
                units = sum(free // offering.gpus_per_unit * hosts for free, hosts in counts) * offering.slots_per_gpu
                gpus = sum(free * hosts for free, hosts in counts)
            if units or gpus:
                by_region[region] = {"units": units, "gpus": gpus}
        result[offering.pk] = by_region
    return result


def _histogram(grouped: QuerySet, columns: tuple[str, ...]) -> list[tuple]:
    """
    ``columns`` of the grouped ``values().annotate()`` query with how many of its rows share them.
    The ORM cannot group the rows of an aggregate, so its SQL becomes a derived table.
    """
    sql, params = grouped.query.sql_with_params()
    names = ", ".join(connection.ops.quote_name(column) for column in columns)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {names}, COUNT(*) FROM ({sql}) AS grouped GROUP BY {names}", params)  # noqa: S608
        return cursor.fetchall()
