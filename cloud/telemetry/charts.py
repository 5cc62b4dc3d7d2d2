"""A GPU's last stretch of minute rollups (``rollup_point``) drawn as the console's sparklines."""

from __future__ import annotations

from web.charts import sparkline

# Power is drawn on a fixed scale up to an SXM GPU's board power (700 W), or higher if one drew more,
# so two GPUs' lines compare at a glance.
POWER_SCALE_W = 700.0


def gpu_sparklines(points: list[dict], *, memory_mib: int) -> dict:
    """``utilization`` (0-100 %), ``memory`` (0 to the GPU's memory, GiB) and ``power`` (W) of ``points``."""
    power = [p["power_mean"] for p in points]
    memory = [None if p["memory_used_max"] is None else p["memory_used_max"] / 1024 for p in points]
    return {
        "utilization": sparkline([p["utilization_mean"] for p in points], top=100, label="Utilization", unit=" %"),
        "memory": sparkline(memory, top=memory_mib / 1024, label="Memory used", unit=" GiB"),
        "power": sparkline(power, top=max([POWER_SCALE_W, *[w for w in power if w is not None]]), label="Power",
                           unit=" W"),
    }
