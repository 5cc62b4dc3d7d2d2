"""The console's quotas page: each quota with what the tenant's reservations, instances and VPCs use of it."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count
from django.shortcuts import redirect, render
from django.utils import timezone

from provisioning.models import VPC, Instance
from tenants.choices import QuotaResource
from tenants.models import Quota, Tenant
from tenants.quotas import QuotaLimit, limits_from_rows, usage_now
from web.console import (
    console_page,
    scoped,
)

# What counts as an instance in use, for the instance quota.
LIVE_INSTANCE_STATES = ("provisioning", "active", "releasing")


@console_page("quotas")
def quota_list(request):
    """
    The tenant's and its teams' limits with what counts against each right now: GPUs as admission
    counts them (held and waiting work whose window covers now), VPCs that are not deleted (the
    default ones aside), live instances. Tenant-wide figures cover every team, as the 409 of an
    over-quota request does.
    """
    principal = request.principal
    if principal.tenant is None:
        return redirect("console-tenants")
    rows = list(scoped(request, Quota).select_related("team", "gpu_model").order_by("resource", "gpu_model__name"))
    model_names = {row.gpu_model_id: row.gpu_model.name for row in rows if row.gpu_model_id}
    usage = _Usage(request, now=timezone.now())

    tenant_limits = []
    for resource in QuotaResource.values:
        mine = [row for row in rows if row.team_id is None and row.resource == resource]
        tenant_limits += limits_from_rows(mine, resource=resource, team_id=None, gpu_model_id=None)
    teams = {}
    for row in rows:
        if row.team_id is not None:
            teams.setdefault(row.team, []).append(
                QuotaLimit(scope="team", resource=row.resource, gpu_model_id=row.gpu_model_id, limit=row.limit))
    sections = [{"title": f"{principal.tenant.name} (tenant)", "team": None,
                 "lines": [usage.line(limit, None, model_names) for limit in tenant_limits]}]
    for team, limits in sorted(teams.items(), key=lambda item: item[0].name):
        sections.append({"title": f"{team.name} (team)", "team": team,
                         "lines": [usage.line(limit, team, model_names) for limit in limits]})
    return render(request, "tenants/quota_list.html", {"sections": sections})


class _Usage:
    """What counts against a limit now; VPC and instance counts come from one grouped query each."""
    def __init__(self, request, *, now):
        self.tenant, self.now = request.principal.tenant, now
        # Usage is the tenant's, whatever part of it the viewer may list: counted over the tenant
        # the principal sees (one row), not over the principal's own rows.
        tenants = scoped(request, Tenant)
        vpcs = (VPC.objects.filter(tenant__in=tenants, is_default=False).exclude(state="deleted")
                .values_list("team_id").annotate(n=Count("pk")))
        self.vpcs = dict(vpcs)
        instances = (Instance.objects.filter(tenant__in=tenants, state__in=LIVE_INSTANCE_STATES)
                     .values_list("team_id").annotate(n=Count("pk")))
        self.instances = dict(instances)

    def used(self, limit: QuotaLimit, team) -> float:
        if limit.resource == QuotaResource.GPUS:
            from provisioning.admission import gpus_counted

            # The admission rule over a window that is this moment: held work overlapping now,
            # waiting work that asked for now (or as soon as possible).
            return gpus_counted(self.tenant, team, limit, self.now, self.now + timedelta(seconds=1))
        if limit.resource in (QuotaResource.VPCS, QuotaResource.INSTANCES):
            counts = self.vpcs if limit.resource == QuotaResource.VPCS else self.instances
            return sum(counts.values()) if team is None else counts.get(team.pk, 0)
        return usage_now(limit.resource, self.tenant.pk, team.pk if team else None) or 0

    def line(self, limit: QuotaLimit, team, model_names: dict) -> dict:
        used = self.used(limit, team)
        share = min(100.0, used / limit.limit * 100) if limit.limit else (100.0 if used else 0.0)
        return {
            "resource": QuotaResource(limit.resource).label,
            "gpu_model": model_names.get(limit.gpu_model_id, "") if limit.gpu_model_id else
            "All models" if limit.resource == QuotaResource.GPUS else "",
            "limit": limit.limit, "used": used, "left": max(limit.limit - used, 0), "percent": round(share),
            "is_default": limit.is_default, "level": "over" if share >= 100 else "high" if share >= 80 else "",
        }
