"""Commitments (docs/billing.md, "Commitments"): N GPUs of an offering in a region for 1-36 months at a rate."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from tenants.scoping import TeamOwnedModel


class Commitment(TeamOwnedModel):
    """
    ``gpus`` GPUs of ``offering`` in ``region`` held for the tenant (or one team) from ``starts_at``
    for ``months`` at ``rate`` per GPU-hour, the price book's reserved price when it was made and
    fixed for the term. Its capacity is ``reservation`` (a committed reservation, placed by the
    scheduler as reserved work): billed at the rate for every hour it holds the GPUs, used or not.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=63)
    offering = models.ForeignKey("cloud.Offering", on_delete=models.PROTECT, related_name="+")
    region = models.ForeignKey("cloud.Region", on_delete=models.PROTECT, related_name="+")
    gpus = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    months = models.PositiveSmallIntegerField(validators=[MinValueValidator(1), MaxValueValidator(36)])
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    rate = models.DecimalField(max_digits=12, decimal_places=6, help_text="Per GPU-hour, for the whole term.")
    currency = models.CharField(max_length=3, default="USD")
    reservation = models.OneToOneField("provisioning.Reservation", on_delete=models.PROTECT, related_name="+")
    cancelled_at = models.DateTimeField(null=True, blank=True, help_text="Set only when cancelled before its start.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-starts_at"]
        constraints = [
            models.CheckConstraint(condition=Q(gpus__gte=1), name="commitment_gpus_positive"),
            models.CheckConstraint(condition=Q(months__gte=1, months__lte=36), name="commitment_months_1_36"),
            models.CheckConstraint(condition=Q(ends_at__gt=F("starts_at")), name="commitment_interval_ordered"),
            models.CheckConstraint(condition=Q(rate__gte=0), name="commitment_rate_not_negative"),
        ]

    def __str__(self):
        return f"{self.name}: {self.gpus} GPUs for {self.months} months"
