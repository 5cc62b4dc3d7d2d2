"""
Rollups and retention of GPU samples.

``rollup`` turns raw samples of closed minutes into 1-minute buckets and 1-minute buckets of closed
hours into 1-hour buckets, in SQL (INSERT ... SELECT ... GROUP BY the truncated time), starting
after each period's watermark (its last bucket) and upserting, so a second or concurrent run adds
nothing twice. ``prune`` drops what is past ``MERIDIAN_TELEMETRY_RETENTION``, never what is not
rolled up yet.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Min
from django.utils import timezone

from cloud.models import GPUSample, GPUSampleRollup, RollupPeriod

RAW = "raw"
# A minute is rolled up once it closed this long ago: a heartbeat stamped in its last second has
# committed by then.
ROLLUP_GRACE = timedelta(seconds=10)

# Per database: a bucket's start as the column stores it, and a float cast. SQLite keeps
# datetimes as 'YYYY-MM-DD HH:MM:SS[.ffffff]' text in UTC (Django's format), so truncation is text.
_TRUNC = {
    "postgresql": {
        "minute": "date_trunc('minute', {col}, 'UTC')",
        "hour": "date_trunc('hour', {col}, 'UTC')",
        "float": "CAST({expr} AS double precision)",
    },
    "sqlite": {
        "minute": "strftime('%%Y-%%m-%%d %%H:%%M:00', {col})",
        "hour": "strftime('%%Y-%%m-%%d %%H:00:00', {col})",
        "float": "CAST({expr} AS REAL)",
    },
}
ROLLUP_COLUMNS = (
    "gpu_id",
    "period",
    "bucket",
    "samples",
    "utilization_samples",
    "utilization_sum",
    "utilization_sumsq",
    "utilization_max",
    "memory_used_max",
    "temperature_samples",
    "temperature_sum",
    "temperature_max",
    "power_samples",
    "power_sum",
    "power_max",
    "ecc_uncorrected_max",
    "xid_count",
    "idle_samples",
)


def _minute_select(vendor: dict) -> str:
    bucket = vendor["minute"].format(col="sampled_at")
    utilization, temperature = (vendor["float"].format(expr=c) for c in ("utilization_pct", "temperature_c"))
    # Only our own table, column and function names are put into the statement.
    return (
        f"SELECT gpu_id, %s, {bucket}, COUNT(*), COUNT(utilization_pct), "  # noqa: S608
        f"COALESCE(SUM({utilization}), 0), COALESCE(SUM({utilization} * utilization_pct), 0), "
        "MAX(utilization_pct), MAX(memory_used_mib), "
        f"COUNT(temperature_c), COALESCE(SUM({temperature}), 0), MAX(temperature_c), "
        "COUNT(power_w), COALESCE(SUM(power_w), 0), MAX(power_w), MAX(ecc_uncorrected), COALESCE(SUM(xid_count), 0), "
        "SUM(CASE WHEN utilization_pct = 0 AND COALESCE(processes, 0) = 0 THEN 1 ELSE 0 END) "
        f"FROM {connection.ops.quote_name(GPUSample._meta.db_table)} "
        f"WHERE sampled_at >= %s AND sampled_at < %s GROUP BY gpu_id, {bucket}"
    )


def _hour_select(vendor: dict) -> str:
    bucket = vendor["hour"].format(col="bucket")
    return (
        f"SELECT gpu_id, %s, {bucket}, SUM(samples), SUM(utilization_samples), SUM(utilization_sum), "  # noqa: S608
        "SUM(utilization_sumsq), MAX(utilization_max), MAX(memory_used_max), SUM(temperature_samples), "
        "SUM(temperature_sum), MAX(temperature_max), SUM(power_samples), SUM(power_sum), MAX(power_max), "
        "MAX(ecc_uncorrected_max), SUM(xid_count), SUM(idle_samples) "
        f"FROM {connection.ops.quote_name(GPUSampleRollup._meta.db_table)} "
        f"WHERE period = %s AND bucket >= %s AND bucket < %s GROUP BY gpu_id, {bucket}"
    )


def _upsert_rollups(select: str, params: list) -> int:
    table = connection.ops.quote_name(GPUSampleRollup._meta.db_table)
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in ROLLUP_COLUMNS[3:])
    # Upsert, not plain insert: a rollup that runs twice over the same buckets (two beat runs at
    # once, a retried task) writes the same figures again instead of failing or adding twice.
    statement = (
        f"INSERT INTO {table} ({', '.join(ROLLUP_COLUMNS)}) {select} "  # noqa: S608 -- our own names
        f"ON CONFLICT (gpu_id, period, bucket) DO UPDATE SET {updates}"
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return max(cursor.rowcount, 0)


def _floor(moment: datetime, unit: str) -> datetime:
    moment = moment.replace(second=0, microsecond=0)
    return moment.replace(minute=0) if unit == "hour" else moment


def _watermark(period: str) -> datetime | None:
    """The start of the last bucket rolled up for ``period`` (None before the first)."""
    return GPUSampleRollup.objects.filter(period=period).aggregate(last=Max("bucket"))["last"]


def rollup(*, now: datetime | None = None) -> dict:
    """
    Roll raw samples of closed minutes into 1-minute buckets, then 1-minute buckets of closed hours
    into 1-hour buckets. Each period starts after its watermark (the last bucket it has), so a
    second run adds nothing; the upsert keeps two overlapping runs harmless too. Returns the
    number of buckets written per period.
    """
    now = now or timezone.now()
    vendor = _TRUNC.get(connection.vendor, _TRUNC["sqlite"])
    adapt = connection.ops.adapt_datetimefield_value
    written = {RollupPeriod.MINUTE.value: 0, RollupPeriod.HOUR.value: 0}
    with transaction.atomic():
        if not _rollup_lock():
            return written  # another worker is rolling up right now; the next run continues after it
        closed = now - ROLLUP_GRACE
        end = _floor(closed, "minute")
        last = _watermark(RollupPeriod.MINUTE)
        if last is not None:
            start = last + timedelta(minutes=1)
        else:
            first = GPUSample.objects.aggregate(first=Min("sampled_at"))["first"]
            start = _floor(first, "minute") if first else end
        if start < end:
            written[RollupPeriod.MINUTE.value] = _upsert_rollups(
                _minute_select(vendor), [RollupPeriod.MINUTE.value, adapt(start), adapt(end)]
            )
        end = _floor(closed, "hour")
        last = _watermark(RollupPeriod.HOUR)
        if last is not None:
            start = last + timedelta(hours=1)
        else:
            first = GPUSampleRollup.objects.filter(period=RollupPeriod.MINUTE).aggregate(first=Min("bucket"))["first"]
            start = _floor(first, "hour") if first else end
        if start < end:
            written[RollupPeriod.HOUR.value] = _upsert_rollups(
                _hour_select(vendor), [RollupPeriod.HOUR.value, RollupPeriod.MINUTE.value, adapt(start), adapt(end)]
            )
    return written


def _rollup_lock() -> bool:
    """PostgreSQL: one rollup at a time (a transaction-level advisory lock). SQLite serialises writers anyway."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(hashtext('meridian:telemetry_rollup'))")
        return bool(cursor.fetchone()[0])


