"""
What can be sold right now, per offering and region: aggregate counts only, never identities.

Read-only selectors. A bare-metal unit is a whole available node; a VM or container unit needs
``gpus_per_unit`` available GPUs on one shared host; a fractional unit is one slot of a GPU.
Spares, nodes that are not serving, unhealthy GPUs and GPUs held by a reservation now never count.
"""

from collections import defaultdict

from django.db.models import Count, Exists, OuterRef, Subquery, UUIDField
from django.utils import timezone

from .choices import GPUState, Health, NodePool, NodeState, OfferingKind
from .models import GPU, Node, Offering

SELLABLE_HEALTH = [Health.HEALTHY, Health.DEGRADED]


def availability(offerings: list[Offering]) -> dict:
    """``{offering_id: {region_slug: {"units": n, "gpus": g}}}`` in two queries, whatever the fleet size."""
    from provisioning.models import Allocation  # provisioning builds on the inventory, not the reverse

    now = timezone.now()
    held_now = Allocation.objects.holding(now)
    model_ids = {o.gpu_model_id for o in offerings}
    # Whole available bare-metal nodes per (region, GPU model).
    nodes = defaultdict(int)
    if any(o.kind == OfferingKind.BARE_METAL for o in offerings):
        # A node's GPUs are of one model (enrolment checks it): the node is counted under it, one
        # row per node -- joining its GPUs made eight rows a node to sort and count distinct.
        of_model = GPU.objects.filter(node=OuterRef("pk"), model_id__in=model_ids)
        rows = (
            Node.objects.filter(Exists(of_model), pool=NodePool.BARE_METAL, state=NodeState.AVAILABLE,
                                is_spare=False, health__in=SELLABLE_HEALTH)
            # a whole node sells only whole
            .exclude(Exists(GPU.objects.filter(node=OuterRef("pk"), health__in=[Health.FAILED, Health.UNKNOWN])))
            .exclude(Exists(held_now.filter(node=OuterRef("pk"))))
            # typed, so SQLite's text ids come back as UUIDs like the offerings' model ids
            .annotate(gpu_model=Subquery(of_model.order_by().values("model_id")[:1], output_field=UUIDField()))
            .values("region__slug", "gpu_model")
            .annotate(n=Count("id"))
        )
        for row in rows:
            nodes[(row["region__slug"], row["gpu_model"])] += row["n"]
    # Available GPUs per shared host, kept per host because a unit cannot span hosts.
    per_host = defaultdict(list)
    if any(o.kind != OfferingKind.BARE_METAL for o in offerings):
        rows = (
            GPU.objects.filter(node__pool=NodePool.SHARED, node__state=NodeState.IN_SERVICE, node__is_spare=False,
                               state=GPUState.AVAILABLE, health__in=SELLABLE_HEALTH, model_id__in=model_ids)
            .exclude(Exists(held_now.filter(gpu=OuterRef("pk"))))
            .values("node_id", "node__region__slug", "model_id")
            .annotate(n=Count("id"))
        )
        for row in rows:
            per_host[(row["node__region__slug"], row["model_id"])].append(row["n"])
    regions = {region for region, _ in nodes} | {region for region, _ in per_host}

    result = {}
    for offering in offerings:
        by_region = {}
        for region in sorted(regions):
            key = (region, offering.gpu_model_id)
            if offering.kind == OfferingKind.BARE_METAL:
                units = nodes.get(key, 0)
                gpus = units * offering.gpus_per_unit
            else:
                hosts = per_host.get(key, [])
                units = sum(n // offering.gpus_per_unit for n in hosts) * offering.slots_per_gpu
                gpus = sum(hosts)
            if units or gpus:
                by_region[region] = {"units": units, "gpus": gpus}
        result[offering.pk] = by_region
    return result
