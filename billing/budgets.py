"""
Budgets (docs/billing.md, "Budgets"): set by a tenant's admins for the tenant or a team; the month's
spend is the ledger's (every hour metered so far this month); each threshold crossed is told once
to whoever sees the budget's team (or the whole tenant); a budget with a hard stop refuses new work
once the month's spend has reached it (409 naming the budget), checked when a reservation is made.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import Q, Sum
from django.utils import timezone

from billing.choices import Period
from billing.invoices import month_bounds
from billing.models import Budget, BudgetCrossing, UsageRollup
from core.errors import Conflict, invalid
from security.audit import audit_record
from security.audit import snapshot as audit_snapshot
from tenants.notifications import notify

AUDITED = ["amount", "currency", "thresholds", "hard_stop", "team"]


def spent(tenant_id, team_id=None, now: datetime | None = None) -> Decimal:
    """The month's spend so far of the tenant (or of one team): what the ledger has rated, from the daily rollups."""
    start, _ = month_bounds(now or timezone.now())
    rows = UsageRollup.objects.filter(tenant_id=tenant_id, period=Period.DAY, starts_at__gte=start)
    if team_id is not None:
        rows = rows.filter(team_id=team_id)
    return rows.aggregate(n=Sum("amount"))["n"] or Decimal(0)


def spent_by_owner(tenant_ids, now: datetime | None = None) -> dict[tuple, Decimal]:
    """The month's spend so far per (tenant, team) and per (tenant, None) for the whole tenant: one query for many."""
    start, _ = month_bounds(now or timezone.now())
    totals: dict[tuple, Decimal] = {}
    for tenant_id, team_id, amount in (UsageRollup.objects.filter(tenant_id__in=list(tenant_ids), period=Period.DAY,
                                                                   starts_at__gte=start)
                                       .values_list("tenant_id", "team_id").annotate(n=Sum("amount")).order_by()):
        totals[(tenant_id, team_id)] = totals.get((tenant_id, team_id), Decimal(0)) + amount
        totals[(tenant_id, None)] = totals.get((tenant_id, None), Decimal(0)) + amount
    return totals


def checked_thresholds(values) -> list[int]:
    if len(set(values)) != len(values) or any(not 1 <= v <= 1000 for v in values):
        raise invalid("thresholds", "Give distinct percents from 1 to 1,000, e.g. [50, 80, 100].", code="invalid")
    return sorted(values)


@transaction.atomic
def budget_set(*, actor, team=None, amount: Decimal, thresholds: list[int], hard_stop: bool,
               budget: Budget | None = None) -> Budget:
    """Make the tenant's (or a team's) budget, or change ``budget``; audited."""
    if amount <= 0:
        raise invalid("amount", "A budget is more than zero.", code="min_value")
    thresholds = checked_thresholds(thresholds)
    before = audit_snapshot(budget, AUDITED) if budget else None
    if budget is None:
        try:
            with transaction.atomic():
                budget = Budget.objects.create(tenant=actor.tenant, team=team, amount=amount, thresholds=thresholds,
                                               hard_stop=hard_stop, created_by=actor.user)
        except IntegrityError:
            raise Conflict(f"{team.name if team else 'The tenant'} has a budget already: change that one.",
                           code="budget_exists") from None
    else:
        budget.amount, budget.thresholds, budget.hard_stop = amount, thresholds, hard_stop
        budget.save(update_fields=["amount", "thresholds", "hard_stop", "updated_at"])
    audit_record(actor=actor, action="budget.set", target=budget, before=before,
                 after=audit_snapshot(budget, AUDITED))
    return budget


def budget_delete(*, actor, budget: Budget) -> None:
    audit_record(actor=actor, action="budget.delete", target=budget, before=audit_snapshot(budget, AUDITED))
    budget.delete()


def budgets_check(now: datetime | None = None) -> int:
    """Tell each budget's threshold newly crossed this month, once; returns how many notices went out."""
    now = now or timezone.now()
    month = month_bounds(now)[0].date()
    told = 0
    limits = list(Budget.objects.select_related("tenant", "team"))
    spends = spent_by_owner({budget.tenant_id for budget in limits}, now)  # one query for every budget
    for budget in limits:
        share = spends.get((budget.tenant_id, budget.team_id), Decimal(0)) * 100 / budget.amount
        for threshold in [t for t in budget.thresholds if t <= share]:
            try:
                with transaction.atomic():
                    BudgetCrossing.objects.create(budget=budget, month=month, threshold=threshold)
                    whose = budget.team.name if budget.team else budget.tenant.name
                    notify(budget.tenant, team=budget.team, kind="budget.crossed",
                           title=f"{whose}: {threshold} % of the month's budget spent",
                           body=f"{whose} has spent {share:.0f} % of its {budget.amount:,} {budget.currency} budget "
                                f"for {month:%B %Y}." + (" New work is refused once it is all spent."
                                                         if budget.hard_stop else ""),
                           link="/billing/", key=f"budget:{budget.pk}:{month:%Y-%m}:{threshold}")
            except IntegrityError:
                continue  # told already
            told += 1
    return told


def budget_stop(*, tenant, team, **_) -> None:
    """Refuse new work of a tenant or team whose budget with a hard stop is spent (registered with provisioning)."""
    mine = Q(team__isnull=True) | Q(team=team) if team is not None else Q(team__isnull=True)
    for budget in Budget.objects.filter(mine, tenant=tenant, hard_stop=True).select_related("team"):
        used = spent(tenant.pk, budget.team_id)
        if used >= budget.amount:
            whose = f"team {budget.team.name}'s" if budget.team_id else "the tenant's"
            raise Conflict(f"This month's {budget.amount:,} {budget.currency} budget ({whose}) is spent "
                           f"({used:,.2f}): new work waits for next month, or for an admin to raise the budget.",
                           code="budget_spent", budget=str(budget.pk))
