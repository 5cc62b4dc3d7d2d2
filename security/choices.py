"""Choices of the security records."""

from django.db import models


class TrustAnchorKind(models.TextChoices):
    ROOT = "root", "Root"
    INTERMEDIATE = "intermediate", "Intermediate"
