"""The fleet page's occupancy over time: the share of sellable GPUs held, hour by hour, per GPU model and region."""

from __future__ import annotations

from datetime import datetime, timedelta

from provisioning.history import occupancy_history
from web.charts import PALETTE, line_chart

DAYS = 7


def occupancy_chart(now: datetime) -> dict | None:
    """
    A line per GPU model and region over the last DAYS days (a gap where nothing was sampled),
    its legend, and per line the latest, mean and peak share held; None before the first sample.
    """
    last = now.replace(minute=0, second=0, microsecond=0)
    hours = [last - timedelta(hours=h) for h in range(DAYS * 24 - 1, -1, -1)]
    history = occupancy_history(since=hours[0])
    if not history:
        return None
    series, rows = {}, []
    for (model, region), by_hour in sorted(history.items()):
        name = f"{model} · {region}"
        series[name] = [by_hour.get(hour) for hour in hours]
        shares = list(by_hour.values())
        latest = by_hour[max(by_hour)]
        rows.append({"name": name, "latest": latest, "mean": sum(shares) / len(shares), "peak": max(shares)})
    labels = [f"{hour:%a %d}" if hour.hour == 0 else "" for hour in hours]
    svg = line_chart(series, x_labels=labels, x_total=len(hours), top=100.0,
                     label=f"Share of sellable GPUs held (%), last {DAYS} days")
    legend = [(name, PALETTE[n % len(PALETTE)]) for n, name in enumerate(series)]
    return {"svg": svg, "legend": legend, "rows": rows, "days": DAYS}
