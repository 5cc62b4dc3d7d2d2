"""
Invoices from the ledger (docs/billing.md, "Invoices").

A month's lines are the tenant's usage records of the month summed per team, offering (or storage
class), region, term and price -- each line's amount rounded to the cent once, half-even -- then the
SLA credit of the month (the SLA's credit percent of the GPU lines, as a negative line). While the
month runs the draft is computed on each read; once the month is over and metered, ``finalize``
writes it with the next number of a gap-free sequence and a digest chained to the previous final
document, and never changes it again (a correction is a credit note, numbered alike).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from billing import credits
from billing.choices import COMMITTED, PRICE_UNITS, DocumentKind, DocumentState, LineKind, Resource
from billing.models import Invoice, InvoiceCounter, InvoiceLine, MeterState, UsageRecord
from cloud.models import Offering, Region
from core.errors import Conflict, invalid
from provisioning.models import Reservation
from provisioning.sla.accounting import shown, sla_for_tenants
from security.audit import audit_record
from security.models import Incident
from storage.models import StorageClass
from tenants.models import Team

CENT = Decimal("0.01")
GROUP = ("team_id", "resource", "offering_id", "storage_class_id", "region_id", "term", "unit_price", "currency")


def month_bounds(month_start: datetime) -> tuple[datetime, datetime]:
    start = month_start.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def cents(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, ROUND_HALF_EVEN)


@dataclass
class Draft:
    """A month's invoice as it stands: lines in order, and its sums (not saved)."""

    invoice: Invoice
    lines: list[InvoiceLine]


def draft(tenant_id, month_start: datetime, now: datetime | None = None) -> Draft:
    """The tenant's invoice of the month as the ledger has it now (the month so far, while it runs)."""
    now = now or timezone.now()
    start, end = month_bounds(month_start)
    rows = list(UsageRecord.objects.filter(tenant_id=tenant_id, starts_at__gte=start, starts_at__lt=end)
                .values(*GROUP).annotate(q=Sum("quantity"), a=Sum("amount")).order_by())
    names = _names(rows)
    lines, gpu = [], Decimal(0)
    for row in sorted(rows, key=lambda r: (names["team"].get(r["team_id"], ""), r["resource"], _label(r, names),
                                           r["unit_price"])):
        quantity = (row["q"] / Decimal(3600)).quantize(Decimal("0.001"), ROUND_HALF_EVEN)
        lines.append(InvoiceLine(
            kind=LineKind.USAGE, team_name=names["team"].get(row["team_id"], "Tenant-wide"),
            description=_label(row, names), region=names["region"].get(row["region_id"], ""), term=row["term"],
            quantity=quantity, unit=PRICE_UNITS[row["resource"]], unit_price=row["unit_price"], amount=cents(row["a"])))
        if row["resource"] == Resource.GPU:
            gpu += lines[-1].amount
    credit = _sla_credit(tenant_id, start, min(end, now), gpu)
    if credit is not None:
        lines.append(credit)
    prepaid = _prepaid(tenant_id, start, end, sum((line.amount for line in lines), Decimal(0)))
    if prepaid is not None:
        lines.append(prepaid)
    for position, line in enumerate(lines, start=1):
        line.position = position
    subtotal = sum((line.amount for line in lines if line.kind == LineKind.USAGE), Decimal(0))
    credited = sum((line.amount for line in lines if line.kind != LineKind.USAGE), Decimal(0))
    invoice = Invoice(tenant_id=tenant_id, period_start=start, period_end=end, subtotal=subtotal, credits=credited,
                      total=subtotal + credited, currency=rows[0]["currency"] if rows else "USD")
    return Draft(invoice, lines)


def _names(rows) -> dict[str, dict]:
    return {
        "team": dict(Team.objects.filter(pk__in={r["team_id"] for r in rows}).values_list("pk", "name")),
        "offering": dict(Offering.objects.filter(pk__in={r["offering_id"] for r in rows}).values_list("pk", "name")),
        "class": dict(StorageClass.objects.filter(pk__in={r["storage_class_id"] for r in rows}).values_list("pk",
                                                                                                        "name")),
        "region": dict(Region.objects.filter(pk__in={r["region_id"] for r in rows}).values_list("pk", "slug")),
    }


