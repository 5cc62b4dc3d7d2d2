"""
Invoices (docs/billing.md, "Invoices"): a tenant's month as lines -- usage per team, offering or
class, region and term, SLA credits and adjustments -- a draft while the month runs, final (a
number of a gap-free sequence, a digest chained to the previous final document, never changed)
once it is over; a credit note corrects a final invoice.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from billing.choices import DocumentKind, DocumentState, LineKind
from tenants.scoping import TenantOwnedModel


class Invoice(TenantOwnedModel):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=12, choices=DocumentKind.choices, default=DocumentKind.INVOICE)
    state = models.CharField(max_length=8, choices=DocumentState.choices, default=DocumentState.DRAFT)
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    currency = models.CharField(max_length=3, default="USD")
    subtotal = models.DecimalField(max_digits=16, decimal_places=2, default=0)
    credits = models.DecimalField(max_digits=16, decimal_places=2, default=0)
    total = models.DecimalField(max_digits=16, decimal_places=2, default=0)
    # Final documents only: the sequence's next number, and a digest of the document chained to the
    # digest of the final document before it (the audit checkpoints' way).
    sequence = models.PositiveIntegerField(null=True, blank=True, unique=True)
    number = models.CharField(max_length=32, blank=True)
    digest = models.CharField(max_length=64, blank=True)
    previous_digest = models.CharField(max_length=64, blank=True)
    finalized_at = models.DateTimeField(null=True, blank=True)
    corrects = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="corrections")
    reason = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-period_start", "-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "period_start"], condition=Q(kind=DocumentKind.INVOICE),
                                    name="invoice_one_per_month"),
            models.CheckConstraint(condition=Q(state=DocumentState.DRAFT) | Q(sequence__isnull=False),
                                   name="invoice_final_has_number"),
        ]

    def __str__(self):
        return self.number or f"draft {self.period_start:%Y-%m}"


class InvoiceLine(models.Model):
    id = models.BigAutoField(primary_key=True)
    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    kind = models.CharField(max_length=12, choices=LineKind.choices)
    position = models.PositiveIntegerField()
    team_name = models.CharField(max_length=100, blank=True)
    description = models.CharField(max_length=300)
    region = models.CharField(max_length=64, blank=True)
    term = models.CharField(max_length=16, blank=True)
    quantity = models.DecimalField(max_digits=20, decimal_places=3, default=0)
    unit = models.CharField(max_length=16, blank=True)
    unit_price = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    amount = models.DecimalField(max_digits=16, decimal_places=2)

    tenant_path = "invoice__tenant"

    class Meta:
        ordering = ["invoice", "position"]

    def __str__(self):
        return f"{self.description}: {self.amount}"


class InvoiceCounter(models.Model):
    """The last number given (one row): taken under a row lock in the finalizing transaction, so numbers have no gap."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    last = models.PositiveIntegerField(default=0)
    last_digest = models.CharField(max_length=64, blank=True)

    def __str__(self):
        return f"last {self.last}"
