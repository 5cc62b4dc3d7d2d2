"""
The meter (docs/billing.md, "The ledger"): turns what ran into usage records, one hourly window at
a time, once the window is over.

- GPU time: each allocation's overlap with the window, in GPU-seconds (a fractional slot is its
  share of a GPU), keyed ``gpu:<allocation>:<window start>``, rated at the price book's price of
  the reservation's offering, region and term when the window began.
- Storage: each storage usage sample taken in the window (``storage.usage``), in GiB-seconds,
  keyed ``storage:<sample>``, at its class's price.
- Public addresses: each public IPv4 address's overlap with the window, in address-seconds, keyed
  ``address:<assignment>:<window start>``, at MERIDIAN_PUBLIC_ADDRESS_HOUR_PRICE.

A window is written in one transaction with its rollups and the meter's mark, so a worker killed
mid-run leaves the window unwritten, and the next run writes it; the keys are unique, so a window
metered twice (two meters, a lost mark) writes nothing the second time. ``meter_recheck`` looks at
recent windows again and records a correction for what changed since (an allocation that ended
earlier than was known): records are never edited.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Count, DurationField, ExpressionWrapper, F, Min, Q, Sum, Value
from django.db.models.functions import Greatest, Least
from django.utils import timezone

from billing.choices import COMMITTED, Period, Resource
from billing.models import MeterState, UsageRecord, UsageRollup
from billing.prices import PriceBook, gib_hour
from cloud.models import Region
from provisioning.choices import BillingTerm
from provisioning.models import AddressAssignment, Allocation
from storage.models import StorageUsageSample

log = logging.getLogger(__name__)

WINDOW = timedelta(hours=1)
PLACES = Decimal("0.000001")
ALLOCATION_COLUMNS = ("pk", "reservation_id", "reservation__tenant_id", "reservation__team_id",
                      "reservation__offering_id", "reservation__offering__slots_per_gpu", "reservation__billing_term",
                      "node__region_id", "starts_at", "ends_at")


def hour_floor(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


def meter_run(now: datetime | None = None, *, max_windows: int | None = None) -> dict:
    """Meter every closed window after the mark, oldest first; returns windows and records written."""
    now = now or timezone.now()
    closed_until = hour_floor(now)
    windows = records = 0
    book = PriceBook()
    while max_windows is None or windows < max_windows:
        with transaction.atomic():
            state = MeterState.objects.select_for_update(skip_locked=True).filter(pk=1).first()
            if state is None:
                if MeterState.objects.filter(pk=1).exists():
                    return {"windows": windows, "records": records, "busy": True}  # another meter runs
                MeterState.objects.get_or_create(pk=1)
                continue
            start = state.metered_until or _first_window()
            if start is None or start >= closed_until:
                break
            records += meter_window(start, book)
            state.metered_until = start + WINDOW
            state.save(update_fields=["metered_until", "updated_at"])
        windows += 1
    return {"windows": windows, "records": records}


def meter_window(start: datetime, book: PriceBook) -> int:
    """Write the window ``[start, start + 1 h)``'s records (ones written already stay) and rollups; returns how many."""
    end = start + WINDOW
    rows = [*_gpu_records(start, end, book), *_storage_records(start, end), *_address_records(start, end)]
    UsageRecord.objects.bulk_create(rows, ignore_conflicts=True, batch_size=2000)
    # A storage sample taken early in the window covers the end of the hour before: that hour too.
    rollup_hours({start} | {hour_floor(row.starts_at) for row in rows})
    return len(rows)


def _first_window() -> datetime | None:
    firsts = [Allocation.objects.aggregate(at=Min("starts_at"))["at"],
              StorageUsageSample.objects.aggregate(at=Min("at"))["at"]]
    firsts = [at for at in firsts if at is not None]
    return hour_floor(min(firsts)) if firsts else None


def gpu_seconds(row: dict, start: datetime, end: datetime) -> Decimal:
    """The GPU-seconds an allocation (a row of ALLOCATION_COLUMNS) held inside ``[start, end)``."""
    held = (min(row["ends_at"], end) - max(row["starts_at"], start)).total_seconds()
    share = Decimal(1) / Decimal(row["reservation__offering__slots_per_gpu"] or 1)
    return (Decimal(str(max(held, 0.0))) * share).quantize(PLACES, ROUND_HALF_EVEN)


def _gpu_records(start: datetime, end: datetime, book: PriceBook) -> list[UsageRecord]:
    window = int(start.timestamp())
    records = []
    for row in Allocation.objects.filter(starts_at__lt=end, ends_at__gt=start).values(*ALLOCATION_COLUMNS).iterator(
            chunk_size=5000):
        quantity = gpu_seconds(row, start, end)
        if quantity <= 0:
            continue
        term, price, currency = gpu_price(row, start, end, book)
        key = f"gpu:{row['pk']}:{window}"
        records.append(UsageRecord(
            key=key, subject=key, resource=Resource.GPU, tenant_id=row["reservation__tenant_id"],
            team_id=row["reservation__team_id"], reservation_id=row["reservation_id"],
            offering_id=row["reservation__offering_id"], region_id=row["node__region_id"], term=term,
            starts_at=max(row["starts_at"], start), ends_at=min(row["ends_at"], end), quantity=quantity,
            unit_price=price, amount=rate(quantity, price), currency=currency))
    return records