def _label(row, names) -> str:
    if row["resource"] == Resource.GPU:
        offering = names["offering"].get(row["offering_id"], "GPU time")
        return f"{offering}, committed capacity" if row["term"] == COMMITTED else offering
    if row["resource"] == Resource.ADDRESS:
        return "Public IPv4 addresses"
    return names["class"].get(row["storage_class_id"], "Storage")


def _sla_credit(tenant_id, since: datetime, until: datetime, gpu_amount: Decimal) -> InvoiceLine | None:
    """The month's SLA credit as a negative line (its percent of the GPU lines), or None when none is due."""
    if gpu_amount <= 0 or until <= since or not _had_outages(tenant_id, since, until):
        return None
    figures = sla_for_tenants(Reservation.objects.all(), tenant_ids=[tenant_id], month=since.date(),
                              now=until)[tenant_id]
    if not figures.credit_percent:
        return None
    return InvoiceLine(
        kind=LineKind.SLA_CREDIT, description=f"SLA credit: {shown(figures.availability, 3)} % available against "
                                              f"{shown(figures.target, 3)} %, {figures.credit_percent} % of GPU usage",
        quantity=Decimal(0), unit_price=Decimal(0), amount=-cents(gpu_amount * figures.credit_percent / 100))


def _had_outages(tenant_id, since: datetime, until: datetime) -> bool:
    """
    Whether an incident touched the tenant's work in the period (one EXISTS): without one its
    availability is 100 % and no credit is due, so most drafts skip the SLA's computation.
    """
    return (Incident.objects.filter(reservation_id__in=Reservation.objects.filter(tenant_id=tenant_id).values("pk"))
            .filter(Q(impact_started_at__lt=until) | Q(impact_started_at__isnull=True, detected_at__lt=until))
            .exclude(restored_at__lte=since).exclude(restored_at__isnull=True, resolved_at__lte=since).exists())


def credit_balance(tenant_id, now: datetime | None = None) -> credits.Balance:
    """The tenant's prepaid credit now: granted, taken by final invoices, and by the months not closed yet so far."""
    now = now or timezone.now()
    start, _ = month_bounds(now)
    previous, _ = month_bounds(start - timedelta(days=1))
    months = [start]
    if not Invoice.objects.filter(tenant_id=tenant_id, kind=DocumentKind.INVOICE, period_start=previous).exists():
        months.insert(0, previous)  # last month is not closed yet: its draft draws on the credit too
    return credits.balance(tenant_id, [draft(tenant_id, month, now) for month in months])


def _prepaid(tenant_id, start: datetime, end: datetime, due: Decimal) -> InvoiceLine | None:
    """What the month draws on the tenant's prepaid credit, as a negative line (None: no credit, or nothing due)."""
    if due <= 0:
        return None
    left = credits.available(tenant_id, start, end)
    if left <= 0:
        return None
    taken = min(left, due)
    return InvoiceLine(kind=LineKind.PREPAID, description=f"Prepaid credit ({cents(left - taken):,} left after this)",
                       quantity=Decimal(0), unit_price=Decimal(0), amount=-taken)


@transaction.atomic
def finalize(tenant_id, month_start: datetime, now: datetime | None = None) -> Invoice:
    """
    The month's final invoice: written once the month is over and metered, numbered, chained; asked
    again, the same invoice (closing a month twice changes nothing).
    """
    now = now or timezone.now()
    start, end = month_bounds(month_start)
    done = Invoice.objects.filter(tenant_id=tenant_id, kind=DocumentKind.INVOICE, period_start=start).first()
    if done is not None:
        return done
    if end > now:
        raise Conflict(f"{start:%B %Y} is not over: its invoice is a draft until {end:%Y-%m-%d}.",
                       code="month_not_over")
    metered = MeterState.objects.filter(pk=1).values_list("metered_until", flat=True).first()
    if metered is None or metered < end:
        raise Conflict(f"The meter has not recorded all of {start:%B %Y} yet: the month closes after it has.",
                       code="month_not_metered")
    built = draft(tenant_id, start, now)
    return _issue(built.invoice, built.lines, now)


