"""
SLA accounting: per tenant and calendar month (UTC), how much of what the tenant reserved was
available, against the target, and the service credit owed (issue 9, part 4).

The figures, as a tenant can recompute them from its reservations and incidents:

- **Reserved GPU-minutes.** Each reservation's GPU equivalents (whole GPUs, or slots / slots per
  GPU for fractional offerings) x the minutes it held them inside the month: from ``starts_at``
  until it was released or its window ended, whichever came first, and never past now -- the
  same hold ``provisioning.usage`` bills.
- **Unavailable GPU-minutes.** A tenant's incident names the reservation it hit and the GPUs that
  were out (``gpu_ids``, else just ``gpus_affected``) from ``impact_started_at`` (else
  ``detected_at``) until ``restored_at`` (else ``resolved_at``, else now). Each interval is clipped
  to the month and to the reservation's held window. Incidents that overlap on one reservation are
  merged, never added: over each stretch of time the GPUs out are the union of the GPUs the open
  incidents name (a GPU two incidents name counts once), plus the unnamed ones of incidents that
  name fewer GPUs than they affect, and never more than the reservation holds -- a reservation is
  at worst 100 % unavailable. Incidents that name no reservation (fleet-level ones) cost no
  tenant any availability.
- **Availability** = 100 x (1 - unavailable / reserved) %, and 100 % when nothing was reserved;
  the month is met when it is at least ``MERIDIAN_SLA_TARGET`` (99.0).
- **Credit** = the month's spend (the GPU-hours its allocations held x the price of the billing
  term: ``provisioning.usage``'s month-to-date spend) x the credit percentage of
  ``MERIDIAN_SLA_CREDITS``: rows ``[threshold %, credit %]``, and the largest credit whose threshold
  the availability is *below* applies. The default ``[[99.0, 10], [95.0, 25], [90.0, 50]]`` owes
  10 % of the month's spend below 99 %, 25 % below 95 % and 50 % below 90 %.

The arithmetic is exact (fractions of microseconds), so a month at exactly 99 % owes nothing and
one a microsecond worse owes the credit. ``sla_compute`` is pure (plain data in, figures out);
``sla_for_tenants`` reads the rows for many tenants in three queries.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import ROUND_FLOOR, ROUND_HALF_UP, Decimal
from fractions import Fraction
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Q

from provisioning import usage
from provisioning.models import Reservation
from security.models import Incident

DEFAULT_TARGET = 99.0
DEFAULT_CREDITS = ((99.0, 10), (95.0, 25), (90.0, 50))
CENT = Decimal("0.01")
MICROSECONDS_PER_MINUTE = 60_000_000
FIRST_MONTH = date(2000, 1, 1)
MONTH_FORMAT = re.compile(r"[0-9]{4}-[0-9]{2}")  # ASCII digits only

HOLD_COLUMNS = ("id", "tenant_id", "name", "starts_at", "ends_at", "released_at", "gpus", "units",
                "offering__slots_per_gpu", "billing_term", "offering__price_per_gpu_hour",
                "offering__reserved_discount_pct", "offering__spot_floor_price")
OUTAGE_COLUMNS = ("id", "reservation_id", "kind", "gpus_affected", "gpu_ids", "impact_started_at", "detected_at",
                  "restored_at", "resolved_at")


#
# Plain data
#


@dataclass(frozen=True)
class Hold:
    """A reservation's hold on ``gpus`` GPU equivalents over ``[start, end)``, at ``price`` per GPU-hour."""
    reservation_id: UUID
    name: str
    gpus: Fraction
    start: datetime
    end: datetime
    price: Decimal


@dataclass(frozen=True)
class Outage:
    """An incident's impact on one reservation: ``gpus`` out (``gpu_ids`` those it names) over ``[start, end)``."""
    incident_id: UUID
    reservation_id: UUID
    kind: str
    gpus: int
    gpu_ids: frozenset[str]
    start: datetime
    end: datetime
    ongoing: bool = False


@dataclass(frozen=True)
class ReservationSLA:
    reservation_id: UUID
    name: str
    gpus: Fraction
    reserved_gpu_minutes: Fraction
    unavailable_gpu_minutes: Fraction


