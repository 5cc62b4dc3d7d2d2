"""
Spend as the ledger has it (docs/billing.md, "Spend"): the month so far per team and per day, from
the daily rollups -- the figures the dashboard shows and budgets are held to, and the sums the
invoice's lines are made of. The ledger runs to the last metered hour; the hour now running is
added once it is over.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Sum

from billing.choices import Period, Resource
from billing.models import MeterState
from provisioning.usage import MonthSoFar, Spend, month_start

NO_TEAM = "Tenant-wide"


def month_so_far(rollups, now: datetime) -> MonthSoFar:
    """
    This month's spend of ``rollups`` (a scoped UsageRollup queryset: a tenant's, or one team's),
    its GPU-hours, per team, and per team its running total at the end of each day so far: one query.
    """
    start = month_start(now)
    days = [start + timedelta(days=d) for d in range((now - start).days + 1)]
    rows = (rollups.filter(period=Period.DAY, starts_at__gte=start, starts_at__lt=now)
            .values_list("starts_at", "team__name", "resource").annotate(a=Sum("amount"), q=Sum("quantity"))
            .order_by())
    per_day: dict[str, dict[int, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    gpu_seconds = Decimal(0)
    for day, team, resource, amount, quantity in rows:
        per_day[team or NO_TEAM][(day - start).days] += amount
        if resource == Resource.GPU:
            gpu_seconds += quantity
    cumulative, by_team = {}, {}
    for team in sorted(per_day):
        running, series = Decimal(0), []
        for d in range(len(days)):
            running += per_day[team].get(d, Decimal(0))
            series.append(running)
        cumulative[team] = series
        by_team[team] = running.quantize(Decimal("0.01"))
    spend = Spend(gpu_hours=float(gpu_seconds / 3600), amount=sum(by_team.values(), Decimal("0.00")),
                  by_team=by_team)
    return MonthSoFar(spend=spend, days=days, cumulative=cumulative)


def metered_until() -> datetime | None:
    """Where the ledger ends: the spend shown is what ran before this."""
    return MeterState.objects.filter(pk=1).values_list("metered_until", flat=True).first()
