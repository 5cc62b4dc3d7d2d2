"""
The console's billing pages (tenant admins and owners): the month's invoice as it stands (a draft
from the ledger), the invoices and credit notes issued, one invoice as a printable page, and its
CSV. Read only: invoices close by themselves once their month is metered.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from uuid import UUID

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing import budgets, commitments, invoices
from billing.models import Budget, Commitment, CreditGrant, Invoice
from billing.prices import PriceBook
from cloud.models import Offering, Region
from core.errors import DomainError
from provisioning.choices import BillingTerm
from tenants.models import Team
from web.console import console_page, error_text, scoped, scoped_or_404


@console_page("invoices")
def billing_home(request):
    tenant = request.principal.tenant
    if tenant is None:
        return redirect("console-tenants")
    now = timezone.now()
    chosen = request.GET.get("month", "")
    try:
        month = datetime.strptime(chosen, "%Y-%m").replace(tzinfo=UTC) if chosen else now
    except ValueError:
        month, chosen = now, ""
    built = invoices.draft(tenant.pk, month, now)
    issued = list(scoped(request, Invoice).select_related("corrects").order_by("-period_start", "-sequence")[:120])
    limits = list(scoped(request, Budget).select_related("team"))
    spent = budgets.spent_by_owner({tenant.pk}, now)
    for budget in limits:
        budget.spent = spent.get((tenant.pk, budget.team_id), Decimal(0))
        budget.percent = min(100, round(budget.spent * 100 / budget.amount))
    return render(request, "billing/billing.html", {
        "draft": built.invoice, "lines": built.lines, "issued": issued, "month": month,
        "month_over": invoices.month_bounds(month)[1] <= now, "budgets": limits,
        "teams": scoped(request, Team).order_by("name"), "now": now,
        "commitments": scoped(request, Commitment).select_related("team", "offering", "region", "reservation"),
        "committable": _committable(now), "regions": Region.objects.filter(is_active=True).order_by("slug"),
        "credit": invoices.credit_balance(tenant.pk, now) if scoped(request, CreditGrant).exists() else None})


def _committable(now) -> list[tuple[Offering, object]]:
    """The offerings a commitment may hold, each with its reserved price per GPU-hour (where no region has its own)."""
    book = PriceBook()
    offerings = Offering.objects.filter(is_active=True, slots_per_gpu=1).select_related("gpu_model").order_by("name")
    return [(offering, book.gpu_hour(offering.pk, None, BillingTerm.RESERVED, now)[0]) for offering in offerings]


@require_POST
@console_page("commitments")
def commitment_save(request):
    """Commit from the billing page's form: offering, region, GPUs, months, and a start (now when left empty)."""
    form = request.POST
    try:
        offering = Offering.objects.get(slug=form.get("offering", ""), is_active=True)
        region = Region.objects.get(slug=form.get("region", ""), is_active=True)
        team = scoped_or_404(request, Team, "view", pk=UUID(form["team"])) if form.get("team") else None
        gpus, months = int(form.get("gpus", "")), int(form.get("months", ""))
        starts_at = (datetime.strptime(form["starts_at"], "%Y-%m-%d").replace(tzinfo=UTC)
                     if form.get("starts_at") else None)
    except (Offering.DoesNotExist, Region.DoesNotExist, ValueError):
        messages.error(request, "Choose an offering and a region, and give the GPUs and months as whole numbers "
                                "(the start, if any, as a date).")
        return redirect("billing")
    try:
        made = commitments.commitment_create(actor=request.principal, name=form.get("name", ""), offering=offering,
                                             region=region, gpus=gpus, months=months, starts_at=starts_at, team=team)
    except DomainError as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(request, f"{made.name}: {made.gpus} GPUs of {offering.name} in {region.slug} for "
                                  f"{made.months} months at {made.rate} {made.currency} per GPU-hour, until "
                                  f"{made.ends_at:%b %d, %Y}.")
    return redirect("billing")


@require_POST
@console_page("commitments")
def commitment_cancel(request, pk):
    commitment = scoped_or_404(request, Commitment, "change", pk=pk)
    try:
        commitments.commitment_cancel(actor=request.principal, commitment=commitment)
    except DomainError as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(request, f"{commitment.name} is cancelled: it had not started, so nothing is billed.")
    return redirect("billing")


@require_POST
@console_page("budgets")
def budget_save(request):
    """Set the tenant's or a team's budget from the billing page's form (a second one of the same owner changes it)."""
    try:
        team = scoped_or_404(request, Team, "view", pk=UUID(request.POST["team"])) if request.POST.get("team") \
            else None
        amount = Decimal(request.POST.get("amount", ""))
        thresholds = [int(t) for t in request.POST.get("thresholds", "").replace(" ", "").split(",") if t]
    except (InvalidOperation, ValueError):
        messages.error(request, "Choose whose budget it is, give the amount as a number (5000.00) and the thresholds "
                                "as percents (50, 80, 100).")
        return redirect("billing")
    current = scoped(request, Budget).filter(team=team).first()
    try:
        budgets.budget_set(actor=request.principal, team=team, amount=amount, thresholds=thresholds,
                           hard_stop=request.POST.get("hard_stop") == "on", budget=current)
    except DomainError as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(request, f"{team.name if team else 'The tenant'}'s budget is {amount:,.2f} a month.")
    return redirect("billing")


@console_page("invoices")
def invoice_page(request, pk):
    invoice = scoped_or_404(request, Invoice, "view", pk=pk)
    return render(request, "billing/invoice.html", {"invoice": invoice, "lines": list(invoice.lines.all())})


@console_page("invoices")
def invoice_download(request, pk):
    invoice = scoped_or_404(request, Invoice, "view", pk=pk)
    response = HttpResponse(invoices.invoice_csv(invoice), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{invoice.number}.csv"'
    return response


urlpatterns = [
    path("billing/", billing_home, name="billing"),
    path("billing/budgets/", budget_save, name="budget-save"),
    path("billing/commitments/", commitment_save, name="commitment-save"),
    path("billing/commitments/<uuid:pk>/cancel/", commitment_cancel, name="commitment-cancel"),
    path("billing/invoices/<uuid:pk>/", invoice_page, name="invoice"),
    path("billing/invoices/<uuid:pk>/csv/", invoice_download, name="invoice-csv"),
]