@dataclass(frozen=True)
class OutageSLA:
    """One incident as the month counts it: clipped to the month and the hold, before merging."""
    outage: Outage
    started_at: datetime
    ended_at: datetime
    gpu_minutes: Fraction


@dataclass(frozen=True)
class SLAFigures:
    since: datetime
    until: datetime
    reserved_gpu_minutes: Fraction
    unavailable_gpu_minutes: Fraction
    availability: Fraction  # percent
    target: Fraction  # percent
    spend: Decimal
    credit_percent: Decimal
    credit: Decimal
    reservations: list[ReservationSLA] = field(default_factory=list)  # those with downtime
    outages: list[OutageSLA] = field(default_factory=list)

    @property
    def met(self) -> bool:
        return self.availability >= self.target


#
# Configuration (read at call time)
#


def sla_target() -> Fraction:
    target = getattr(settings, "MERIDIAN_SLA_TARGET", DEFAULT_TARGET)
    if not 0 <= float(target) <= 100:
        raise ImproperlyConfigured(f"MERIDIAN_SLA_TARGET must be a percentage, not {target!r}")
    return Fraction(str(target))


def credit_table() -> tuple[tuple[Fraction, Decimal], ...]:
    """``MERIDIAN_SLA_CREDITS`` as (threshold %, credit %) rows, checked: both percentages in [0, 100]."""
    rows = getattr(settings, "MERIDIAN_SLA_CREDITS", DEFAULT_CREDITS)
    table = []
    try:
        for threshold, credit in rows:
            pair = Fraction(str(threshold)), Decimal(str(credit))
            if not (0 <= pair[0] <= 100 and 0 <= pair[1] <= 100):
                raise ValueError
            table.append(pair)
    except (TypeError, ValueError, ArithmeticError):
        raise ImproperlyConfigured(
            f"MERIDIAN_SLA_CREDITS must be a list of [threshold %, credit %] pairs, not {rows!r}") from None
    return tuple(table)


def credit_percent(availability: Fraction, table: Iterable[tuple[Fraction, Decimal]]) -> Decimal:
    """The largest credit whose threshold ``availability`` is below; 0 when it is below none."""
    return max((credit for threshold, credit in table if availability < threshold), default=Decimal(0))


#
# Months
#


def parse_month(value: str, *, now: datetime) -> date:
    """``"2026-11"`` as the first day of that month; ValueError for anything else or a month not begun."""
    if not MONTH_FORMAT.fullmatch(value):
        raise ValueError("Give the month as YYYY-MM, for example 2026-11.")
    year, month = int(value[:4]), int(value[5:])
    if not 1 <= month <= 12:
        raise ValueError("The month must be 01 to 12.")
    first = date(year, month, 1)
    if first < FIRST_MONTH:
        raise ValueError(f"Months before {FIRST_MONTH:%Y-%m} have no figures.")
    if first > now.date().replace(day=1):
        raise ValueError("That month has not begun yet.")
    return first


