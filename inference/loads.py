"""What the autoscaler decides on: the replicas' GPU utilization and each region's load."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Avg, Count, F, FloatField, Sum
from django.db.models.functions import Cast

from cloud.choices import NodePool
from cloud.models import GPU, GPUSample
from inference.choices import ReplicaState
from inference.models import Endpoint
from provisioning.models import Allocation


def replica_utilization(endpoint: Endpoint, now: datetime) -> dict:
    """
    The mean GPU utilization of the serving replicas over the endpoint's window: each replica's GPUs'
    samples averaged, then the replicas averaged (a replica on a shared GPU reads its GPU's figure).
    """
    reservations = list(endpoint.replicas.filter(state=ReplicaState.SERVING).values_list("reservation_id", flat=True))
    gpus = dict(Allocation.objects.holding(now).filter(reservation_id__in=reservations)
                .values_list("gpu_id", "reservation_id"))
    since = now - timedelta(seconds=endpoint.window_seconds)
    per_gpu = dict(GPUSample.objects.filter(gpu_id__in=list(gpus), sampled_at__gt=since, sampled_at__lte=now,
                                            utilization_pct__isnull=False)
                   .values("gpu_id").annotate(mean=Avg("utilization_pct")).values_list("gpu_id", "mean"))
    by_replica: dict = {}
    for gpu, mean in per_gpu.items():
        by_replica.setdefault(gpus[gpu], []).append(mean)
    means = [sum(v) / len(v) for v in by_replica.values()]
    return {"serving": len(reservations), "measured": len(means),
            "utilization": round(sum(means) / len(means), 1) if means else None,
            "window_seconds": endpoint.window_seconds}


def region_load(region: str, endpoint: Endpoint, now: datetime) -> float:
    """The share (0..1) of the region's shared GPUs of the endpoint's model held now (slots by their share)."""
    model = endpoint.offering.gpu_model_id
    total = GPU.objects.filter(node__region__slug=region, node__pool=NodePool.SHARED, node__is_spare=False,
                               model_id=model).aggregate(n=Count("pk"))["n"]
    if not total:
        return 1.0
    held = (Allocation.objects.holding(now)
            .filter(node__region__slug=region, node__pool=NodePool.SHARED, gpu__model_id=model)
            .aggregate(share=Sum(Cast(F("mem_hi") - F("mem_lo"), FloatField()) / F("gpu__memory_mib"))))["share"]
    return min(1.0, (held or 0.0) / total)
