"""
Prepaid credit (docs/billing.md, "Prepaid credit"). Platform admins grant a tenant credit; each
month's invoice draws on what is left -- after its SLA credit -- as a negative "Prepaid credit" line,
so a final invoice records what it took and the balance is the grants less what final invoices
took. The balance shown while a month runs also takes what the month's draft would take so far:
a real-time burndown from the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import Sum

from billing.choices import DocumentKind, DocumentState, LineKind
from billing.models import CreditGrant, InvoiceLine
from core.errors import invalid
from security.audit import audit_record


@dataclass(frozen=True)
class Balance:
    granted: Decimal
    taken: Decimal  # by final invoices
    pending: Decimal  # by the drafts of months not yet closed, so far
    currency: str = "USD"

    @property
    def remaining(self) -> Decimal:
        return self.granted - self.taken - self.pending


@transaction.atomic
def credit_grant(*, actor, tenant, amount: Decimal, note: str, at: datetime) -> CreditGrant:
    """Grant ``tenant`` ``amount`` of prepaid credit from ``at``; audited."""
    if amount <= 0:
        raise invalid("amount", "A grant is more than zero.", code="min_value")
    note = (note or "").strip()
    if not note:
        raise invalid("note", "Say what the credit is for (a prepayment, a goodwill credit).", code="required")
    grant = CreditGrant.objects.create(tenant=tenant, amount=amount, note=note[:200], granted_at=at,
                                       granted_by=getattr(actor, "user", None))
    audit_record(actor=actor, action="credit.grant", target=grant, tenant_id=tenant.pk,
                 after={"amount": str(amount), "currency": grant.currency, "note": grant.note})
    return grant


def available(tenant_id, month_start: datetime, month_end: datetime) -> Decimal:
    """What a month's invoice may draw: credit granted before its end, less what earlier final invoices took."""
    granted = (CreditGrant.objects.filter(tenant_id=tenant_id, granted_at__lt=month_end)
               .aggregate(n=Sum("amount"))["n"] or Decimal(0))
    if not granted:
        return Decimal(0)  # most tenants: one query
    return max(granted - _taken(tenant_id, before=month_start), Decimal(0))


def balance(tenant_id, open_drafts: list) -> Balance:
    """The tenant's credit: granted, taken by final invoices, and by ``open_drafts`` (months not closed) so far."""
    granted = CreditGrant.objects.filter(tenant_id=tenant_id).aggregate(n=Sum("amount"))["n"] or Decimal(0)
    taken = _taken(tenant_id)
    pending = -sum((line.amount for built in open_drafts for line in built.lines if line.kind == LineKind.PREPAID),
                   Decimal(0))
    # Each open month draws on what final invoices left; together they cannot take more than that.
    return Balance(granted=granted, taken=taken, pending=min(pending, granted - taken))


def _taken(tenant_id, before: datetime | None = None) -> Decimal:
    lines = InvoiceLine.objects.filter(invoice__tenant_id=tenant_id, invoice__kind=DocumentKind.INVOICE,
                                       invoice__state=DocumentState.FINAL, kind=LineKind.PREPAID)
    if before is not None:
        lines = lines.filter(invoice__period_start__lt=before)
    return -(lines.aggregate(n=Sum("amount"))["n"] or Decimal(0))
