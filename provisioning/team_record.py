"""
A team's record, read from what the database holds, as the inputs of the priority score.

Read-only queries. Per DESIGN.md: fulfilment over 30 days (reservations used as booked rather
than cancelled late or never used), current load (GPUs in use / the team's quota for that GPU
model; without a team quota the tenant's), and recent usage decayed by a half-life against the
team's fair share. A team (or a tenant's team-less work) with no history gets the neutral
fulfilment from the weights. No-show detection from telemetry comes with the stability work.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Q

from tenants.choices import QuotaResource
from tenants.quotas import quota_limits

from .choices import ReservationState as R
from .models import Allocation, Reservation
from .priority import Weights, decayed_usage, fulfilment_rate
from .transitions import QUOTA_STATES

RECORD_WINDOW = timedelta(days=30)
# Outcomes that count as "used as booked", and those that count against the team.
USED = {R.RELEASED, R.ACTIVE, R.RELEASING}
NOT_USED = {R.NO_SHOW}


@dataclass(frozen=True)
class TeamInputs:
    fulfilment_rate: float | None
    current_load: float
    usage_share: float
    high_priority: bool = False


def owner_filter(tenant_id, team_id) -> Q:
    return Q(tenant_id=tenant_id, team_id=team_id) if team_id else Q(tenant_id=tenant_id, team__isnull=True)


def team_inputs(*, tenant, team, gpu_model_id, now: datetime, weights: Weights) -> TeamInputs:
    """The record of ``team`` (or of the tenant's team-less work) for one GPU model; ids or objects."""
    tenant, team = getattr(tenant, "pk", tenant), getattr(team, "pk", team)
    owner = owner_filter(tenant, team)
    since = now - RECORD_WINDOW
    # One query, so a reservation that moves meanwhile cannot count as used but not in the total.
    counts = Reservation.objects.filter(owner, submitted_at__gte=since, scheduled_at__isnull=False).aggregate(
        total=Count("pk", filter=Q(state__in=USED | NOT_USED | {R.CANCELLED, R.PREEMPTED})),
        used=Count("pk", filter=Q(state__in=USED)),
    )
    total, used = counts["total"], counts["used"]
    rate = fulfilment_rate(used, total, weights.neutral_fulfilment) if total else None

    limit = min((q.limit for q in quota_limits(tenant=tenant, team=team, resource=QuotaResource.GPUS,
                                               gpu_model=gpu_model_id)), default=0)
    in_use = sum(Reservation.objects.filter(owner, state__in=QUOTA_STATES, gpu_model_id=gpu_model_id)
                 .values_list("gpus", flat=True))
    load = in_use / limit if limit else 1.0

    horizon = now - timedelta(seconds=4 * weights.usage_half_life_s)
    rows = Allocation.objects.filter(reservation__in=Reservation.objects.filter(owner), ends_at__gt=horizon,
                                     starts_at__lt=now).values_list("starts_at", "ends_at", "mem_lo", "mem_hi",
                                                                    "gpu__memory_mib")
    samples = [
        (gpu_hours(start, end, lo, hi, memory, now), (now - min(end, now)).total_seconds())
        for start, end, lo, hi, memory in rows
    ]
    usage = decayed_usage(samples, weights.usage_half_life_s)
    # Fair share: what the team would accrue using its whole quota for one half-life.
    fair = max(limit, 1) * weights.usage_half_life_s / 3600
    return TeamInputs(fulfilment_rate=rate, current_load=load, usage_share=usage / fair)


def gpu_hours(start, end, mem_lo: int, mem_hi: int, memory: int, now: datetime) -> float:
    """GPU-hours an allocation has used so far (a slot counts as its share of the GPU's memory)."""
    hours = max(0.0, (min(end, now) - start).total_seconds() / 3600)
    return hours * (mem_hi - mem_lo) / memory
