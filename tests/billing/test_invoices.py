"""
Invoices (billing.invoices): a month's lines from the ledger, its SLA credit as a negative line, a
draft while it runs, final once over and metered -- numbered without gaps, chained by digest, the
same when closed twice, never changed (a credit note corrects it) -- and its totals equal to the
rated usage, line by line.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import invoices
from billing.meter import meter_run
from billing.models import Invoice, InvoiceLine, UsageRecord
from core.errors import Conflict, DomainError
from security.models import Incident
from tests.billing.test_meter import ran

pytestmark = pytest.mark.django_db


@pytest.fixture
def month():
    """Last month's first instant, and this month's (when last month's invoice may close)."""
    this = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return (this - timedelta(days=1)).replace(day=1), this


def test_a_month_closes_into_a_numbered_chained_invoice_that_equals_the_ledger(world, month):
    last, this = month
    reservation = ran(world, start=last + timedelta(days=2), end=last + timedelta(days=4))
    meter_run(now=this + timedelta(hours=1))
    invoice = invoices.finalize(world.t1.tenant.pk, last, now=this + timedelta(hours=2))
    assert invoice.state == "final" and invoice.number == f"MER-{last:%Y}-000001" and len(invoice.digest) == 64
    (line,) = invoice.lines.all()
    price = reservation.offering.price_per_gpu_hour
    assert (line.quantity, line.unit, line.unit_price) == (Decimal("96.000"), "GPU-hour", price)
    assert line.amount == (96 * price).quantize(Decimal("0.01")) == invoice.total
    assert line.team_name == world.t1.team.name and line.region == "us-east-1" and line.term == "on_demand"
    ledger = sum(UsageRecord.objects.filter(tenant=world.t1.tenant).values_list("amount", flat=True))
    assert invoice.total == ledger.quantize(Decimal("0.01"))
    assert invoices.finalize(world.t1.tenant.pk, last, now=this + timedelta(days=1)).pk == invoice.pk  # again: same
    assert invoices.document_digest(invoice, list(invoice.lines.all())) == invoice.digest


def test_a_month_not_over_or_not_metered_stays_a_draft(world, month):
    last, this = month
    ran(world, start=this - timedelta(hours=5), end=this)
    with pytest.raises(Conflict, match="not over"):
        invoices.finalize(world.t1.tenant.pk, this, now=this + timedelta(hours=3))
    with pytest.raises(Conflict, match="has not recorded"):
        invoices.finalize(world.t1.tenant.pk, last, now=this + timedelta(hours=3))
    meter_run(now=this)
    draft = invoices.draft(world.t1.tenant.pk, last, now=this)
    assert draft.invoice.pk is not None and draft.invoice.state == "draft" and draft.lines
    assert not Invoice.objects.exists()


def test_an_outage_month_carries_its_sla_credit_as_a_negative_line(world, month):
    last, this = month
    reservation = ran(world, start=last, end=last + timedelta(days=10), gpus=2)
    Incident.objects.create(kind="gpu_failure", summary="GPU fell off the bus", tenant_id=world.t1.tenant.pk,
                            reservation_id=reservation.pk, gpus_affected=2, impact_started_at=last + timedelta(days=1),
                            restored_at=last + timedelta(days=2))
    meter_run(now=this)
    invoice = invoices.finalize(world.t1.tenant.pk, last, now=this)
    usage, credit = invoice.lines.order_by("position")
    assert credit.kind == "sla_credit" and credit.amount < 0 and "SLA credit" in credit.description
    assert invoice.total == usage.amount + credit.amount and invoice.credits == credit.amount


def test_credit_notes_correct_a_final_invoice_in_the_same_sequence(world, month):
    last, this = month
    ran(world, start=last + timedelta(days=1), end=last + timedelta(days=2))
    meter_run(now=this)
    invoice = invoices.finalize(world.t1.tenant.pk, last, now=this)
    staff = world.principal("platform_admin")
    note = invoices.credit_note_issue(actor=staff, invoice=invoice, amount=Decimal("10.00"), reason="Goodwill")
    assert note.number == f"MER-{last:%Y}-000002" and note.total == Decimal("-10.00")
    assert note.previous_digest == invoice.digest and note.corrects_id == invoice.pk
    for amount in (Decimal("0"), Decimal("1.001"), invoice.total):  # nothing, fractions of a cent, more than left
        with pytest.raises(DomainError):
            invoices.credit_note_issue(actor=staff, invoice=invoice, amount=amount, reason="x")
    assert Invoice.objects.count() == 2 and InvoiceLine.objects.filter(invoice=note).count() == 1


def test_numbers_have_no_gap_across_tenants_and_months(world, month):
    last, this = month
    before = (last - timedelta(days=1)).replace(day=1)
    for start in (before, last):
        ran(world, start=start + timedelta(days=1), end=start + timedelta(days=1, hours=2))
    meter_run(now=this)
    first = invoices.close_month(before, now=this)
    second = invoices.close_month(last, now=this)
    assert first["finalized"] == 1 and second["finalized"] == 1
    assert invoices.close_month(last, now=this)["finalized"] == 0
    assert sorted(Invoice.objects.values_list("sequence", flat=True)) == [1, 2]


def test_month_bounds_roll_over_the_year():
    start, end = invoices.month_bounds(datetime(2026, 12, 15, tzinfo=UTC))
    assert (start, end) == (datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
