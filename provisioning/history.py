"""
History for the console's charts, sampled every MERIDIAN_HISTORY_SAMPLE_SECONDS (a beat task):
each queued reservation's place in its GPU model's queue and its estimated start, and the
fleet's occupancy by GPU model, region and pool. Kept MERIDIAN_HISTORY_DAYS, then pruned.

A sample costs a fixed number of queries: one read of the queue, two per GPU model, region and
pool that queued work asks for first (the free-GPU timeline), one of the fleet, and the inserts.
Positions and estimates follow ``scheduling.queue``'s rules (same order, same timeline), so the
chart ends where the reservation page's figures are.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Q, Sum
from django.db.models.functions import TruncHour, TruncMinute
from django.utils import timezone

from cloud.choices import pool_of
from cloud.models import GPU
from provisioning.capacity import SELLABLE_HEALTH
from provisioning.choices import ReservationState as R
from provisioning.models import Allocation, OccupancySample, QueueSample, Reservation
from provisioning.scheduling.queue import free_enough_from, free_timeline

MAX_SAMPLED = 20_000  # the scheduler's own queue limit (scheduling.scheduler.MAX_QUEUE)
BATCH = 1000


def history_sample(now: datetime | None = None) -> dict:
    """Take one sample of the queue and the fleet, and prune what is past the retention; returns the counts."""
    now = now or timezone.now()
    with transaction.atomic():
        queue = QueueSample.objects.bulk_create(queue_samples(now), batch_size=BATCH)
        occupancy = OccupancySample.objects.bulk_create(occupancy_samples(now), batch_size=BATCH)
    pruned = history_prune(now)
    return {"queue": len(queue), "occupancy": len(occupancy), "pruned": pruned}


def queue_samples(now: datetime) -> list[QueueSample]:
    """Every queued reservation not held: its place among those wanting its GPU model, and its estimated start."""
    rows = (Reservation.objects.filter(state=R.QUEUED, held_at__isnull=True)
            .order_by("gpu_model_id", "-score", "submitted_at")
            .values_list("pk", "gpu_model_id", "regions", "offering__kind", "gpus", "requested_start")[:MAX_SAMPLED])
    placed_ahead: dict = defaultdict(int)  # GPU model -> GPUs wanted by those ranked above
    position: dict = defaultdict(int)
    wants = []
    for pk, model, regions, kind, gpus, requested_start in rows:
        position[model] += 1
        needed = max(gpus, 1) + placed_ahead[model]
        placed_ahead[model] += gpus
        wants.append((pk, position[model], (model, regions[0], pool_of(kind)), needed, requested_start))
    most: dict = defaultdict(int)
    for *_, group, needed, _ in wants:
        most[group] = max(most[group], needed)
    timelines = {group: free_timeline(gpu_model_id=group[0], region=Q(node__region__slug=group[1]), pool=group[2],
                                      now=now, most=needed) for group, needed in most.items()}
    return [QueueSample(reservation_id=pk, at=now, position=place,
                        estimated_start=free_enough_from(*timelines[group], needed=needed,
                                                         start=max(requested_start or now, now)))
            for pk, place, group, needed, requested_start in wants]


def occupancy_samples(now: datetime) -> list[OccupancySample]:
    """Sellable GPUs and those held now, per region, GPU model and pool (one grouped read)."""
    holding = Allocation.objects.filter(gpu=OuterRef("pk"), starts_at__lt=now, ends_at__gt=now)
    rows = (GPU.objects.filter(node__is_spare=False, health__in=SELLABLE_HEALTH)
            .annotate(busy=Exists(holding))
            .values("node__region_id", "model_id", "node__pool")
            .annotate(gpus=Count("pk"), held=Count("pk", filter=Q(busy=True)))
            .order_by())
    return [OccupancySample(at=now, region_id=row["node__region_id"], gpu_model_id=row["model_id"],
                            pool=row["node__pool"], gpus=row["gpus"], held=row["held"]) for row in rows]


def history_prune(now: datetime) -> int:
    """Drop samples older than MERIDIAN_HISTORY_DAYS; returns how many."""
    before = now - settings.MERIDIAN_HISTORY_RETENTION
    queue, _ = QueueSample.objects.filter(at__lt=before).delete()
    occupancy, _ = OccupancySample.objects.filter(at__lt=before).delete()
    return queue + occupancy


def queue_history(reservation: Reservation, *, most: int = 288) -> list[QueueSample]:
    """The reservation's last ``most`` queue samples (a day at the default period), oldest first."""
    samples = list(QueueSample.objects.filter(reservation=reservation).order_by("-at")[:most])
    samples.reverse()
    return samples


def first_occupancy_sample(*, since: datetime) -> datetime | None:
    """When the fleet was first sampled after ``since`` (None: not yet)."""
    return OccupancySample.objects.filter(at__gte=since).order_by("at").values_list("at", flat=True).first()


def occupancy_history(*, since: datetime, hourly: bool = True) -> dict[tuple[str, str], dict[datetime, float]]:
    """
    The share of sellable GPUs held per (GPU model, region) name, both pools together, hour by
    hour (or minute by minute): ``{(model, region): {bucket: percent}}``, the samples of a bucket
    weighed by their GPUs. One grouped read of at most a row per series and bucket.
    """
    bucket = (TruncHour if hourly else TruncMinute)("at")
    rows = (OccupancySample.objects.filter(at__gte=since)
            .annotate(bucket=bucket).values("gpu_model__name", "region__name", "bucket")
            .annotate(held=Sum("held"), gpus=Sum("gpus")).order_by("gpu_model__name", "region__name", "bucket"))
    series: dict = defaultdict(dict)
    for row in rows:
        series[(row["gpu_model__name"], row["region__name"])][row["bucket"]] = (
            100.0 * row["held"] / row["gpus"] if row["gpus"] else 0.0)
    return dict(series)
