"""
The staff tenants page: per tenant, what it holds now, what waits, this month's GPU-hours and
spend so far and where the month ends at this pace, biggest spenders first. One read of the
month's holds and one of the waiting work, whatever the number of tenants.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

from django.db.models import Count, Sum
from django.shortcuts import render
from django.utils import timezone

from provisioning import usage
from provisioning.models import Reservation
from provisioning.transitions import WAITING_STATES
from storage.usage import StorageSpend, storage_spend
from tenants.models import Tenant
from web.console import console_page, scoped


@dataclass
class TenantUsage:
    tenant: Tenant
    gpus_now: float = 0.0
    gpu_hours: float = 0.0
    spend: Decimal = Decimal("0")
    projected: Decimal | None = None
    waiting: int = 0
    waiting_gpus: int = 0
    teams: dict = field(default_factory=lambda: defaultdict(Decimal))
    storage: StorageSpend | None = None


def tenants_usage(request, now) -> list[TenantUsage]:
    """Every tenant the principal may see with its month so far, biggest spend first, then by name."""
    start = usage.month_start(now)
    rows = {t.pk: TenantUsage(tenant=t) for t in scoped(request, Tenant).order_by("name")}
    for held in usage.holds(scoped(request, Reservation), since=start, now=now):
        row = rows.get(held.tenant_id)
        if row is None:
            continue
        cost = held.cost_within(start, now)
        row.gpu_hours += held.hours_within(start, now)
        row.spend += cost
        row.teams[held.team] += cost
        if held.start <= now and held.end >= now:
            row.gpus_now += held.gpus
    waiting = (scoped(request, Reservation).filter(state__in=WAITING_STATES).order_by()
               .values_list("tenant_id").annotate(n=Count("pk"), gpus=Sum("gpus")))
    for tenant_id, n, gpus in waiting:
        if tenant_id in rows:
            rows[tenant_id].waiting, rows[tenant_id].waiting_gpus = n, gpus or 0
    for tenant_id, used in storage_spend(list(rows), since=start, until=now).items():
        rows[tenant_id].storage = used
    elapsed = (now - start).total_seconds()
    factor = Decimal(str((usage.month_end(now) - start).total_seconds() / elapsed)) if elapsed >= 3600 else None
    for row in rows.values():
        row.projected = (row.spend * factor).quantize(Decimal("0.01")) if factor is not None else None
        row.teams = dict(sorted(row.teams.items(), key=lambda item: -item[1]))
    return sorted(rows.values(), key=lambda r: (-r.spend, r.tenant.name))


@console_page("tenants", platform=True)
def tenants(request):
    """Per-tenant usage and spend this month (platform staff)."""
    now = timezone.now()
    rows = tenants_usage(request, now)
    return render(request, "staff/tenants.html", {
        "rows": rows, "now": now, "month": usage.month_start(now),
        "total_spend": sum((r.spend for r in rows), Decimal("0")),
        "total_projected": (sum((r.projected for r in rows), Decimal("0"))
                            if rows and rows[0].projected is not None else None),
        "total_gpus_now": sum(r.gpus_now for r in rows),
        "total_gpu_hours": sum(r.gpu_hours for r in rows),
    })
