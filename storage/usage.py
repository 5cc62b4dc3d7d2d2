"""
What storage is billed by: GiB held per tenant, team and class, sampled every
MERIDIAN_STORAGE_USAGE_SECONDS (the beat's ``storage.usage_sample``), each sample covering the
interval before it; GiB-hours and spend add the samples up. A volume counts from the moment its
backend has it (``available``, or ``resizing`` at its old size) until its delete is asked.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db.models import F, Sum
from django.utils import timezone

from storage.choices import VolumeState
from storage.models import StorageUsageSample, Volume

BILLED = (VolumeState.AVAILABLE, VolumeState.RESIZING)
HOURS_PER_MONTH = Decimal("730")  # a GiB-month is 730 GiB-hours, as the clouds price it


def usage_sample(now: datetime | None = None) -> int:
    """One sample of every tenant's billed storage (one grouped read, one insert); returns the rows written."""
    now = now or timezone.now()
    seconds = int(settings.MERIDIAN_STORAGE_USAGE_SECONDS)
    rows = (Volume.objects.filter(state__in=BILLED).values("tenant_id", "team_id", "storage_class_id")
            .annotate(gib=Sum("size_gib")).order_by())
    made = StorageUsageSample.objects.bulk_create(
        StorageUsageSample(at=now, tenant_id=r["tenant_id"], team_id=r["team_id"],
                           storage_class_id=r["storage_class_id"], gib=r["gib"], seconds=seconds) for r in rows)
    return len(made)


@dataclass
class StorageSpend:
    gib_now: int = 0
    gib_hours: float = 0.0
    amount: Decimal = Decimal("0")
    by_class: dict = field(default_factory=dict)  # class name -> spend


def storage_spend(tenant_ids, *, since: datetime, until: datetime, team_id=None) -> dict:
    """
    Per tenant: GiB held now, GiB-hours and spend inside ``[since, until)`` at each class's price
    (two reads); ``team_id``: that team's volumes only.
    """
    spend: dict = defaultdict(StorageSpend)
    team = {"team_id": team_id} if team_id else {}
    rows = (StorageUsageSample.objects.filter(tenant_id__in=tenant_ids, at__gt=since, at__lte=until, **team)
            .values("tenant_id", "storage_class__name", "storage_class__price_per_gib_month")
            .annotate(gib_seconds=Sum(F("gib") * F("seconds"))).order_by())
    for row in rows:
        hours = Decimal(row["gib_seconds"]) / 3600
        cost = (hours * row["storage_class__price_per_gib_month"] / HOURS_PER_MONTH).quantize(Decimal("0.01"))
        entry = spend[row["tenant_id"]]
        entry.gib_hours += float(hours)
        entry.amount += cost
        entry.by_class[row["storage_class__name"]] = entry.by_class.get(row["storage_class__name"], 0) + cost
    for tenant_id, gib in (Volume.objects.filter(tenant_id__in=tenant_ids, state__in=BILLED, **team)
                           .values_list("tenant_id")
                           .annotate(gib=Sum("size_gib")).order_by()):
        spend[tenant_id].gib_now = gib
    return dict(spend)
