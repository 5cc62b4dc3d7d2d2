"""
Usage and month-to-date spend from what reservations held (DESIGN.md, "Money and messages").

Spend is allocated GPU-hours x the offering's list price for the reservation's billing term
(on-demand list price, the reserved discount, or the spot floor a spot reservation ran at): no
billing system, but the same figure the tenant can recompute from its reservations. The hours
are those of the reservation's allocations -- what it actually held, each from its start until it
ended (released, preempted, its node failed, its window over) and never past now -- not a window
derived from where the reservation stands now: a reservation placed again keeps the hours of its
first placement, and nothing ends an allocation before a time already counted, so the spend
never goes down. A whole GPU is one GPU; a fractional slot is its share of one. Reads one row
per reservation and span (its allocations made together), never one per allocation.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Count

from provisioning.choices import BillingTerm
from provisioning.choices import ReservationState as R
from provisioning.models import Allocation

HOLD_COLUMNS = ("reservation_id", "reservation__tenant_id", "reservation__team__name", "starts_at", "ends_at",
                "reservation__offering__slots_per_gpu", "reservation__billing_term",
                "reservation__offering__price_per_gpu_hour", "reservation__offering__reserved_discount_pct",
                "reservation__offering__spot_floor_price")
NEVER_HELD = [R.PENDING, R.QUEUED, R.CANCELLED]


@dataclass(frozen=True)
class Held:
    """A hold on capacity: a GPU-equivalent count over ``[start, end)``, at a price."""

    team: str
    gpus: float
    start: datetime
    end: datetime
    price: Decimal
    tenant_id: object = None

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
    """
    What the reservations (a scoped queryset) held between ``since`` and ``now``, from their
    allocations: one hold per reservation and span of allocations made together.
    """
    rows = (Allocation.objects.filter(reservation__in=reservations.order_by().values("pk"), starts_at__lt=now,
                                      ends_at__gt=since)
            .values_list(*HOLD_COLUMNS).annotate(n=Count("pk")).order_by())
    result = []
    for (_reservation_id, tenant_id, team, start, end, slots, term, price, discount, floor, n) in rows:
        result.append(Held(team=team or "Tenant-wide", gpus=n / max(slots or 1, 1), start=start, end=min(end, now),
                           price=price_per_gpu_hour(term, price, discount, floor), tenant_id=tenant_id))
    return result


def month_start(now: datetime) -> datetime:
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def month_end(now: datetime) -> datetime:
    """The start of the next month: where the month of ``now`` ends."""
    return (month_start(now) + timedelta(days=32)).replace(day=1)


@dataclass(frozen=True)
class Spend:
    gpu_hours: float
    amount: Decimal
    by_team: dict[str, Decimal]


def month_to_date(reservations, now: datetime) -> Spend:
    """Month-to-date GPU-hours and spend of these reservations, in total and per team."""
    return spend_within(reservations, since=month_start(now), until=now)


def spend_within(reservations, *, since: datetime, until: datetime) -> Spend:
    """GPU-hours and spend of these reservations inside ``[since, until)`` (``until``: now at the latest)."""
    return _spend_of(holds(reservations, since=since, now=until), since=since, until=until)


def _spend_of(held_list: list[Held], *, since: datetime, until: datetime) -> Spend:
    hours, amount, by_team = 0.0, Decimal("0"), defaultdict(Decimal)
    for held in held_list:
        cost = held.cost_within(since, until)
        hours += held.hours_within(since, until)
        amount += cost
        by_team[held.team] += cost
    return Spend(gpu_hours=hours, amount=amount, by_team=dict(sorted(by_team.items())))


def spend_by_tenant(reservations, *, since: datetime, until: datetime) -> dict:
    """The spend inside ``[since, until)`` of each tenant of these reservations (one query for them all)."""
    amounts: dict = defaultdict(Decimal)
    for held in holds(reservations, since=since, now=until):
        amounts[held.tenant_id] += held.cost_within(since, until)
    return dict(amounts)


@dataclass(frozen=True)
class MonthSoFar:
    """This month's spend, and per team its total at the end of each day so far (today: so far)."""

    spend: Spend
    days: list[datetime]
    cumulative: dict[str, list[Decimal]]


def daily_gpu_hours(reservations, now: datetime, days: int = 14) -> list[tuple[datetime, float]]:
    """GPU-hours held per UTC day over the last ``days`` days, oldest first (today so far last)."""
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    starts = [today - timedelta(days=d) for d in range(days - 1, -1, -1)]
    held = holds(reservations, since=starts[0], now=now)
    return [(day, sum(h.hours_within(day, min(day + timedelta(days=1), now)) for h in held)) for day in starts]
