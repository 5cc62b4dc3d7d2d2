"""
The console's billing pages (tenant admins and owners): the month's invoice as it stands (a draft
from the ledger), the invoices and credit notes issued, one invoice as a printable page, and its
CSV. Read only: invoices close by themselves once their month is metered.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.utils import timezone

from billing import invoices
from billing.api.views import invoice_csv
from billing.models import Invoice
from web.console import console_page, scoped, scoped_or_404


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
    return render(request, "billing/billing.html", {
        "draft": built.invoice, "lines": built.lines, "issued": issued, "month": month,
        "month_over": invoices.month_bounds(month)[1] <= now})


@console_page("invoices")
def invoice_page(request, pk):
    invoice = scoped_or_404(request, Invoice, "view", pk=pk)
    return render(request, "billing/invoice.html", {"invoice": invoice, "lines": list(invoice.lines.all())})


@console_page("invoices")
def invoice_download(request, pk):
    invoice = scoped_or_404(request, Invoice, "view", pk=pk)
    response = HttpResponse(invoice_csv(invoice), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{invoice.number}.csv"'
    return response


urlpatterns = [
    path("billing/", billing_home, name="billing"),
    path("billing/invoices/<uuid:pk>/", invoice_page, name="invoice"),
    path("billing/invoices/<uuid:pk>/csv/", invoice_download, name="invoice-csv"),
]