def prune(*, now: datetime | None = None) -> dict:
    """
    Delete raw samples and rollups older than ``MERIDIAN_TELEMETRY_RETENTION`` (raw, 1m, 1h),
    but never raw samples of minutes not rolled up yet, nor minutes of hours not rolled up yet:
    a stopped beat loses no figure to retention. Returns the rows deleted per kind.
    """
    now = now or timezone.now()
    retention = settings.MERIDIAN_TELEMETRY_RETENTION
    minute_mark, hour_mark = _watermark(RollupPeriod.MINUTE), _watermark(RollupPeriod.HOUR)
    raw_cut = now - retention[RAW]
    raw_cut = min(raw_cut, minute_mark + timedelta(minutes=1)) if minute_mark else None
    minute_cut = now - retention[RollupPeriod.MINUTE]
    minute_cut = min(minute_cut, hour_mark + timedelta(hours=1)) if hour_mark else None
    deleted = {RAW: 0, RollupPeriod.MINUTE.value: 0, RollupPeriod.HOUR.value: 0}
    if raw_cut is not None:
        deleted[RAW] = GPUSample.objects.filter(sampled_at__lt=raw_cut).delete()[0]
    if minute_cut is not None:
        deleted[RollupPeriod.MINUTE.value] = GPUSampleRollup.objects.filter(
            period=RollupPeriod.MINUTE, bucket__lt=minute_cut
        ).delete()[0]
    deleted[RollupPeriod.HOUR.value] = GPUSampleRollup.objects.filter(
        period=RollupPeriod.HOUR, bucket__lt=now - retention[RollupPeriod.HOUR]
    ).delete()[0]
    return deleted
