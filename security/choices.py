"""Choices of the security records."""

from django.db import models


class TrustAnchorKind(models.TextChoices):
    ROOT = "root", "Root"
    INTERMEDIATE = "intermediate", "Intermediate"


class TrustAnchorPurpose(models.TextChoices):
    DEVICE = "device", "GPU device certificates"
    RIM = "rim", "Reference integrity manifests"


class CertificateStatus(models.TextChoices):
    GOOD = "good", "Good"
    REVOKED = "revoked", "Revoked"
    UNKNOWN = "unknown", "Unknown"
