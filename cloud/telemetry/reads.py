"""
Reads of GPU telemetry: a GPU's latest sample and series (staff), and the telemetry of a
reservation's own GPUs, limited to the time each was the reservation's (tenants).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Q, Sum
from django.utils import timezone

from cloud.models import GPU, GPUSample, GPUSampleRollup, GPUTelemetry, RollupPeriod
from cloud.telemetry.ingestion import LATEST_FIELDS, SAMPLE_FIELDS
from cloud.telemetry.rollups import RAW

PERIODS = (RAW, RollupPeriod.MINUTE.value, RollupPeriod.HOUR.value)
MAX_POINTS = 3000  # a series read is bounded whatever ``since`` says: per GPU, and in all
MAX_POINTS_IN_ALL = 100_000
SPANS = {RAW: timedelta(0), RollupPeriod.MINUTE: timedelta(minutes=1), RollupPeriod.HOUR: timedelta(hours=1)}
DEFAULT_WINDOWS = {
    RAW: timedelta(minutes=10),
    RollupPeriod.MINUTE: timedelta(hours=1),
    RollupPeriod.HOUR: timedelta(days=7),
}


def latest_dict(row: GPUTelemetry | None) -> dict | None:
    return None if row is None else {f: getattr(row, f) for f in LATEST_FIELDS}


def _raw_point(sample: GPUSample) -> dict:
    return {"at": sample.sampled_at, **{f: getattr(sample, f) for f in SAMPLE_FIELDS}, "xids": sample.xids}


def _mean(total: float, count: int) -> float | None:
    return round(total / count, 3) if count else None


def rollup_point(row: GPUSampleRollup) -> dict:
    """A bucket's figures: means and the standard deviation of utilization from its sums."""
    n = row.utilization_samples
    mean = row.utilization_sum / n if n else None
    std = math.sqrt(max(0.0, row.utilization_sumsq / n - mean * mean)) if n else None
    return {
        "at": row.bucket,
        "samples": row.samples,
        "utilization_mean": None if mean is None else round(mean, 3),
        "utilization_std": None if std is None else round(std, 3),
        "utilization_max": row.utilization_max,
        "memory_used_max": row.memory_used_max,
        "temperature_mean": _mean(row.temperature_sum, row.temperature_samples),
        "temperature_max": row.temperature_max,
        "power_mean": _mean(row.power_sum, row.power_samples),
        "power_max": row.power_max,
        "ecc_uncorrected_max": row.ecc_uncorrected_max,
        "xid_count": row.xid_count,
        "idle_samples": row.idle_samples,
    }


def default_since(period: str, now: datetime) -> datetime:
    return now - DEFAULT_WINDOWS[period]


def _series(gpu_ids: list, period: str, since: datetime) -> dict:
    """Points per GPU since ``since`` (oldest first), the newest MAX_POINTS per GPU at most: one query."""
    limit = min(MAX_POINTS * len(gpu_ids), MAX_POINTS_IN_ALL)
    if period == RAW:
        rows = GPUSample.objects.filter(gpu_id__in=gpu_ids, sampled_at__gte=since).order_by("-sampled_at", "-id")[
            :limit
        ]
        points = [(r.gpu_id, _raw_point(r)) for r in rows]
    else:
        rows = GPUSampleRollup.objects.filter(gpu_id__in=gpu_ids, period=period, bucket__gte=since).order_by(
            "-bucket", "gpu_id"
        )[:limit]
        points = [(r.gpu_id, rollup_point(r)) for r in rows]
    by_gpu: dict = {gpu_id: [] for gpu_id in gpu_ids}
    for gpu_id, point in reversed(points):
        by_gpu[gpu_id].append(point)
    return by_gpu


def gpu_series(*, gpu: GPU, period: str, since: datetime | None = None, now: datetime | None = None) -> dict:
    """One GPU's latest sample and its series of ``period`` since ``since`` (staff read; two queries)."""
    now = now or timezone.now()
    since = since or default_since(period, now)
    latest = GPUTelemetry.objects.filter(gpu=gpu).first()
    return {
        "gpu": gpu.pk,
        "period": period,
        "since": since,
        "latest": latest_dict(latest),
        "series": _series([gpu.pk], period, since)[gpu.pk],
    }


