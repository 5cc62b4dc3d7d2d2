"""
The fleet page's occupancy over time: the share of sellable GPUs held per GPU model and region,
hour by hour over the last DAYS days, or minute by minute while the history is under a day old
(a fleet just started, the demo).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from provisioning.history import first_occupancy_sample, occupancy_history
from web.charts import PALETTE, line_chart, time_labels

DAYS = 7


def occupancy_chart(now: datetime) -> dict | None:
    """
    A line per GPU model and region (a gap where nothing was sampled), its legend, and per line the
    latest, mean and peak share held; None before the first sample.
    """
    first = first_occupancy_sample(since=now - timedelta(days=DAYS))
    if first is None:
        return None
    hourly = now - first > timedelta(days=1)
    step = timedelta(hours=1) if hourly else timedelta(minutes=1)
    last = now.replace(minute=0, second=0, microsecond=0) if hourly else now.replace(second=0, microsecond=0)
    start = (last - timedelta(days=DAYS) + step) if hourly else first.replace(second=0, microsecond=0)
    buckets = [start + i * step for i in range(int((last - start) / step) + 1)]
    history = occupancy_history(since=buckets[0], hourly=hourly)
    if not history:
        return None
    series, rows = {}, []
    for (model, region), by_bucket in sorted(history.items()):
        name = f"{model} · {region}"
        series[name] = [by_bucket.get(bucket) for bucket in buckets]
        shares = list(by_bucket.values())
        rows.append({"name": name, "latest": by_bucket[max(by_bucket)], "mean": sum(shares) / len(shares),
                     "peak": max(shares)})
    if hourly:
        labels = [f"{b:%a %d}" if b.hour == 0 else "" for b in buckets]
        period = f"last {DAYS} days, hourly"
    else:
        labels = time_labels(buckets)
        period = f"since {first:%H:%M} UTC, by the minute"
    svg = line_chart(series, x_labels=labels, x_total=len(buckets), top=100.0,
                     label=f"Share of sellable GPUs held (%), {period}")
    legend = [(name, PALETTE[n % len(PALETTE)]) for n, name in enumerate(series)]
    return {"svg": svg, "legend": legend, "rows": rows, "period": period}
