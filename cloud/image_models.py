"""The image catalogue: what instances boot (cloud.models re-exports it for Django)."""

from __future__ import annotations

import uuid

from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from cloud.choices import OfferingKind


class ImageQuerySet(models.QuerySet):
    def visible_to(self, principal, action="view"):
        """
        Staff see every image (platform admins change them); a tenant's principals see the public
        images and their tenant's own (deleted ones no more), and change only their tenant's own.
        """
        if principal is None:
            return self.none()
        if principal.is_platform:
            return self.all() if (action == "view" or principal.is_platform_admin) else self.none()
        if principal.tenant is None:
            return self.none()
        own = Q(tenant_id=principal.tenant.pk)
        if action == "view":
            return self.filter(own | Q(tenant__isnull=True)).exclude(state=Image.State.DELETED)
        return self.filter(own)


class Image(models.Model):
    """
    What an instance boots (a Glance-like catalogue): a bare-metal OS, a VM disk or a container
    image, public (the platform's) or a tenant's own, available in some regions. Instances of a
    reservation that names none get the default of their offering's kind.
    """

    class State(models.TextChoices):
        IMPORTING = "importing", "Importing"
        ACTIVE = "active", "Active"
        DEPRECATED = "deprecated", "Deprecated (no new reservations)"
        DELETED = "deleted", "Deleted"

    class Architecture(models.TextChoices):
        X86_64 = "x86_64", "x86-64"
        AARCH64 = "aarch64", "Arm64"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", null=True, blank=True, on_delete=models.CASCADE,
                               related_name="images", help_text="The tenant whose image it is; empty: public.")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=OfferingKind.choices,
                            help_text="What it boots: bare_metal (an OS), vm (a disk) or container.")
    os = models.CharField(max_length=64, help_text="e.g. ubuntu-24.04")
    cuda_version = models.CharField(max_length=16, blank=True)
    driver_version = models.CharField(max_length=32, blank=True)
    architecture = models.CharField(max_length=16, choices=Architecture.choices, default=Architecture.X86_64)
    size_bytes = models.BigIntegerField(validators=[MinValueValidator(1)])
    sha256 = models.CharField(max_length=64, help_text="The image's SHA-256, 64 hex digits.")
    source_url = models.CharField(max_length=500, help_text="Where a driver fetches it (https://, or a registry "
                                                            "reference for a container image).")
    regions = models.JSONField(default=list, help_text="Slugs of the regions that hold it.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE)
    login_user = models.CharField(max_length=32, default="ubuntu", help_text="The user one logs in as.")
    is_default = models.BooleanField(default=False, help_text="The default of its kind (public images only).")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ImageQuerySet.as_manager()

    class Meta:
        ordering = ["kind", "name"]
        constraints = [
            models.UniqueConstraint(fields=["name"], condition=Q(tenant__isnull=True), name="public_image_name_unique"),
            models.UniqueConstraint(fields=["tenant", "name"], condition=Q(tenant__isnull=False),
                                    name="tenant_image_name_unique"),
            models.UniqueConstraint(fields=["kind"], condition=Q(is_default=True), name="one_default_image_per_kind"),
            models.CheckConstraint(condition=Q(is_default=False) | Q(tenant__isnull=True),
                                   name="default_image_is_public"),
        ]

    def __str__(self):
        return self.name
