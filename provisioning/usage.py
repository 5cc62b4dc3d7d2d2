"""
Usage and month-to-date spend from what reservations held (DESIGN.md, "Money and messages").

Spend is allocated GPU-hours x the offering's list price for the reservation's billing term
(on-demand list price, the reserved discount, or the spot floor a spot reservation ran at): no
billing system, but the same figure the tenant can recompute from its reservations. A
reservation held its GPUs from ``starts_at`` until it was released (``released_at``) or its
booked end, whichever came first, and never past now; a fractional reservation holds its slots'
share of a GPU. Reads one row per reservation, never per allocation.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Q

from .choices import BillingTerm
from .choices import ReservationState as R

USAGE_COLUMNS = ("team_id", "team__name", "starts_at", "ends_at", "released_at", "gpus", "units",
                 "offering__slots_per_gpu", "billing_term", "offering__price_per_gpu_hour",
                 "offering__reserved_discount_pct", "offering__spot_floor_price")
NEVER_HELD = [R.PENDING, R.QUEUED, R.CANCELLED]


@dataclass(frozen=True)
class Held:
    """One reservation's hold on capacity: a GPU-equivalent count over ``[start, end)``, at a price."""

    team: str
    gpus: float
    start: datetime
    end: datetime
    price: Decimal

    def cost_within(self, lo: datetime, hi: datetime) -> Decimal:
        """The spend inside ``[lo, hi)``, to the cent: what the month's spend and the SLA credit are made of."""
        return (Decimal(str(round(self.hours_within(lo, hi), 6))) * self.price).quantize(Decimal("0.01"))

    def hours_within(self, lo: datetime, hi: datetime) -> float:
        span = (min(self.end, hi) - max(self.start, lo)).total_seconds()
        return self.gpus * max(span, 0.0) / 3600


def price_per_gpu_hour(term: str, list_price: Decimal, discount_pct: int, spot_floor: Decimal | None) -> Decimal:
    if term == BillingTerm.RESERVED:
        return (list_price * (100 - discount_pct) / 100).quantize(list_price)
    if term == BillingTerm.SPOT and spot_floor is not None:
        return spot_floor
    return list_price


def holds(reservations, *, since: datetime, now: datetime) -> list[Held]:
    """What each reservation (a scoped queryset) held between ``since`` and ``now``."""
    rows = (reservations.filter(starts_at__lt=now).filter(Q(ends_at__gt=since) | Q(ends_at__isnull=True))
            .exclude(state__in=NEVER_HELD).values_list(*USAGE_COLUMNS))
    result = []
    for (_team_id, team, start, end, released, gpus, units, slots, term, price, discount, floor) in rows:
        if start is None:
            continue
        stop = min(t for t in (end, released, now) if t is not None)
        equivalent = gpus if gpus else units / max(slots or 1, 1)
        result.append(Held(team=team or "Tenant-wide", gpus=float(equivalent), start=start, end=stop,
                           price=price_per_gpu_hour(term, price, discount, floor)))
    return result


def month_start(now: datetime) -> datetime:
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class Spend:
    gpu_hours: float
    amount: Decimal
    by_team: dict[str, Decimal]


def month_to_date(reservations, now: datetime) -> Spend:
    """Month-to-date GPU-hours and spend of these reservations, in total and per team."""
    start = month_start(now)
    hours, amount, by_team = 0.0, Decimal("0"), defaultdict(Decimal)
    for held in holds(reservations, since=start, now=now):
        h = held.hours_within(start, now)
        cost = held.cost_within(start, now)
        hours += h
        amount += cost
        by_team[held.team] += cost
    return Spend(gpu_hours=hours, amount=amount, by_team=dict(sorted(by_team.items())))


def daily_gpu_hours(reservations, now: datetime, days: int = 14) -> list[tuple[datetime, float]]:
    """GPU-hours held per UTC day over the last ``days`` days, oldest first (today so far last)."""
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    starts = [today - timedelta(days=d) for d in range(days - 1, -1, -1)]
    held = holds(reservations, since=starts[0], now=now)
    return [(day, sum(h.hours_within(day, min(day + timedelta(days=1), now)) for h in held)) for day in starts]
