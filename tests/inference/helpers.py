"""Endpoints on a small simulated fleet: made through the API, driven by hand-set GPU samples."""

from __future__ import annotations

import os
import shutil
from datetime import timedelta

from django.utils import timezone

from cloud.catalogue import load_gpu_catalogue
from cloud.fleet import FleetSpec, build_fleet
from cloud.models import GPU, GPUModel, GPUSample, Offering
from inference.models import Endpoint
from provisioning.drivers.simulated_devices import trust_simulated_fleet
from provisioning.models import Allocation
from tests.provisioning.factories import held, make_reservation


def two_regions(nodes: int = 4) -> None:
    """us-east-1 and eu-north-1, each with shared hosts of H100s (the fleet's fifth region sells H100s again)."""
    load_gpu_catalogue(GPUModel)
    for first in (0, 4):
        build_fleet(FleetSpec(regions=1, first_region=first, nodes_per_fabric=nodes, spare_ratio=0.0,
                              shared_ratio=0.5))
    trust_simulated_fleet()


def whole_gpu_container() -> Offering:
    return Offering.objects.get_or_create(slug="ct-h100x1", defaults={
        "name": "Container 1x H100", "kind": "container", "gpus_per_unit": 1, "price_per_gpu_hour": "2.00",
        "gpu_model": GPUModel.objects.get(slug="h100-80gb-sxm")})[0]


def time_sliced(klass: str = "realtime", n: int = 4) -> Offering:
    return Offering.objects.get_or_create(slug=f"ct-h100-ts-{klass}-{n}", defaults={
        "name": f"Container time-sliced 1/{n} H100 ({klass})", "kind": "container", "gpus_per_unit": 1,
        "slots_per_gpu": n, "isolation_mode": "time_sliced", "time_slice_class": klass, "price_per_gpu_hour": "2.00",
        "gpu_model": GPUModel.objects.get(slug="h100-80gb-sxm")})[0]


def body(**overrides) -> dict:
    return {"name": "chat", "share": {"gpu_model": "h100-80gb-sxm"}, "regions": ["us-east-1"], "min_replicas": 1,
            "max_replicas": 4, **overrides}


def replica_gpus(endpoint: Endpoint) -> list:
    now = timezone.now()
    live = endpoint.replicas.exclude(state="gone").values("reservation_id")
    return list(Allocation.objects.holding(now).filter(reservation_id__in=live).values_list("gpu_id", flat=True))


def sample(gpu_ids, utilization: int, *, ago_s: float = 1.0) -> None:
    at = timezone.now() - timedelta(seconds=ago_s)
    GPUSample.objects.bulk_create(GPUSample(gpu_id=g, sampled_at=at, utilization_pct=utilization) for g in gpu_ids)


def fill(world, region: str, share: float) -> list:
    """Hold ``share`` of the region's shared H100s for another tenant's work (whole GPUs); the GPUs held."""
    now = timezone.now()
    gpus = list(GPU.objects.filter(node__region__slug=region, node__pool="shared", node__is_spare=False)
                .order_by("node__hostname", "index"))
    busy = set(Allocation.objects.holding(now).values_list("gpu_id", flat=True))
    free = [g for g in gpus if g.pk not in busy]
    taken = free[: max(0, round(len(gpus) * share) - (len(gpus) - len(free)))]
    held(make_reservation(world, side="t2", state="active"), taken, start=now - timedelta(hours=1),
         end=now + timedelta(hours=10))
    return taken


def haproxy_binary() -> str | None:
    return shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