def gpu_price(row: dict, start: datetime, end: datetime, book: PriceBook) -> tuple[str, Decimal, str]:
    """
    The record's term, price per GPU-hour and currency for an allocation (a row of
    ALLOCATION_COLUMNS) in ``[start, end)``: a commitment's at its rate, spot at the market's
    average over the window (where the market has one), else the price book's.
    """
    if row["reservation_id"] in book.committed:
        return (COMMITTED, *book.committed[row["reservation_id"]])
    term = row["reservation__billing_term"]
    price, currency = book.gpu_hour(row["reservation__offering_id"], row["node__region_id"], term, start)
    if term == BillingTerm.SPOT:
        market = book.spot_average(row["reservation__offering_id"], row["node__region_id"], start, end)
        price = market if market is not None else price
    return term, price, currency


def _storage_records(start: datetime, end: datetime) -> list[UsageRecord]:
    records = []
    samples = StorageUsageSample.objects.filter(at__gte=start, at__lt=end).values(
        "pk", "tenant_id", "team_id", "storage_class_id", "storage_class__region_id",
        "storage_class__price_per_gib_month", "gib", "seconds", "at")
    for sample in samples.iterator(chunk_size=5000):
        quantity = Decimal(sample["gib"]) * Decimal(sample["seconds"])
        if quantity <= 0:
            continue
        price = gib_hour(sample["storage_class__price_per_gib_month"])
        key = f"storage:{sample['pk']}"
        records.append(UsageRecord(
            key=key, subject=key, resource=Resource.STORAGE, tenant_id=sample["tenant_id"], team_id=sample["team_id"],
            storage_class_id=sample["storage_class_id"], region_id=sample["storage_class__region_id"],
            starts_at=sample["at"] - timedelta(seconds=sample["seconds"]), ends_at=sample["at"], quantity=quantity,
            unit_price=price.quantize(Decimal("0.00000001"), ROUND_HALF_EVEN), amount=rate(quantity, price)))
    return records


def _address_records(start: datetime, end: datetime) -> list[UsageRecord]:
    window, price = int(start.timestamp()), Decimal(settings.MERIDIAN_PUBLIC_ADDRESS_HOUR_PRICE)
    regions = dict(Region.objects.values_list("slug", "pk"))
    records = []
    held = (AddressAssignment.objects.filter(kind=AddressAssignment.Kind.PUBLIC, assigned_at__lt=end)
            .filter(Q(released_at__isnull=True) | Q(released_at__gt=start))
            .values("pk", "tenant_id", "region", "assigned_at", "released_at", "instance__reservation_id",
                    "instance__reservation__team_id"))
    for row in held.iterator(chunk_size=5000):
        since, until = max(row["assigned_at"], start), min(row["released_at"] or end, end)
        quantity = Decimal(str((until - since).total_seconds())).quantize(PLACES, ROUND_HALF_EVEN)
        if quantity <= 0 or row["region"] not in regions:
            continue
        key = f"address:{row['pk']}:{window}"
        records.append(UsageRecord(
            key=key, subject=key, resource=Resource.ADDRESS, tenant_id=row["tenant_id"],
            team_id=row["instance__reservation__team_id"], reservation_id=row["instance__reservation_id"],
            region_id=regions[row["region"]], starts_at=since, ends_at=until, quantity=quantity, unit_price=price,
            amount=rate(quantity, price)))
    return records


def rate(quantity: Decimal, per_hour: Decimal) -> Decimal:
    """The amount of ``quantity`` unit-seconds at ``per_hour`` per unit-hour, to a millionth (half-even)."""
    return (quantity * per_hour / Decimal(3600)).quantize(PLACES, ROUND_HALF_EVEN)


def meter_recheck(now: datetime | None = None) -> int:
    """
    Look again at the GPU time of the windows metered in the last MERIDIAN_METER_RECHECK_HOURS: where
    an allocation now held less (or more) than was recorded, record the difference as a correction.
    Each window is first compared whole (two sums in the database); only one that differs is looked
    at allocation by allocation. Returns how many corrections were recorded.
    """
    now = now or timezone.now()
    state = MeterState.objects.filter(pk=1).first()
    if state is None or state.metered_until is None:
        return 0
    since = max(hour_floor(now) - timedelta(hours=settings.MERIDIAN_METER_RECHECK_HOURS),
                state.metered_until - timedelta(hours=settings.MERIDIAN_METER_RECHECK_HOURS))
    book, made, touched = PriceBook(), [], set()
    window = since
    while window < state.metered_until:
        if not _window_agrees(window):
            found = _window_corrections(window, book)
            made += found
            if found:
                touched.add(window)
        window += WINDOW
    with transaction.atomic():
        UsageRecord.objects.bulk_create(made, ignore_conflicts=True)
        rollup_hours(touched)
    return len(made)