def month_bounds(month: date, now: datetime) -> tuple[datetime, datetime, bool]:
    """``[since, until)`` of a month in UTC, cut at now, and whether the month is over."""
    since = datetime(month.year, month.month, 1, tzinfo=UTC)
    end = datetime(month.year + month.month // 12, month.month % 12 + 1, 1, tzinfo=UTC)
    return since, min(end, now), end <= now


#
# The calculation (pure)
#


def _micros(lo: datetime, hi: datetime) -> int:
    delta = hi - lo
    return max((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds, 0)


def _minutes(gpu_micros: Fraction) -> Fraction:
    return Fraction(gpu_micros) / MICROSECONDS_PER_MINUTE


def _out_during(active: list[Outage], cap: Fraction) -> Fraction:
    """GPUs out while ``active`` overlap: named GPUs once each, plus the unnamed rest, capped at the hold."""
    named = set().union(*(o.gpu_ids for o in active))
    unnamed = sum(max(o.gpus - len(o.gpu_ids), 0) for o in active)
    return min(Fraction(len(named) + unnamed), cap)


def _unavailable(hold: Hold, outages: list[Outage], since: datetime, until: datetime) -> Fraction:
    """GPU-microseconds of ``hold`` lost to ``outages`` inside ``[since, until)``, overlaps merged."""
    lo, hi = max(since, hold.start), min(until, hold.end)
    clipped = [(max(o.start, lo), min(o.end, hi), o) for o in outages]
    clipped = [(start, end, o) for start, end, o in clipped if start < end]
    points = sorted({t for start, end, _ in clipped for t in (start, end)})
    total = Fraction(0)
    for a, b in itertools.pairwise(points):
        active = [o for start, end, o in clipped if start <= a and b <= end]
        if active:
            total += _out_during(active, hold.gpus) * _micros(a, b)
    return total


def _cost(hold: Hold, since: datetime, until: datetime) -> Decimal:
    """The hold's spend inside the period, rounded as ``usage.month_to_date`` rounds it."""
    return usage.Held(team="", gpus=float(hold.gpus), start=hold.start, end=hold.end,
                      price=hold.price).cost_within(since, until)


def sla_compute(*, holds: list[Hold], outages: list[Outage], since: datetime, until: datetime,
                target: Fraction, credits: Iterable[tuple[Fraction, Decimal]],
                spend: Decimal | None = None) -> SLAFigures:
    """
    The SLA figures of one tenant's ``holds`` and the ``outages`` that hit them, over ``[since, until)``.
    ``spend``: what the tenant spent then (``provisioning.usage``, from its allocations); None: the
    holds' own.
    """
    by_reservation = defaultdict(list)
    for outage in outages:
        by_reservation[outage.reservation_id].append(outage)
    reserved = unavailable = Fraction(0)
    held_spend = Decimal(0)
    affected, counted = [], []
    for hold in holds:
        held = hold.gpus * _micros(max(since, hold.start), min(until, hold.end))
        lost = _unavailable(hold, by_reservation.get(hold.reservation_id, []), since, until)
        reserved += held
        unavailable += lost
        held_spend += _cost(hold, since, until)
        if lost:
            affected.append(ReservationSLA(hold.reservation_id, hold.name, hold.gpus, _minutes(held), _minutes(lost)))
        lo, hi = max(since, hold.start), min(until, hold.end)
        for outage in by_reservation.get(hold.reservation_id, []):
            start, end = max(outage.start, lo), min(outage.end, hi)
            if start < end:
                alone = _out_during([outage], hold.gpus) * _micros(start, end)
                if alone:
                    counted.append(OutageSLA(outage, start, end, _minutes(alone)))
    availability = Fraction(100) if not reserved else 100 * (1 - unavailable / reserved)
    percent = credit_percent(availability, credits)
    spend = held_spend if spend is None else spend
    return SLAFigures(
        since=since, until=until, reserved_gpu_minutes=_minutes(reserved),
        unavailable_gpu_minutes=_minutes(unavailable),
        availability=availability, target=target, spend=spend, credit_percent=percent,
        credit=(spend * percent / 100).quantize(CENT, rounding=ROUND_HALF_UP),
        reservations=sorted(affected, key=lambda r: -r.unavailable_gpu_minutes),
        outages=sorted(counted, key=lambda o: o.started_at),
    )


def shown(value: Fraction, places: int = 4) -> Decimal:
    """A figure for display, rounded down, so a shown availability is below a threshold whenever the real one is."""
    return (Decimal(value.numerator) / Decimal(value.denominator)).quantize(Decimal(1).scaleb(-places),
                                                                           rounding=ROUND_FLOOR)


#
# Reading the rows
#


def _held_reservations(reservations, since: datetime, until: datetime):
    """The reservations (a scoped queryset) that held anything inside ``[since, until)``."""
    return (reservations.filter(starts_at__lt=until).filter(Q(ends_at__gt=since) | Q(ends_at__isnull=True))
            .exclude(released_at__lte=since).exclude(state__in=usage.NEVER_HELD))


def _hold(row, now: datetime) -> tuple[UUID, Hold]:
    (pk, tenant_id, name, start, end, released, gpus, units, slots, term, price, discount, floor) = row
    stop = min(t for t in (end, released, now) if t is not None)
    equivalent = Fraction(gpus) if gpus else Fraction(units, max(slots or 1, 1))
    return tenant_id, Hold(reservation_id=pk, name=name, gpus=equivalent, start=start, end=max(stop, start),
                           price=usage.price_per_gpu_hour(term, price, discount, floor))


def _outage(row, now: datetime) -> Outage:
    (pk, reservation_id, kind, gpus, gpu_ids, impact, detected, restored, resolved) = row
    end = restored or resolved
    return Outage(incident_id=pk, reservation_id=reservation_id, kind=kind, gpus=gpus or 0,
                  gpu_ids=frozenset(str(g) for g in (gpu_ids or []) if isinstance(g, str | int)),
                  start=impact or detected, end=end or now, ongoing=end is None)


@dataclass(frozen=True)
class TenantSLA:
    """One tenant's month: its figures, the month, and whether they cover all its teams' reservations."""
    tenant: object
    month: date
    complete: bool
    figures: SLAFigures
    whole_tenant: bool = True


def sla_for_tenants(reservations, *, tenant_ids: Iterable[UUID] | None, month: date,
                    now: datetime) -> dict[UUID, SLAFigures]:
    """
    The month's figures of each of ``tenant_ids`` (None: of every tenant that held anything), from
    ``reservations`` (a queryset already scoped to what the caller may see): three queries however
    many tenants, reservations and incidents.
    """
    since, until, _ = month_bounds(month, now)
    if tenant_ids is not None:
        tenant_ids = list(tenant_ids)
        reservations = reservations.filter(tenant_id__in=tenant_ids)
    held = _held_reservations(reservations, since, until)
    holds = defaultdict(list)
    for row in held.order_by().values_list(*HOLD_COLUMNS):
        tenant_id, hold = _hold(row, now)
        holds[tenant_id].append(hold)
    tenant_of = {hold.reservation_id: tenant_id for tenant_id, hs in holds.items() for hold in hs}
    # Incidents are platform records; these are only those naming a reservation the caller may see.
    impact = (Incident.objects.filter(reservation_id__in=held.values("id"))
              .filter(Q(impact_started_at__lt=until) | Q(impact_started_at__isnull=True, detected_at__lt=until))
              .exclude(restored_at__lte=since).exclude(restored_at__isnull=True, resolved_at__lte=since))
    outages = defaultdict(list)
    for row in impact.order_by().values_list(*OUTAGE_COLUMNS):
        outage = _outage(row, now)
        if outage.reservation_id in tenant_of:
            outages[tenant_of[outage.reservation_id]].append(outage)
    target, credits = sla_target(), credit_table()
    spent = usage.spend_by_tenant(reservations, since=since, until=until)
    if tenant_ids is None:
        tenant_ids = list(holds.keys() | spent.keys())
    return {tenant_id: sla_compute(holds=holds.get(tenant_id, []), outages=outages.get(tenant_id, []),
                                   since=since, until=until, target=target, credits=credits,
                                   spend=spent.get(tenant_id, Decimal(0)))
            for tenant_id in tenant_ids}


def sla_read(*, principal, tenants, month: date, now: datetime) -> list[TenantSLA]:
    """
    The month of each of ``tenants`` (rows the principal may see) over the reservations the
    principal may see: the whole tenant for its admins and staff, a member's own teams and the
    tenant-wide reservations otherwise (``whole_tenant`` says which).
    """
    tenants = list(tenants)
    figures = sla_for_tenants(Reservation.objects.visible_to(principal), tenant_ids=[t.pk for t in tenants],
                              month=month, now=now)
    complete = month_bounds(month, now)[2]
    whole = principal.is_platform or principal.sees_all_teams
    return [TenantSLA(tenant=t, month=month, complete=complete, figures=figures[t.pk], whole_tenant=whole)
            for t in tenants]


__all__ = ["Hold", "Outage", "SLAFigures", "TenantSLA", "credit_percent", "credit_table", "month_bounds",
           "parse_month", "shown", "sla_compute", "sla_for_tenants", "sla_read", "sla_target"]
