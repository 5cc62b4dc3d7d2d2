"""Storage's fixed vocabularies."""

from django.db import models

# A volume's or snapshot's name: lower-case letters, digits and dashes (a DNS label), checked by the
# services whatever door the request came through.
NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class StorageKind(models.TextChoices):
    """What a storage class sells (docs/storage.md)."""

    SCRATCH = "scratch", "Local NVMe scratch (lives with the instance)"
    BLOCK = "block", "Network block volume (one reservation at a time)"
    SHARED_FS = "shared_fs", "Shared file system (many reservations of the tenant)"
    OBJECT = "object", "Object and archive storage"


class VolumeState(models.TextChoices):
    """
    Where a volume's backend is. ``creating``, ``resizing`` and ``deleting`` are in flight: the
    volume's step (``storage.steps``) brings the backend there and moves it on; ``failed`` says why
    in ``state_reason``. Attachments are apart: an ``available`` volume may be attached.
    """

    CREATING = "creating", "Creating"
    AVAILABLE = "available", "Available"
    RESIZING = "resizing", "Resizing"
    DELETING = "deleting", "Deleting"
    DELETED = "deleted", "Deleted"
    FAILED = "failed", "Failed"


IN_FLIGHT = frozenset({VolumeState.CREATING, VolumeState.RESIZING, VolumeState.DELETING})
# Sizes that count against storage quotas: everything not gone.
COUNTED = frozenset({VolumeState.CREATING, VolumeState.AVAILABLE, VolumeState.RESIZING, VolumeState.FAILED})
# Kinds a reservation attaches (scratch lives with an instance; object storage is reached by URL and key).
ATTACHABLE = frozenset({StorageKind.BLOCK, StorageKind.SHARED_FS})


class CheckpointState(models.TextChoices):
    """
    Where a checkpoint's data is: on the volume (``hot``), in the policy's cold volume (``cold``), or
    on its way (``demoting``, ``restoring``: a move in flight, with its progress).
    """

    HOT = "hot", "Hot"
    DEMOTING = "demoting", "Moving to the cold tier"
    COLD = "cold", "Cold"
    RESTORING = "restoring", "Restoring"


MOVING = frozenset({CheckpointState.DEMOTING, CheckpointState.RESTORING})
