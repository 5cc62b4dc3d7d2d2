"""
Billing's records (docs/billing.md): the price book, and the usage ledger -- immutable records of
what ran, per resource and hourly window, each rated when it is recorded -- with its rollups.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from billing.choices import RECORD_TERMS, RESOURCE_UNITS, Period, Resource
from cloud.models import CatalogueQuerySet
from provisioning.choices import BillingTerm
from tenants.scoping import TenantOwnedModel


class Price(models.Model):
    """
    What a GPU-hour of an offering costs in a region (every region: none named) on a term, from
    ``effective_from`` until the next price of the same offering, region and term. Usage is rated
    when it is recorded, at the price effective when it ran: a new price never reprices it.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    offering = models.ForeignKey("cloud.Offering", on_delete=models.PROTECT, related_name="prices")
    region = models.ForeignKey("cloud.Region", null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                               help_text="Empty: every region without a price of its own.")
    term = models.CharField(max_length=16, choices=BillingTerm.choices)
    per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=6, validators=[MinValueValidator(0)])
    currency = models.CharField(max_length=3, default="USD")
    effective_from = models.DateTimeField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = CatalogueQuerySet.as_manager()  # the price book is public, as the catalogue is

    class Meta:
        ordering = ["offering", "region", "term", "-effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["offering", "region", "term", "effective_from"],
                                    condition=Q(region__isnull=False), name="price_one_per_start_region",
                                    violation_error_message="A price of this offering, region and term starts then."),
            models.UniqueConstraint(fields=["offering", "term", "effective_from"], condition=Q(region__isnull=True),
                                    name="price_one_per_start_everywhere",
                                    violation_error_message="A price of this offering and term starts then."),
            models.CheckConstraint(condition=Q(per_gpu_hour__gte=0), name="price_not_negative"),
            models.CheckConstraint(condition=Q(term__in=BillingTerm.values), name="price_term_valid"),
        ]

    def __str__(self):
        return f"{self.offering_id} {self.term} {self.per_gpu_hour} from {self.effective_from:%Y-%m-%d %H:%M}"


class UsageRecord(TenantOwnedModel):
    """
    One resource's use inside one hourly window, rated: ``quantity`` in its unit (GPU-seconds,
    GiB-seconds) at ``unit_price`` per unit-hour (GPU-hour, GiB-hour), ``amount`` in ``currency``.
    ``key`` says what it counts (``gpu:<allocation>:<window>``, ``storage:<sample>``), so the meter
    run again over any period writes nothing twice; a correction is a new record whose key ends
    ``:adj<n>`` and whose quantity is the difference (``adjusts`` names the one it corrects).
    Records are never edited or deleted.
    """

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(max_length=120, unique=True)
    subject = models.CharField(max_length=120, db_index=True,
                               help_text="What it counts: its key, or for a correction the key it corrects.")
    resource = models.CharField(max_length=16, choices=Resource.choices)
    team = models.ForeignKey("tenants.Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                             db_constraint=False)
    reservation = models.ForeignKey("provisioning.Reservation", null=True, blank=True, on_delete=models.DO_NOTHING,
                                    related_name="+", db_constraint=False)
    offering = models.ForeignKey("cloud.Offering", null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                                 db_constraint=False)
    storage_class = models.ForeignKey("storage.StorageClass", null=True, blank=True, on_delete=models.PROTECT,
                                      related_name="+", db_constraint=False)
    region = models.ForeignKey("cloud.Region", on_delete=models.PROTECT, related_name="+", db_constraint=False)
    term = models.CharField(max_length=16, choices=RECORD_TERMS, blank=True)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    quantity = models.DecimalField(max_digits=20, decimal_places=6)
    unit_price = models.DecimalField(max_digits=14, decimal_places=8)
    amount = models.DecimalField(max_digits=18, decimal_places=6)
    currency = models.CharField(max_length=3, default="USD")
    adjusts = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="adjustments",
                                db_constraint=False)
    recorded_at = models.DateTimeField(auto_now_add=True)

    team_path = "team"

    class Meta:
        ordering = ["starts_at", "id"]
        indexes = [models.Index(fields=["tenant", "starts_at"], name="usage_tenant_start_idx"),
                   models.Index(fields=["starts_at"], name="usage_start_idx")]
        constraints = [
            models.CheckConstraint(condition=Q(resource__in=Resource.values), name="usage_resource_valid"),
            models.CheckConstraint(condition=Q(ends_at__gt=models.F("starts_at")), name="usage_interval_ordered"),
        ]

    def __str__(self):
        return f"{self.key}: {self.quantity} {RESOURCE_UNITS[self.resource]}"