def gpus_series(gpu_ids: list, *, period: str = RollupPeriod.MINUTE, now: datetime | None = None) -> dict:
    """Several GPUs' latest samples and their series of ``period`` (a node's page; two queries for them all)."""
    now = now or timezone.now()
    latest = {row.gpu_id: latest_dict(row) for row in GPUTelemetry.objects.filter(gpu_id__in=gpu_ids)}
    series = _series(list(gpu_ids), period, default_since(period, now)) if gpu_ids else {}
    return {gpu_id: {"latest": latest.get(gpu_id), "series": series.get(gpu_id, [])} for gpu_id in gpu_ids}


def held_telemetry(
    *, holds, shared: bool, period: str = RollupPeriod.MINUTE, since: datetime | None = None,
    now: datetime | None = None,
) -> dict:
    """
    The telemetry of GPUs held by someone, limited to the times each was held: ``holds`` are
    ``(gpu_id, gpu_uuid, starts_at, ends_at)`` rows (a reservation's allocations), and what a GPU
    did for an earlier or later holder is never shown. A GPU ``shared`` by slots (fractional
    offerings) shows GPU-wide figures, less its process count, which would tell the neighbours'
    work. Two queries, whatever the GPU count.
    """
    now = now or timezone.now()
    since = since or default_since(period, now)
    windows: dict = {}  # GPU -> (its UUID, [(start, end)] of its holds)
    for gpu_id, uuid, starts_at, ends_at in holds:
        windows.setdefault(gpu_id, (uuid, []))[1].append((starts_at, ends_at))
    if windows:
        since = max(since, min(start for _, spans in windows.values() for start, _ in spans))
    latest = {row.gpu_id: row for row in GPUTelemetry.objects.filter(gpu_id__in=list(windows))}
    series = _series(list(windows), period, since) if windows else {}
    span = SPANS[period]
    gpus = []
    for gpu_id, (uuid, spans) in windows.items():
        row = latest.get(gpu_id)
        current = latest_dict(row) if row is not None and _inside(row.sampled_at, timedelta(0), spans) else None
        if current is not None and shared:
            current["processes"] = None
        points = [p for p in series.get(gpu_id, []) if _inside(p["at"], span, spans)]
        if shared:
            for point in points:
                point.pop("processes", None)
        gpus.append({"uuid": uuid, "latest": current, "series": points})
    return {"period": period, "since": since, "gpus": gpus}


def _inside(at: datetime, span: timedelta, spans: list) -> bool:
    """Whether ``[at, at + span)`` lies within one of the reservation's times on the GPU (all of it)."""
    return any(start <= at and at + span <= end and at < end for start, end in spans)


ERROR_HISTORY_DAYS = 7


def gpu_error_history(gpu_ids: list, *, now: datetime | None = None) -> dict:
    """
    Per GPU, XID errors over the last ERROR_HISTORY_DAYS days (closed hours from the hourly
    rollups, the current hour from the minute ones) and the last XID codes seen with their time
    (from the raw samples, kept an hour): ``{gpu_id: {"xids": n, "last_xids": [...], "last_xid_at": t}}``.
    Two queries for all the GPUs.
    """
    now = now or timezone.now()
    hour = now.replace(minute=0, second=0, microsecond=0)
    window = (Q(period=RollupPeriod.HOUR, bucket__gte=now - timedelta(days=ERROR_HISTORY_DAYS), bucket__lt=hour)
              | Q(period=RollupPeriod.MINUTE, bucket__gte=hour))
    counted = dict(GPUSampleRollup.objects.filter(window, gpu_id__in=gpu_ids).order_by()
                   .values_list("gpu_id").annotate(n=Sum("xid_count")))
    history = {gpu_id: {"xids": counted.get(gpu_id) or 0, "last_xids": [], "last_xid_at": None} for gpu_id in gpu_ids}
    # The newest sample with an XID per GPU (DISTINCT ON where the database has it).
    recent = GPUSample.objects.filter(gpu_id__in=gpu_ids, xid_count__gt=0).values_list("gpu_id", "sampled_at", "xids")
    if connection.vendor == "postgresql":
        recent = recent.order_by("gpu_id", "-sampled_at").distinct("gpu_id")
    else:
        recent = recent.order_by("-sampled_at")
    for gpu_id, sampled_at, xids in recent:
        if history[gpu_id]["last_xid_at"] is None:
            history[gpu_id].update(last_xids=xids, last_xid_at=sampled_at)
    return history
