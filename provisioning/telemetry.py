"""A reservation's telemetry: its GPUs' figures while they were its own (``cloud.telemetry``)."""

from __future__ import annotations

from datetime import datetime

from cloud.models import RollupPeriod
from cloud.telemetry import held_telemetry
from provisioning.models import Allocation


def reservation_telemetry(
    *, reservation, period: str = RollupPeriod.MINUTE, since: datetime | None = None, now: datetime | None = None
) -> dict:
    """
    The telemetry of a reservation's own GPUs (through its allocations), limited to the time each
    GPU was the reservation's. Three queries, whatever the GPU count.
    """
    holds = (Allocation.objects.filter(reservation=reservation)
             .values_list("gpu_id", "gpu__uuid", "starts_at", "ends_at")
             .order_by("gpu__node__hostname", "gpu__index"))
    figures = held_telemetry(holds=holds, shared=reservation.offering.slots_per_gpu > 1, period=period, since=since,
                             now=now)
    return {"reservation": reservation.pk, **figures}
