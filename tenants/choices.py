"""Roles, scopes and quota resources of tenants and their people."""

from django.db import models


class TenantRole(models.TextChoices):
    """A user's role in one tenant; each role includes the rights of those below it."""

    OWNER = "owner", "Owner"
    ADMIN = "admin", "Admin"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"

    @property
    def rank(self) -> int:
        return _TENANT_RANK[self]

    def at_least(self, other: "TenantRole") -> bool:
        return self.rank >= TenantRole(other).rank


_TENANT_RANK = {TenantRole.VIEWER: 0, TenantRole.MEMBER: 1, TenantRole.ADMIN: 2, TenantRole.OWNER: 3}


class TeamRole(models.TextChoices):
    """A user's role in one team of a tenant."""

    ADMIN = "admin", "Team admin"
    MEMBER = "member", "Team member"


class PlatformRole(models.TextChoices):
    """Platform staff roles, separate from any tenant role."""

    NONE = "", "None"
    ADMIN = "platform_admin", "Platform admin"
    APPROVER = "platform_approver", "Platform approver"


class TokenScope(models.TextChoices):
    """What an API token may do at most; its user's current role narrows it further."""

    READ = "read", "Read"
    READ_WRITE = "read_write", "Read and write"


class QuotaResource(models.TextChoices):
    """What a quota limits."""

    GPUS = "gpus", "GPUs"
    VPCS = "vpcs", "VPCs"
    INSTANCES = "instances", "Concurrent instances"
    STORAGE_GIB = "storage_gib", "Storage (GiB)"
    BLOCK_GIB = "block_gib", "Block volumes (GiB)"
    SHARED_FS_GIB = "shared_fs_gib", "Shared file systems (GiB)"
    OBJECT_GIB = "object_gib", "Object storage (GiB)"


# What a person reads for a kind where its words alone would mislead ("reservation.evicted" reads
# "Reservation evicted"; the console and the notice say preempted).
KIND_LABELS = {
    "reservation.evicted": "Reservation preempted",
    "reservation.reclaim": "Reservation reclaimed",
    "reservation.gpus_idle": "GPUs idle",
    "reservation.no_show": "Released as a no-show",
    "reservation.no_show_warning": "No-show warning",
    "reservation.no_show_cleared": "No-show warning withdrawn",
    "reservation.hardware_replaced": "Replacement ready",
    "gpu.back": "GPU back",
    "node.back": "Server back",
    "node.drained": "Server drained",
    "node.suspect": "Server not answering",
}


def kind_label(kind: str) -> str:
    """A notification's kind in words: 'reservation.ending_soon' reads 'Reservation ending soon'."""
    return KIND_LABELS.get(kind) or kind.replace(".", " ").replace("_", " ").capitalize()
