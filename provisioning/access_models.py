"""
What an instance is reached and configured by: its addresses (``provisioning.addresses``) and its
config drive (``provisioning.cloud_init``); loaded with provisioning's models.
"""

import uuid

from django.db import models
from django.db.models import Q

from tenants.scoping import TenantOwnedModel


class AddressAssignment(TenantOwnedModel):
    """
    One address of an instance, from its region's private or public pool, from its assignment
    until its instance is cleaned (``released_at``). The database holds the rule: an address of a
    region has at most one live owner.
    """

    class Kind(models.TextChoices):
        PRIVATE = "private", "Private"
        PUBLIC = "public", "Public"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    instance = models.ForeignKey("provisioning.Instance", on_delete=models.CASCADE, related_name="addresses")
    region = models.CharField(max_length=50, help_text="The region's slug: its pools are its own.")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    address = models.GenericIPAddressField(protocol="IPv4")
    assigned_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["assigned_at"]
        constraints = [
            models.UniqueConstraint(fields=["region", "address"], condition=Q(released_at__isnull=True),
                                    name="address_one_live_owner"),
        ]
        indexes = [models.Index(fields=["region", "kind"], condition=Q(released_at__isnull=True),
                                name="address_live_by_pool")]

    def __str__(self):
        return f"{self.address} ({self.kind}, {self.region})"


class ConfigDrive(models.Model):
    """
    An instance's NoCloud config drive (``provisioning.cloud_init``): the ISO built once when it is
    first needed, so a retried step serves the same bytes, and the secret in the URL its BMC or
    hypervisor fetches it from (and the instance reports in and reads its notices with). Deleted
    once the instance is cleaned: the URL then answers 404.
    """

    instance = models.OneToOneField("provisioning.Instance", on_delete=models.CASCADE, primary_key=True,
                                    related_name="config_drive")
    token = models.CharField(max_length=64, unique=True, help_text="The URL's secret (URL-safe, 256 bits).")
    iso = models.BinaryField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"config drive of {self.instance_id}"
