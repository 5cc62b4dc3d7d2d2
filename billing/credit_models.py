"""Prepaid credit (docs/billing.md, "Prepaid credit"): amounts granted to a tenant, drawn down by its invoices."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from tenants.scoping import TenantOwnedModel


class CreditGrant(TenantOwnedModel):
    """
    Credit a tenant has paid for in advance (or was given): from ``granted_at`` each month's invoice
    draws on what is left, as a negative line, until none is.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    currency = models.CharField(max_length=3, default="USD")
    note = models.CharField(max_length=200, help_text="What it is for: a prepayment, a goodwill credit.")
    granted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    granted_at = models.DateTimeField()

    class Meta:
        ordering = ["-granted_at"]
        constraints = [models.CheckConstraint(condition=Q(amount__gt=0), name="credit_grant_positive")]

    def __str__(self):
        return f"{self.amount} {self.currency}: {self.note}"
