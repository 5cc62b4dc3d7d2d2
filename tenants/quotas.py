"""
Quotas, read through one function. Services that consume capacity (reservations, VPCs,
instances) call ``quota_check`` at admission and again at placement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Q

from core.epochs import Epoch, KeptUnder
from core.errors import QuotaExceeded
from tenants.choices import QuotaResource
from tenants.models import Quota, Team, Tenant


@dataclass(frozen=True)
class QuotaLimit:
    """One limit that applies to a request: whose it is (tenant or team) and on what."""

    scope: str  # "tenant" or "team"
    resource: str
    gpu_model_id: object | None
    limit: int
    is_default: bool = False

    @property
    def label(self) -> str:
        return f"{self.resource}" + (" of this GPU model" if self.gpu_model_id else "")


# Quota rows change when staff set them; each process keeps the limits it read while none changed.
QUOTA_EPOCH = Epoch("meridian:quota-epoch")
KEPT_LIMITS = KeptUnder(QUOTA_EPOCH, lambda: settings.MERIDIAN_QUOTA_CACHE_SECONDS)


def quota_limits(*, tenant: Tenant, resource: str, team: Team | None = None, gpu_model=None) -> list[QuotaLimit]:
    """
    Every limit that bounds a request for ``resource`` (of ``gpu_model``) by ``team`` of ``tenant``:
    the tenant's rows (per model and overall), the team's rows, and the default when the tenant
    has no row of its own for the resource. A team without rows is bounded by its tenant only.
    Kept per process while no quota row changed anywhere (QUOTA_EPOCH, core.epochs): a limit
    set or removed is seen by the next request in every process.
    """
    tenant_id, team_id = getattr(tenant, "pk", tenant), getattr(team, "pk", team)
    model_id = getattr(gpu_model, "pk", gpu_model)

    def load() -> list[QuotaLimit]:
        owners = Q(tenant=tenant_id, team__isnull=True)
        if team_id is not None:
            owners |= Q(team=team_id)
        rows = Quota.objects.filter(owners, resource=resource).filter(
            Q(gpu_model__isnull=True) | Q(gpu_model=model_id))
        return limits_from_rows(rows, resource=resource, team_id=team_id, gpu_model_id=model_id)

    return list(KEPT_LIMITS.get((tenant_id, team_id, model_id, resource), load))


def watch_quotas() -> None:
    QUOTA_EPOCH.watch(Quota)


def quota_limits_many(*, tenant_ids, resource: str) -> Callable[..., list[QuotaLimit]]:
    """
    ``quota_limits`` for many owners from one query: returns ``limits(tenant_id, team_id,
    gpu_model_id)``. The scheduler reads every queued owner's limits once per cycle this way.
    """
    by_tenant: dict = {}
    for row in Quota.objects.filter(tenant_id__in=list(tenant_ids), resource=resource):
        by_tenant.setdefault(row.tenant_id, []).append(row)

    def limits(tenant_id, team_id, gpu_model_id) -> list[QuotaLimit]:
        rows = [row for row in by_tenant.get(tenant_id, ())
                if (row.team_id is None or row.team_id == team_id)
                and (row.gpu_model_id is None or row.gpu_model_id == gpu_model_id)]
        return limits_from_rows(rows, resource=resource, team_id=team_id, gpu_model_id=gpu_model_id)

    return limits


def limits_from_rows(rows, *, resource: str, team_id, gpu_model_id) -> list[QuotaLimit]:
    """The limits of the tenant's and ``team_id``'s quota rows (already narrowed to them), plus the default."""
    limits = [
        QuotaLimit(scope="team" if row.team_id else "tenant", resource=resource, gpu_model_id=row.gpu_model_id,
                   limit=row.limit)
        for row in rows
    ]
    # A per-model row narrows; only a tenant row for all models replaces the default overall limit.
    if not any(limit.scope == "tenant" and limit.gpu_model_id is None for limit in limits):
        limits.append(QuotaLimit(scope="tenant", resource=resource, gpu_model_id=None,
                                 limit=settings.MERIDIAN_DEFAULT_QUOTAS[QuotaResource(resource).value],
                                 is_default=True))
    return limits


def quota_check(
    *, tenant: Tenant, resource: str, asked: int, in_use: Callable[[QuotaLimit], int],
    team: Team | None = None, gpu_model=None,
) -> None:
    """
    Raise QuotaExceeded (409, with limit, in use and asked) when ``asked`` more would pass any
    limit. ``in_use(limit)`` returns what already counts against that limit; the caller knows
    how to count its resource, this module knows which limits apply.
    """
    for limit in quota_limits(tenant=tenant, resource=resource, team=team, gpu_model=gpu_model):
        used = in_use(limit)
        if used + asked > limit.limit:
            raise QuotaExceeded(scope=limit.scope, resource=limit.label, limit=limit.limit, in_use=used, asked=asked)


# What a tenant (or one of its teams) uses of a resource now, counted by the app above that owns it
# (storage registers its GiB): the quota pages show it beside each limit.
USAGE: dict[str, Callable[[object, object | None], int]] = {}


def usage_counter(resource: str, count: Callable[[object, object | None], int]) -> None:
    """Register ``count(tenant_id, team_id or None)`` as what counts against ``resource``."""
    USAGE[resource] = count


def usage_now(resource: str, tenant_id, team_id=None) -> int | None:
    """What counts against ``resource`` now, from its registered counter; None when no app counts it."""
    count = USAGE.get(resource)
    return None if count is None else count(tenant_id, team_id)
