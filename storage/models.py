"""
Storage as a product of its own: the classes the platform sells per region (priced per GiB-month),
the tenant's volumes and file systems, and their attachments to reservations. Every volume has its
own data key, wrapped by the project's key ring; deleting the volume destroys the key (crypto-erase).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import F, Q

from cloud.models import CatalogueQuerySet
from storage.choices import CheckpointState, StorageKind, VolumeState
from tenants.scoping import TeamOwnedModel, TenantOwnedModel


class StorageClass(models.Model):
    """One kind of storage in one region at a price: what a volume is made of."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=StorageKind.choices)
    region = models.ForeignKey("cloud.Region", on_delete=models.PROTECT, related_name="storage_classes")
    price_per_gib_month = models.DecimalField(max_digits=8, decimal_places=4, validators=[MinValueValidator(0)])
    min_gib = models.PositiveIntegerField(default=1)
    max_gib = models.PositiveIntegerField(default=1024 * 1024)
    backend = models.CharField(max_length=32, default="simulated", help_text="The driver that serves it.")
    is_active = models.BooleanField(default=True, help_text="Off: no new volumes (existing ones stay).")

    objects = CatalogueQuerySet.as_manager()

    class Meta:
        ordering = ["region__slug", "kind", "slug"]
        verbose_name_plural = "storage classes"
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=StorageKind.values), name="storage_class_kind_valid"),
            models.CheckConstraint(condition=Q(min_gib__gte=1, max_gib__gte=F("min_gib")),
                                   name="storage_class_sizes_ordered"),
        ]

    def __str__(self):
        return self.slug


class Volume(TeamOwnedModel):
    """A tenant's block volume, shared file system or bucket: outlives the reservations it serves."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=63)
    storage_class = models.ForeignKey(StorageClass, on_delete=models.PROTECT, related_name="volumes")
    size_gib = models.PositiveIntegerField(help_text="Its size now (a resize in flight: see target_gib).")
    target_gib = models.PositiveIntegerField(help_text="The size asked for; equal to size_gib when settled.")
    state = models.CharField(max_length=16, choices=VolumeState.choices, default=VolumeState.CREATING)
    state_reason = models.CharField(max_length=500, blank=True)
    # The volume's data key (32 random bytes, hex), encrypted by the project's key ring; emptied
    # when the volume is deleted, which leaves what the backend still holds unreadable.
    wrapped_key = models.TextField(blank=True)
    key_destroyed_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Times its step failed for a while (a transient driver error) before it succeeded or gave up.
    attempts = models.PositiveSmallIntegerField(default=0)
    # Restored from a snapshot: its create step makes it as a copy of that snapshot.
    source_snapshot = models.ForeignKey("storage.VolumeSnapshot", null=True, blank=True, on_delete=models.PROTECT,
                                        related_name="restored_volumes")

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["state", "updated_at"], name="volume_in_flight_idx")]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], condition=~Q(state=VolumeState.DELETED),
                                    name="volume_name_unique_live",
                                    violation_error_message="This tenant already has a volume with this name."),
            models.CheckConstraint(condition=Q(state__in=VolumeState.values), name="volume_state_valid"),
            models.CheckConstraint(condition=Q(size_gib__gte=1, target_gib__gte=F("size_gib")),
                                   name="volume_sizes_only_grow"),
        ]

    def __str__(self):
        return f"{self.name} ({self.state})"

    @property
    def backend_ref(self) -> str:
        """What the backend calls it: its id, so every driver call is idempotent by it."""
        return f"vol-{self.pk}"


class VolumeSnapshot(TenantOwnedModel):
    """
    A point-in-time copy of a volume, kept by its backend (a fileset snapshot, a pool volume's
    clone), until deleted; a new volume is restored from it. Its states are a volume's.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    volume = models.ForeignKey(Volume, on_delete=models.PROTECT, related_name="snapshots")
    name = models.CharField(max_length=63)
    size_gib = models.PositiveIntegerField(help_text="The volume's size when it was taken.")
    state = models.CharField(max_length=16, choices=VolumeState.choices, default=VolumeState.CREATING)
    state_reason = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    attempts = models.PositiveSmallIntegerField(default=0)

    team_path = "volume__team"

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["state", "updated_at"], name="snapshot_in_flight_idx")]
        constraints = [
            models.UniqueConstraint(fields=["volume", "name"], condition=~Q(state=VolumeState.DELETED),
                                    name="snapshot_name_unique_live",
                                    violation_error_message="This volume already has a snapshot with this name."),
            models.CheckConstraint(condition=Q(state__in=VolumeState.values), name="snapshot_state_valid"),
        ]

    def __str__(self):
        return f"{self.name} ({self.state})"

    @property
    def backend_ref(self) -> str:
        return f"snap-{self.pk}"


