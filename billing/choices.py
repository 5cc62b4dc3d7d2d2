"""Billing's fixed vocabularies."""

from django.db import models

from provisioning.choices import BillingTerm


class Resource(models.TextChoices):
    """What a usage record counts."""

    GPU = "gpu", "GPU time"
    STORAGE = "storage", "Storage"
    ADDRESS = "address", "Public addresses"


# A usage record's term: the reservation's billing term, or "committed" for a commitment's capacity.
COMMITTED = "committed"
RECORD_TERMS = [*BillingTerm.choices, (COMMITTED, "Committed")]


# The unit each resource's quantity is in, and the unit its price is per.
RESOURCE_UNITS = {Resource.GPU: "GPU-seconds", Resource.STORAGE: "GiB-seconds", Resource.ADDRESS: "address-seconds"}
PRICE_UNITS = {Resource.GPU: "GPU-hour", Resource.STORAGE: "GiB-hour", Resource.ADDRESS: "address-hour"}


class Period(models.TextChoices):
    HOUR = "hour", "Hour"
    DAY = "day", "Day"


class DocumentKind(models.TextChoices):
    INVOICE = "invoice", "Invoice"
    CREDIT_NOTE = "credit_note", "Credit note"


class DocumentState(models.TextChoices):
    DRAFT = "draft", "Draft"
    FINAL = "final", "Final"


class LineKind(models.TextChoices):
    USAGE = "usage", "Usage"
    SLA_CREDIT = "sla_credit", "SLA credit"
    ADJUSTMENT = "adjustment", "Adjustment"
    PREPAID = "prepaid", "Prepaid credit"