def _window_agrees(window: datetime) -> bool:
    """Whether the GPU-seconds recorded for the window add up to what its allocations held (to a millionth each)."""
    end = window + WINDOW
    recorded = UsageRecord.objects.filter(resource=Resource.GPU, starts_at__gte=window, starts_at__lt=end).aggregate(
        q=Sum("quantity"), n=Count("pk"))
    held = Decimal(0)
    overlap = ExpressionWrapper(Least(F("ends_at"), Value(end)) - Greatest(F("starts_at"), Value(window)),
                                output_field=DurationField())
    for slots, seconds in (Allocation.objects.filter(starts_at__lt=end, ends_at__gt=window)
                           .values_list("reservation__offering__slots_per_gpu").annotate(d=Sum(overlap)).order_by()):
        held += Decimal(str(seconds.total_seconds())) / Decimal(slots or 1)
    return abs(held - (recorded["q"] or 0)) <= PLACES * (recorded["n"] + 1)


def _window_corrections(window: datetime, book: PriceBook) -> list[UsageRecord]:
    """The corrections of one window, allocation by allocation."""
    end, stamp = window + WINDOW, int(window.timestamp())
    recorded = dict(UsageRecord.objects.filter(resource=Resource.GPU, starts_at__gte=window, starts_at__lt=end)
                    .values_list("subject").annotate(n=Sum("quantity")).order_by())
    originals = {r.subject: r for r in UsageRecord.objects.filter(key__in=list(recorded))}
    held = {f"gpu:{row['pk']}:{stamp}": (row, gpu_seconds(row, window, end))
            for row in Allocation.objects.filter(starts_at__lt=end, ends_at__gt=window).values(*ALLOCATION_COLUMNS)}
    for subject in recorded.keys() - held.keys():
        held[subject] = (None, Decimal(0))  # the allocation holds none of it now
    made = []
    for subject, (row, quantity) in held.items():
        difference = quantity - recorded.get(subject, Decimal(0))
        original = originals.get(subject)
        if difference == 0 or (original is None and row is None):
            continue
        made.append(_correction(subject, original, row, difference, window, book))
    return made


def _correction(subject: str, original, row, difference: Decimal, window: datetime, book: PriceBook) -> UsageRecord:
    """A record of ``difference`` more (or less) of ``subject``, at the price the original was rated at."""
    count = UsageRecord.objects.filter(subject=subject).count()
    if original is None:  # held more than nothing now, recorded nothing: a record of its own
        term, price, currency = gpu_price(row, window, window + WINDOW, book)
        return UsageRecord(key=subject, subject=subject, resource=Resource.GPU, tenant_id=row["reservation__tenant_id"],
                           team_id=row["reservation__team_id"], reservation_id=row["reservation_id"],
                           offering_id=row["reservation__offering_id"], region_id=row["node__region_id"], term=term,
                           starts_at=window, ends_at=window + WINDOW, quantity=difference, unit_price=price,
                           amount=rate(difference, price), currency=currency)
    return UsageRecord(key=f"{subject}:adj{count}", subject=subject, adjusts=original, resource=original.resource,
                       tenant_id=original.tenant_id, team_id=original.team_id, reservation_id=original.reservation_id,
                       offering_id=original.offering_id, region_id=original.region_id, term=original.term,
                       starts_at=original.starts_at, ends_at=original.ends_at, quantity=difference,
                       unit_price=original.unit_price, amount=rate(difference, original.unit_price),
                       currency=original.currency)


ROLLUP_DIMENSIONS = ("tenant_id", "team_id", "resource", "offering_id", "storage_class_id", "region_id", "term",
                     "currency")


def rollup_hours(hours: set[datetime]) -> None:
    """Sum the ledger again for these hours, then their days from their hours."""
    for hour in sorted(hours):
        _rollup(Period.HOUR, hour, UsageRecord.objects.filter(starts_at__gte=hour, starts_at__lt=hour + WINDOW))
    for day in sorted({hour.replace(hour=0) for hour in hours}):
        _rollup(Period.DAY, day, UsageRollup.objects.filter(period=Period.HOUR, starts_at__gte=day,
                                                            starts_at__lt=day + timedelta(days=1)))


def _rollup(period: str, start: datetime, rows) -> None:
    sums = rows.values(*ROLLUP_DIMENSIONS).annotate(quantity_sum=Sum("quantity"), amount_sum=Sum("amount")).order_by()
    UsageRollup.objects.filter(period=period, starts_at=start).delete()
    UsageRollup.objects.bulk_create([UsageRollup(
        period=period, starts_at=start, quantity=row.pop("quantity_sum"), amount=row.pop("amount_sum"), **row)
        for row in sums], batch_size=2000)


def usage_by_subject(since: datetime, until: datetime) -> dict[str, Decimal]:
    """The quantity recorded per subject (corrections included) for records starting in ``[since, until)``."""
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for subject, quantity in UsageRecord.objects.filter(starts_at__gte=since, starts_at__lt=until).values_list(
            "subject", "quantity").iterator(chunk_size=10000):
        totals[subject] += quantity
    return totals