class UsageRollup(TenantOwnedModel):
    """The ledger summed per hour or day, tenant, team, resource, offering or class, region and term: fast reads."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    period = models.CharField(max_length=4, choices=Period.choices)
    starts_at = models.DateTimeField()
    team = models.ForeignKey("tenants.Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                             db_constraint=False)
    resource = models.CharField(max_length=16, choices=Resource.choices)
    offering = models.ForeignKey("cloud.Offering", null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                                 db_constraint=False)
    storage_class = models.ForeignKey("storage.StorageClass", null=True, blank=True, on_delete=models.PROTECT,
                                      related_name="+", db_constraint=False)
    region = models.ForeignKey("cloud.Region", on_delete=models.PROTECT, related_name="+", db_constraint=False)
    term = models.CharField(max_length=16, blank=True)
    quantity = models.DecimalField(max_digits=22, decimal_places=6)
    amount = models.DecimalField(max_digits=20, decimal_places=6)
    currency = models.CharField(max_length=3, default="USD")

    team_path = "team"

    class Meta:
        ordering = ["starts_at"]
        # One row per period and dimensions: the meter deletes a period's rows and writes them again.
        indexes = [models.Index(fields=["tenant", "period", "starts_at"], name="rollup_tenant_period_idx"),
                   models.Index(fields=["period", "starts_at"], name="rollup_period_start_idx")]

    def __str__(self):
        return f"{self.tenant_id} {self.period} {self.starts_at:%Y-%m-%d %H:%M} {self.amount}"


class MeterState(models.Model):
    """Where the meter is: every hourly window before ``metered_until`` is in the ledger (one row)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    metered_until = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"metered until {self.metered_until}"



class SpotPrice(models.Model):
    """
    The spot market's price of an offering in a region from ``at`` until the next row (billing.spot):
    history is kept, so what spot work ran is billed at the prices of its time.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    offering = models.ForeignKey("cloud.Offering", on_delete=models.CASCADE, related_name="+")
    region = models.ForeignKey("cloud.Region", on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField()
    per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=4)
    utilization = models.DecimalField(max_digits=5, decimal_places=4, help_text="Held GPUs of the model / all, 0-1.")

    objects = CatalogueQuerySet.as_manager()  # public, as the price book is

    class Meta:
        ordering = ["-at"]
        indexes = [models.Index(fields=["offering", "region", "at"], name="spot_price_at_idx")]

    def __str__(self):
        return f"{self.offering_id} {self.per_gpu_hour} at {self.at:%Y-%m-%d %H:%M}"

from billing.budget_models import Budget, BudgetCrossing  # noqa: E402 -- the app's models, one module each
from billing.commitment_models import Commitment  # noqa: E402
from billing.credit_models import CreditGrant  # noqa: E402
from billing.invoice_models import Invoice, InvoiceCounter, InvoiceLine  # noqa: E402

__all__ = ["Budget", "BudgetCrossing", "Commitment", "CreditGrant", "Invoice", "InvoiceCounter", "InvoiceLine",
           "MeterState", "Price", "SpotPrice", "UsageRecord", "UsageRollup"]
