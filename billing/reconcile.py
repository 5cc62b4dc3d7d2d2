"""
The ledger's check (``manage.py billing_reconcile``): every allocation-second of a period is in
exactly one usage record's count -- its record plus its corrections add up to what the allocation
held in each window, no more, no less -- the rollups add up to the ledger, and each final invoice of
the period bills what the ledger rated: its usage lines are the ledger's sums rounded once per line,
its total those less its credit lines.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from decimal import Decimal

from django.db.models import Sum

from billing.choices import DocumentKind, DocumentState, Period
from billing.invoices import GROUP, cents, month_bounds
from billing.meter import ALLOCATION_COLUMNS, WINDOW, gpu_seconds, hour_floor, usage_by_subject
from billing.models import Invoice, UsageRecord, UsageRollup
from provisioning.models import Allocation


def reconcile(since: datetime, until: datetime) -> list[str]:
    """What does not add up in the metered windows of ``[since, until)``; empty when all does."""
    since, until = hour_floor(since), hour_floor(until)
    recorded = {s: q for s, q in usage_by_subject(since, until).items() if s.startswith("gpu:")}
    problems, expected = [], {}
    for row in Allocation.objects.filter(starts_at__lt=until, ends_at__gt=since).values(*ALLOCATION_COLUMNS).iterator(
            chunk_size=5000):
        window = max(hour_floor(row["starts_at"]), since)
        while window < min(row["ends_at"], until):
            held = gpu_seconds(row, window, window + WINDOW)
            if held > 0:
                expected[f"gpu:{row['pk']}:{int(window.timestamp())}"] = held
            window += WINDOW
    for subject in expected.keys() | recorded.keys():
        held, counted = expected.get(subject, Decimal(0)), recorded.get(subject, Decimal(0))
        if held != counted:
            problems.append(f"{subject}: held {held} GPU-seconds, recorded {counted}")
    ledger = UsageRecord.objects.filter(starts_at__gte=since, starts_at__lt=until).aggregate(n=Sum("amount"))["n"]
    rolled = UsageRollup.objects.filter(period=Period.DAY, starts_at__gte=since, starts_at__lt=until).aggregate(
        n=Sum("amount"))["n"]
    if since == since.replace(hour=0) and until == until.replace(hour=0) and (ledger or 0) != (rolled or 0):
        problems.append(f"the daily rollups add up to {rolled or 0}, the ledger to {ledger or 0}")
    return problems + invoice_problems(since, until)


def invoice_problems(since: datetime, until: datetime) -> list[str]:
    """Each final invoice of a month inside ``[since, until)`` whose usage or total is not the ledger's."""
    problems = []
    finals = (Invoice.objects.filter(kind=DocumentKind.INVOICE, state=DocumentState.FINAL, period_start__gte=since,
                                     period_end__lte=until)
              .annotate(lines_sum=Sum("lines__amount")))
    for month_start in sorted({invoice.period_start for invoice in finals}):
        start, end = month_bounds(month_start)
        rated: dict = defaultdict(Decimal)
        for row in (UsageRecord.objects.filter(starts_at__gte=start, starts_at__lt=end)
                    .values("tenant_id", *GROUP).annotate(a=Sum("amount")).order_by()):
            rated[row["tenant_id"]] += cents(row["a"])
        for invoice in (i for i in finals if i.period_start == month_start):
            if invoice.subtotal != rated.get(invoice.tenant_id, Decimal(0)):
                problems.append(f"{invoice.number}: bills {invoice.subtotal} of usage, the ledger rated "
                                f"{rated.get(invoice.tenant_id, Decimal(0))}")
            if invoice.total != (invoice.lines_sum or Decimal(0)):
                problems.append(f"{invoice.number}: totals {invoice.total}, its lines add up to {invoice.lines_sum}")
    return problems
