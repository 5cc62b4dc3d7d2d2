"""
Why a reservation waits: its score with every factor (like Slurm's sprio), its place in the queue
and an estimated start. Read-only.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q, Sum
from django.utils import timezone

from cloud.choices import pool_of
from cloud.models import GPU
from core.epochs import Epoch
from provisioning.capacity import SELLABLE_HEALTH
from provisioning.choices import ReservationState as R
from provisioning.models import Allocation, Reservation

# Replaced when staff change a queued reservation's priority: the scheduler's queue mirror, which
# keeps the ranking columns of every queued reservation, reads them all again.
QUEUE_RANKING = Epoch("meridian:queue-ranking")


def queue_position(reservation: Reservation) -> int | None:
    """1 for the next to be placed among queued reservations wanting the same GPU model; None when held or placed."""
    if reservation.state != R.QUEUED or reservation.held_at is not None:
        return None
    ahead = Reservation.objects.filter(state=R.QUEUED, held_at__isnull=True, gpu_model_id=reservation.gpu_model_id
                                       ).filter(Q(score__gt=reservation.score)
                                                | Q(score=reservation.score, submitted_at__lt=reservation.submitted_at))
    return ahead.count() + 1


def estimated_start(reservation: Reservation, now: datetime) -> datetime | None:
    """
    When enough GPUs of its model free up in its first region for it and everything queued ahead
    of it, going by the ends of current allocations. An estimate: it ignores topology and work
    that arrives later with a higher score.
    """
    if reservation.state not in (R.PENDING, R.QUEUED):
        return reservation.starts_at
    if reservation.held_at is not None:
        return None  # staff hold it: it starts only after they let it go
    ahead = Reservation.objects.filter(state=R.QUEUED, held_at__isnull=True, gpu_model_id=reservation.gpu_model_id
                                       ).filter(Q(score__gt=reservation.score)
                                                | Q(score=reservation.score, submitted_at__lt=reservation.submitted_at)
                                                ).aggregate(n=Sum("gpus"))["n"] or 0
    where = Q(node__region__slug=reservation.regions[0], node__confidential=reservation.offering.confidential)
    return free_enough_at(gpu_model_id=reservation.gpu_model_id, region=where,
                          pool=pool_of(reservation.offering.kind), needed=max(reservation.gpus, 1) + ahead,
                          start=max(reservation.requested_start or now, now), now=now)


def free_enough_at(*, gpu_model_id, region: Q, pool: str, needed: int, start: datetime,
                   now: datetime) -> datetime | None:
    """
    The first moment ``needed`` sellable GPUs of the model are free in the region, going by the
    ends of current allocations (``start`` at the earliest); None if current ends never free enough.
    """
    free_now, ends = free_timeline(gpu_model_id=gpu_model_id, region=region, pool=pool, now=now, most=needed)
    return free_enough_from(free_now, ends, needed=needed, start=start)


def free_timeline(*, gpu_model_id, region: Q, pool: str, now: datetime, most: int) -> tuple[int, list[datetime]]:
    """Sellable GPUs of the model free now in the region, and the first ``most`` ends of what holds the rest."""
    gpus = GPU.objects.filter(region, model_id=gpu_model_id, node__is_spare=False, node__pool=pool,
                              health__in=SELLABLE_HEALTH)
    held = Allocation.objects.filter(gpu__in=gpus, starts_at__lt=now, ends_at__gt=now)
    free_now = gpus.count() - held.values("gpu").distinct().count()
    return free_now, list(held.order_by("ends_at").values_list("ends_at", flat=True)[:most])


def free_enough_from(free_now: int, ends: list[datetime], *, needed: int, start: datetime) -> datetime | None:
    """When ``needed`` GPUs are free, each end in ``ends`` (in order) freeing one more; None if they never are."""
    if free_now >= needed:
        return start
    for end in ends[:needed - free_now]:
        free_now += 1
        if free_now >= needed:
            return max(end, start)
    return None


def score_report(reservation: Reservation) -> dict:
    now = timezone.now()
    breakdown = reservation.score_breakdown or {}
    return {
        "total": reservation.score,
        "factors": breakdown.get("factors", []),
        "adjustment": reservation.priority_adjustment,
        "held": reservation.held_at is not None,
        "queue_position": queue_position(reservation),
        "waiting_reason": reservation.state_reason if reservation.state in (R.PENDING, R.QUEUED) else "",
        "estimated_start": estimated_start(reservation, now),
    }
