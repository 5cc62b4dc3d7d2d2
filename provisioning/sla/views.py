"""
The console's SLA pages: a tenant's month (``/sla/``: availability against the target, what was
lost and to which incidents, the credit owed), and for staff every tenant's month, worst first
(``/staff/sla/``), with one tenant's page under it. Figures come from ``provisioning.sla.accounting`` over the
page's scoped querysets; each page costs a fixed number of queries.
"""

from __future__ import annotations

from decimal import Decimal

from django import forms
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode

from provisioning.models import Reservation
from provisioning.sla import accounting as sla
from tenants.models import Tenant
from web.console import console_page, scoped, scoped_or_404

PAGE_SIZE = 50


class MonthForm(forms.Form):
    month = forms.CharField(required=False, max_length=7, label="Month",
                            widget=forms.TextInput(attrs={"type": "month", "pattern": r"\d{4}-\d{2}"}))

    def __init__(self, *args, now, **kwargs):
        super().__init__(*args, **kwargs)
        self.now = now
        self.fields["month"].widget.attrs["max"] = now.strftime("%Y-%m")

    def clean_month(self):
        value = self.cleaned_data["month"]
        if not value:
            return self.now.date().replace(day=1)
        try:
            return sla.parse_month(value, now=self.now)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None


def _month(request, now):
    """The chosen month, or None with the form's errors (a 400)."""
    form = MonthForm(request.GET, now=now)
    return form, (form.cleaned_data["month"] if form.is_valid() else None)


def _credit_rows() -> list[tuple]:
    return sorted(sla.credit_table(), reverse=True)


def _tenant_page(request, tenant, *, staff_view: bool):
    now = timezone.now()
    form, month = _month(request, now)
    context = {"form": form, "tenant": tenant, "staff_view": staff_view, "credits": _credit_rows(),
               "target": sla.shown(sla.sla_target(), 2)}
    if month is None:
        return render(request, "provisioning/sla.html", context, status=400)
    (row,) = sla.sla_read(principal=request.principal, tenants=[tenant], month=month, now=now)
    context |= {"row": row, "f": row.figures, "month": month,
                "availability": sla.shown(row.figures.availability)}
    return render(request, "provisioning/sla.html", context)


@console_page("sla")
def sla_tenant(request):
    """The tenant's month: availability, GPU-minutes reserved and lost, incidents, the credit owed."""
    if request.principal.tenant is None:  # staff acting platform-wide: every tenant's month
        query = f"?{urlencode({'month': request.GET['month']})}" if request.GET.get("month") else ""
        return redirect(reverse("staff-sla") + query)
    return _tenant_page(request, request.principal.tenant, staff_view=False)


@console_page("sla", platform=True)
def sla_staff(request):
    """Every tenant that held GPUs in the month, lowest availability first, and the credits owed in all."""
    now = timezone.now()
    form, month = _month(request, now)
    context = {"form": form, "credits": _credit_rows(), "target": sla.shown(sla.sla_target(), 2)}
    if month is None:
        return render(request, "staff/sla.html", context, status=400)
    figures = sla.sla_for_tenants(scoped(request, Reservation), tenant_ids=None, month=month, now=now)
    tenants = scoped(request, Tenant).in_bulk(list(figures))
    rows = sorted(({"tenant": tenants[pk], "f": f, "availability": sla.shown(f.availability)}
                   for pk, f in figures.items() if pk in tenants),
                  key=lambda r: (r["f"].availability, r["tenant"].name))
    page = Paginator(rows, PAGE_SIZE).get_page(request.GET.get("page"))
    context |= {
        "month": month, "page": page, "complete": sla.month_bounds(month, now)[2],
        "tenant_count": len(rows), "below_target": sum(not r["f"].met for r in rows),
        "credit_total": sum((r["f"].credit for r in rows), start=Decimal(0)),
        "spend_total": sum((r["f"].spend for r in rows), start=Decimal(0)),
    }
    return render(request, "staff/sla.html", context)


@console_page("sla", platform=True)
def sla_staff_tenant(request, pk):
    """One tenant's month, as the tenant sees it (all its teams)."""
    return _tenant_page(request, scoped_or_404(request, Tenant, pk=pk), staff_view=True)
