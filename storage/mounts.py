"""
The mounts of a reservation's attached volumes (registered with ``provisioning.mounts`` when the app
loads): each export is limited to the tenant's own networks -- the subnets of its VPCs -- before its
instances are told where to find it. And the check of it for the VPC isolation report: who each of
the tenant's file systems and buckets lets in, as its backend holds it now.
"""

from __future__ import annotations

from provisioning.choices import VPCState
from provisioning.models import VPC
from provisioning.mounts import Mount
from storage.choices import StorageKind, VolumeState
from storage.drivers import StorageDriverError, driver_for
from storage.models import Volume, VolumeAttachment


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


def export_report(tenant_id) -> list[dict]:
    """
    Each of the tenant's file systems and buckets with what its backend lets in now: how many of the
    tenant's networks, and how many clients that are not the tenant's (counted, never named: they
    could be another tenant's subnets). ``ok`` when none is foreign.
    """
    networks = set(tenant_networks(tenant_id))
    volumes = list(Volume.objects.filter(tenant_id=tenant_id, state=VolumeState.AVAILABLE,
                                         storage_class__kind__in=(StorageKind.SHARED_FS, StorageKind.OBJECT))
                   .select_related("storage_class").order_by("name"))
    held: dict[str, dict | str] = {}
    for backend in {v.storage_class.backend for v in volumes}:
        try:
            held[backend] = driver_for(backend).exports(
                refs={v.backend_ref for v in volumes if v.storage_class.backend == backend})
        except StorageDriverError as exc:
            held[backend] = str(exc)
    rows = []
    for volume in volumes:
        row = {"volume": str(volume.pk), "name": volume.name, "kind": volume.storage_class.kind}
        exports = held[volume.storage_class.backend]
        if isinstance(exports, str):
            rows.append({**row, "checked": False, "error": exports})
            continue
        clients = set(exports.get(volume.backend_ref, ()))
        foreign = clients - networks
        rows.append({**row, "checked": True, "tenant_networks": len(clients & networks),
                     "foreign_clients": len(foreign), "open_to_all": "*" in clients or "0.0.0.0/0" in clients,
                     "ok": not foreign})
    return rows
