"""Budgets (docs/billing.md, "Budgets"): a tenant's or team's monthly spending limit, thresholds, crossings."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from tenants.scoping import TeamOwnedModel


class Budget(TeamOwnedModel):
    """
    What a tenant (team empty) or one of its teams means to spend in a month: its members are told
    once each time the month's spend crosses a threshold (percent of ``amount``); with ``hard_stop``
    no new work is admitted once the month's spend reaches the amount.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    amount = models.DecimalField(max_digits=14, decimal_places=2, validators=[MinValueValidator(0.01)])
    currency = models.CharField(max_length=3, default="USD")
    thresholds = models.JSONField(default=list, help_text="Percents of the amount, ascending, e.g. [50, 80, 100].")
    hard_stop = models.BooleanField(default=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["team__name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant"], condition=Q(team__isnull=True), name="budget_one_per_tenant",
                                    violation_error_message="This tenant has a budget already: change it."),
            models.UniqueConstraint(fields=["team"], condition=Q(team__isnull=False), name="budget_one_per_team",
                                    violation_error_message="This team has a budget already: change it."),
            models.CheckConstraint(condition=Q(amount__gt=0), name="budget_amount_positive"),
        ]

    def __str__(self):
        return f"{self.amount} {self.currency} a month"


class BudgetCrossing(models.Model):
    """A threshold crossed in a month: recorded once, so its notice goes out once."""

    id = models.BigAutoField(primary_key=True)
    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="crossings")
    month = models.DateField()
    threshold = models.PositiveSmallIntegerField()
    crossed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["budget", "month", "threshold"], name="budget_crossing_once")]

    def __str__(self):
        return f"{self.threshold} % in {self.month:%Y-%m}"