class VolumeAttachment(TenantOwnedModel):
    """
    A volume attached to a reservation, read-only or read-write, until detached (by the tenant, or
    when the reservation ends). The database holds the rules: a volume is attached to a reservation
    at most once at a time, and an exclusive one (block) to one reservation at a time.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    volume = models.ForeignKey(Volume, on_delete=models.CASCADE, related_name="attachments")
    reservation = models.ForeignKey("provisioning.Reservation", on_delete=models.CASCADE,
                                    related_name="volume_attachments")
    read_only = models.BooleanField(default=False)
    exclusive = models.BooleanField(help_text="A block volume: one reservation at a time.")
    mount_path = models.CharField(max_length=200)
    attached_at = models.DateTimeField(auto_now_add=True)
    detached_at = models.DateTimeField(null=True, blank=True)

    team_path = "volume__team"

    class Meta:
        ordering = ["-attached_at"]
        constraints = [
            models.UniqueConstraint(fields=["volume", "reservation"], condition=Q(detached_at__isnull=True),
                                    name="attachment_once_per_reservation"),
            models.UniqueConstraint(fields=["volume"], condition=Q(detached_at__isnull=True, exclusive=True),
                                    name="attachment_exclusive_once"),
        ]

    def __str__(self):
        return f"{self.volume_id} -> {self.reservation_id}"


class StorageUsageSample(TenantOwnedModel):
    """
    GiB a tenant (and team) held in one storage class over ``seconds`` before ``at``: what storage
    is billed by (GiB-hours), sampled every MERIDIAN_STORAGE_USAGE_SECONDS (``storage.usage``).
    """

    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField()
    team = models.ForeignKey("tenants.Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    storage_class = models.ForeignKey(StorageClass, on_delete=models.PROTECT, related_name="+")
    gib = models.PositiveBigIntegerField()
    seconds = models.PositiveIntegerField()

    class Meta:
        indexes = [models.Index(fields=["tenant", "at"], name="storage_usage_tenant_at_idx")]

    def __str__(self):
        return f"{self.tenant_id} {self.gib} GiB at {self.at:%Y-%m-%d %H:%M}"


class CheckpointPolicy(TenantOwnedModel):
    """
    How a volume's checkpoints (each entry under ``prefix``) are tiered: the newest ``keep_hot`` stay
    on it; an older one unused (not written, not restored) for ``demote_after_hours`` moves to
    ``cold_volume``, an object volume of the same tenant and region, until it is restored.
    """

    volume = models.OneToOneField(Volume, on_delete=models.CASCADE, related_name="checkpoint_policy")
    cold_volume = models.ForeignKey(Volume, on_delete=models.PROTECT, related_name="+")
    prefix = models.CharField(max_length=200, default="checkpoints/")
    demote_after_hours = models.PositiveIntegerField(default=24)
    keep_hot = models.PositiveSmallIntegerField(default=2)
    scanned_at = models.DateTimeField(null=True, blank=True)

    team_path = "volume__team"

    def __str__(self):
        return f"{self.volume_id}: keep {self.keep_hot}, demote after {self.demote_after_hours} h"


class Checkpoint(TenantOwnedModel):
    """
    One checkpoint of a volume (a directory or file under its policy's prefix), where its data is,
    and the progress of a move: ``cursor_file``/``cursor_chunk`` say where a move goes on from,
    so a move cut short (a worker killed) goes on from its last recorded chunk.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    volume = models.ForeignKey(Volume, on_delete=models.CASCADE, related_name="checkpoints")
    name = models.CharField(max_length=255)
    state = models.CharField(max_length=16, choices=CheckpointState.choices, default=CheckpointState.HOT)
    state_reason = models.CharField(max_length=500, blank=True)
    files = models.JSONField(default=dict, help_text="Its files: the key in the volume -> bytes.")
    size_bytes = models.PositiveBigIntegerField(default=0)
    written_at = models.DateTimeField()
    last_used_at = models.DateTimeField()
    moved_bytes = models.PositiveBigIntegerField(default=0)
    cursor_file = models.PositiveIntegerField(default=0)
    cursor_chunk = models.PositiveIntegerField(default=0)
    move_started_at = models.DateTimeField(null=True, blank=True)
    moved_at = models.DateTimeField(null=True, blank=True)
    # A restore asked for with a reservation: its hand-over waits until the checkpoint is hot.
    restore_for = models.ForeignKey("provisioning.Reservation", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    attempts = models.PositiveSmallIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    team_path = "volume__team"

    class Meta:
        ordering = ["-written_at"]
        indexes = [models.Index(fields=["state", "updated_at"], name="checkpoint_moving_idx")]
        constraints = [
            models.UniqueConstraint(fields=["volume", "name"], name="checkpoint_name_unique"),
            models.CheckConstraint(condition=Q(state__in=CheckpointState.values), name="checkpoint_state_valid"),
        ]

    def __str__(self):
        return f"{self.name} ({self.state})"
