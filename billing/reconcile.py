"""
The ledger's check (``manage.py billing_reconcile``): every allocation-second of a period is in
exactly one usage record's count -- its record plus its corrections add up to what the allocation
held in each window, no more, no less -- and the rollups add up to the ledger.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db.models import Sum

from billing.choices import Period
from billing.meter import ALLOCATION_COLUMNS, WINDOW, gpu_seconds, hour_floor, usage_by_subject
from billing.models import UsageRecord, UsageRollup
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
    return problems
