"""
The mounts of a reservation's attached volumes (registered with ``provisioning.mounts`` when the app
loads): each export is limited to the tenant's own networks -- the subnets of its VPCs -- before its
instances are told where to find it.
"""

from __future__ import annotations

from provisioning.choices import VPCState
from provisioning.models import VPC
from provisioning.mounts import Mount
from storage.choices import StorageKind
from storage.drivers import driver_for
from storage.models import VolumeAttachment


def reservation_mounts(reservation) -> list[Mount]:
    attachments = list(VolumeAttachment.objects.filter(reservation=reservation, detached_at__isnull=True)
                       .select_related("volume__storage_class"))
    if not attachments:
        return []
    clients = tenant_networks(reservation.tenant_id)
    mounts = []
    for attachment in attachments:
        volume = attachment.volume
        kind = volume.storage_class.kind
        export = driver_for(volume.storage_class.backend).export(
            ref=volume.backend_ref, clients=clients if kind == StorageKind.SHARED_FS else ())
        mounts.append(Mount(volume=volume.name, kind=kind, source=export.target, path=attachment.mount_path,
                            read_only=attachment.read_only, ref=volume.backend_ref))
    return mounts


def tenant_networks(tenant_id) -> tuple[str, ...]:
    """The tenant's own networks: the subnets of its VPCs (what its exports and buckets let in)."""
    return tuple(sorted(VPC.objects.filter(tenant_id=tenant_id).exclude(
        state__in=(VPCState.DELETING, VPCState.DELETED)).values_list("cidr", flat=True)))