def _issue(invoice: Invoice, lines: list[InvoiceLine], now: datetime) -> Invoice:
    """Number, chain and write a final document (inside the caller's transaction)."""
    counter, _ = InvoiceCounter.objects.select_for_update().get_or_create(pk=1)
    counter.last += 1
    invoice.sequence, invoice.state, invoice.finalized_at = counter.last, DocumentState.FINAL, now
    invoice.number = f"{settings.MERIDIAN_INVOICE_PREFIX}-{invoice.period_start:%Y}-{counter.last:06d}"
    invoice.previous_digest = counter.last_digest
    invoice.digest = document_digest(invoice, lines)
    invoice.save()
    for line in lines:
        line.invoice = invoice
    InvoiceLine.objects.bulk_create(lines)
    counter.last_digest = invoice.digest
    counter.save()
    return invoice


def document_digest(invoice: Invoice, lines: list[InvoiceLine]) -> str:
    """SHA-256 of the previous digest and the document's canonical JSON: change a cent and the chain breaks."""
    body = {"number": invoice.number, "kind": invoice.kind, "tenant": str(invoice.tenant_id),
            "period": [invoice.period_start.isoformat(), invoice.period_end.isoformat()],
            "currency": invoice.currency, "total": f"{invoice.total:.2f}",
            "corrects": str(invoice.corrects_id) if invoice.corrects_id else None,
            "lines": [[line.kind, line.team_name, line.description, line.region, line.term, f"{line.quantity:.3f}",
                       line.unit, f"{line.unit_price:.6f}", f"{line.amount:.2f}"] for line in lines]}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256((invoice.previous_digest + "|" + canonical).encode()).hexdigest()


@transaction.atomic
def credit_note_issue(*, actor, invoice: Invoice, amount: Decimal, reason: str) -> Invoice:
    """A credit note of ``amount`` against a final invoice, with its reason: never more than is left to credit."""
    invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
    if invoice.kind != DocumentKind.INVOICE or invoice.state != DocumentState.FINAL:
        raise Conflict("Credit notes correct final invoices.", code="not_final")
    if amount <= 0 or amount != cents(amount):
        raise invalid("amount", "Give a positive amount in cents, e.g. \"12.50\".", code="invalid")
    credited = -(Invoice.objects.filter(corrects=invoice).aggregate(n=Sum("total"))["n"] or Decimal(0))
    if amount > invoice.total - credited:
        raise invalid("amount", f"{invoice.number} has {invoice.total - credited} left to credit.",
                      code="more_than_invoiced")
    note = Invoice(tenant_id=invoice.tenant_id, kind=DocumentKind.CREDIT_NOTE, period_start=invoice.period_start,
                   period_end=invoice.period_end, currency=invoice.currency, credits=-amount, total=-amount,
                   corrects=invoice, reason=reason)
    line = InvoiceLine(kind=LineKind.ADJUSTMENT, position=1, description=f"Credit on {invoice.number}: {reason}",
                       amount=-amount)
    note = _issue(note, [line], timezone.now())
    audit_record(actor=actor, action="invoice.credit_note", target=invoice,
                 after={"credit_note": note.number, "amount": str(amount), "reason": reason})
    return note


def close_month(month_start: datetime, now: datetime | None = None) -> dict:
    """Finalize every tenant's invoice of a month that has usage (the beat's daily pass); returns how many."""
    start, end = month_bounds(month_start)
    tenants = UsageRecord.objects.filter(starts_at__gte=start, starts_at__lt=end).values_list(
        "tenant_id", flat=True).distinct().order_by()
    made = 0
    for tenant_id in tenants:
        before = Invoice.objects.filter(tenant_id=tenant_id, kind=DocumentKind.INVOICE, period_start=start).exists()
        finalize(tenant_id, start, now)
        made += not before
    return {"month": f"{start:%Y-%m}", "finalized": made}


def invoice_csv(invoice: Invoice) -> str:
    """The invoice's lines as CSV, one row each, then its totals (the API's and the console's download)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["number", "line", "kind", "team", "description", "region", "term", "quantity", "unit",
                     "unit_price", "amount", "currency"])
    for line in invoice.lines.all():
        writer.writerow([invoice.number, line.position, line.kind, line.team_name, line.description, line.region,
                         line.term, line.quantity, line.unit, line.unit_price, line.amount, invoice.currency])
    for label, value in (("subtotal", invoice.subtotal), ("credits", invoice.credits), ("total", invoice.total)):
        writer.writerow([invoice.number, "", label, "", "", "", "", "", "", "", value, invoice.currency])
    return out.getvalue()
