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

from billing import budgets, invoices
from billing.models import Budget, Invoice
from core.errors import DomainError
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
        "teams": scoped(request, Team).order_by("name")})


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
    path("billing/invoices/<uuid:pk>/", invoice_page, name="invoice"),
    path("billing/invoices/<uuid:pk>/csv/", invoice_download, name="invoice-csv"),
]
