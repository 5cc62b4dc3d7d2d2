"""
The tenant dashboard's figures, read through the page's scoped querysets: GPUs in use, being
prepared and reserved for later, by team; reservations by state, month-to-date spend, GPU-hours
per day, open incidents and unread notifications. A fixed number of queries however many
reservations the tenant has.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from decimal import Decimal

from django.db.models import Case, CharField, Count, Q, Sum, Value, When

from billing import spend as ledger
from billing.models import UsageRollup
from provisioning import usage
from provisioning.choices import ReservationState as R
from provisioning.models import Reservation
from security.models import Incident
from storage.usage import storage_spend
from tenants.notification_views import unread_notifications
from web.charts import PALETTE, line_chart, round_up
from web.console import chosen_team_id, scoped

# In use: handed over and running. Being prepared: its window is open and it is being provisioned
# (or waits for its nodes to be cleaned): not usable yet. Reserved: scheduled for a later window.
# Releasing GPUs are the platform's again (being cleaned), so none of the three.
IN_USE = [R.ACTIVE]
PREPARING = [R.PROVISIONING]
RESERVED = [R.SCHEDULED]
CHART_DAYS = 14


def summary(request, *, now: datetime) -> dict:
    reservations = scoped(request, Reservation)
    team_id = chosen_team_id(request)
    if team_id:
        reservations = reservations.filter(team_id=team_id)

    by_team = defaultdict(lambda: {"in_use": 0, "preparing": 0, "reserved": 0})
    stage = Case(When(state__in=IN_USE, then=Value("in_use")),
                 When(Q(state__in=PREPARING) | Q(state__in=RESERVED, starts_at__lte=now), then=Value("preparing")),
                 default=Value("reserved"), output_field=CharField())
    for team, held, gpus in (reservations.filter(state__in=IN_USE + PREPARING + RESERVED).annotate(stage=stage)
                             .values_list("team__name", "stage").annotate(gpus=Sum("gpus"))):
        by_team[team or "Tenant-wide"][held] += gpus or 0
    states = dict(reservations.values_list("state").annotate(n=Count("pk")).values_list("state", "n"))
    rollups = scoped(request, UsageRollup)
    if team_id:
        rollups = rollups.filter(team_id=team_id)
    month = ledger.month_so_far(rollups, now)
    spend = month.spend
    metered_until = ledger.metered_until()
    daily = usage.daily_gpu_hours(reservations, now, days=CHART_DAYS)
    return {
        "gpus_by_team": dict(sorted(by_team.items())),
        "gpus_in_use": sum(v["in_use"] for v in by_team.values()),
        "gpus_preparing": sum(v["preparing"] for v in by_team.values()),
        "gpus_reserved": sum(v["reserved"] for v in by_team.values()),
        "states": [(state, label, states.get(state, 0)) for state, label in R.choices if states.get(state)],
        "spend": spend,
        "metered_until": metered_until,
        "storage": _storage(request, now, team_id),
        "projection": (projection := month_end_projection(spend, metered_until or now)),
        "spend_chart": spend_chart(month, now, projection),
        "chart": chart(daily),
        "incidents": list(scoped(request, Incident).filter(resolved_at__isnull=True)[:10]),
        "recent": list(reservations.select_related("offering").order_by("-submitted_at")[:8]),
        "notifications": notifications(request),
    }


def _storage(request, now: datetime, team_id):
    """The tenant's (or the chosen team's) storage this month: GiB now, GiB-hours, spend; None for staff."""
    tenant = request.principal.tenant
    if tenant is None:
        return None
    return storage_spend([tenant.pk], since=usage.month_start(now), until=now, team_id=team_id).get(tenant.pk)


def notifications(request) -> list:
    """The principal's unread in-app notifications, newest first, linked to their console pages."""
    return unread_notifications(request, limit=8)


def chart(daily: list[tuple[datetime, float]], width: int = 560, height: int = 140, left: int = 44) -> dict:
    """
    Bars of an inline SVG (no script): GPU-hours per day on a y-axis of round ticks (0, half and
    the top, the top a round number at or above the busiest day), the days along the bottom.
    """
    peak = max((hours for _, hours in daily), default=0.0)
    top = round_up(peak)
    plot = height - 20  # the bars' height; the day labels below
    slot = (width - left) / max(len(daily), 1)
    bars = []
    for i, (day, hours) in enumerate(daily):
        h = round(hours / top * plot, 1)
        bars.append({"x": round(left + i * slot + 2, 1), "y": round(height - 16 - h, 1), "w": round(slot - 4, 1),
                     "h": h, "label": day.strftime("%d"), "title": f"{day:%b %d}: {hours:,.1f} GPU-hours",
                     "tx": round(left + i * slot + slot / 2, 1)})
    ticks = [{"y": round(height - 16 - value / top * plot, 1), "ty": round(height - 12 - value / top * plot, 1),
              "label": f"{value:,.0f}" if top >= 10 else f"{value:,.1f}"} for value in (0, top / 2, top)]
    return {"bars": bars, "ticks": ticks, "width": width, "height": height, "left": left, "max": peak,
            "total": sum(hours for _, hours in daily), "days": len(daily)}


def spend_chart(month: usage.MonthSoFar, now: datetime, projection: dict) -> dict | None:
    """This month's spend per team added up day by day, dashed on to its projected end; None before any spend."""
    totals = month.cumulative
    if not any(series and series[-1] for series in totals.values()):
        return None
    start = usage.month_start(now)
    length = (usage.month_end(now) - start).days
    ends = {team: float(amount) for team, amount in (projection.get("by_team") or {}).items()}
    top = round_up(max([float(s[-1]) for s in totals.values()] + list(ends.values())))
    labels = [str(d + 1) if d % 7 == 0 or d == length - 1 else "" for d in range(length)]
    drawn = line_chart({team: [float(v) for v in series] for team, series in totals.items()}, x_labels=labels,
                       x_total=length, top=top, projection=ends, label=f"Spend in {start:%B} by team",
                       unit_prefix="$")
    return {"svg": drawn, "legend": [(team, PALETTE[n % len(PALETTE)]) for n, team in enumerate(totals)]}


def month_end_projection(spend, now: datetime) -> dict:
    """
    The month's spend at its end if it goes on at this month's pace so far: the amount, and per
    team. None in the month's first hour (too little to project from).
    """
    start = usage.month_start(now)
    following = usage.month_end(now)
    elapsed = (now - start).total_seconds()
    if elapsed < 3600:
        return {}
    factor = Decimal(str((following - start).total_seconds() / elapsed))
    return {"amount": (spend.amount * factor).quantize(Decimal("0.01")),
            "by_team": {team: (amount * factor).quantize(Decimal("0.01")) for team, amount in spend.by_team.items()},
            "month": start.strftime("%B")}
