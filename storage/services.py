"""
The storage operations (docs/storage.md): create, grow, delete, attach and detach a tenant's
volumes. Each checks and records its change in one transaction -- audited, quota-checked under the
tenant's lock as reservations are -- and leaves the backend's part to the volume's step
(``storage.steps``), sent when the change commits.
"""

from __future__ import annotations

import re
import secrets

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from cloud.choices import OfferingKind
from core.errors import Conflict, Forbidden, Unavailable, invalid
from provisioning.choices import ReservationState
from provisioning.models import Reservation
from provisioning.services import team_for
from provisioning.transitions import TERMINAL_STATES
from security.audit import audit_record
from security.audit import snapshot as audit_snapshot
from security.crypto import encrypt
from storage import checkpoints, dispatch
from storage.choices import ATTACHABLE, COUNTED, NAME, StorageKind
from storage.choices import VolumeState as V
from storage.drivers import StorageDriverError, driver_for
from storage.models import Checkpoint, StorageClass, Volume, VolumeAttachment, VolumeSnapshot
from tenants.choices import QuotaResource
from tenants.models import Tenant
from tenants.quotas import quota_check

# A reservation whose instances are made: they mount what was attached before it started.
STARTED = frozenset({ReservationState.PROVISIONING, ReservationState.ACTIVE, ReservationState.RELEASING})
AUDITED = ["name", "storage_class", "size_gib", "target_gib", "state", "team"]
NAME_MAX = Volume._meta.get_field("name").max_length


@transaction.atomic
def volume_create(*, actor, storage_class: StorageClass, name: str, size_gib: int, team=None,
                  snapshot: VolumeSnapshot | None = None) -> Volume:
    """
    A volume of ``storage_class`` in the actor's tenant (for ``team`` when given), ``creating``
    until its backend has it -- a copy of ``snapshot`` when given (of the same class, at least its
    size). A size outside the class's range or a class off sale is a 400, a name taken a 409, over
    the storage quota a 409 with the numbers.
    """
    if actor.tenant is None:
        raise Forbidden("Volumes are made inside a tenant; choose one with the X-Meridian-Tenant header.")
    team = team_for(actor, team)
    _check_name(name)
    if snapshot is not None:
        _check_restorable(snapshot, storage_class, size_gib)
    if not storage_class.is_active:
        raise invalid("storage_class", f"{storage_class.name} is no longer sold: choose another class.",
                      code="storage_class_unavailable")
    _check_size(storage_class, size_gib)
    tenant = Tenant.objects.select_for_update().get(pk=actor.tenant.pk)  # quota checks in turn
    if Volume.objects.filter(tenant=tenant, name=name).exclude(state=V.DELETED).exists():
        raise Conflict(f"You already have a volume named '{name}'.", code="name_taken")
    _check_quota(tenant, team, size_gib, storage_class.kind)
    volume = Volume.objects.create(
        tenant=tenant, team=team, name=name, storage_class=storage_class, size_gib=size_gib, target_gib=size_gib,
        state=V.CREATING, wrapped_key=encrypt(secrets.token_hex(32)), created_by=actor.user, source_snapshot=snapshot)
    audit_record(actor=actor, action="volume.create", target=volume, after={
        **audit_snapshot(volume, AUDITED), "source_snapshot": str(snapshot.pk) if snapshot else None})
    dispatch.converge_on_commit(volume)
    return volume


@transaction.atomic
def volume_resize(*, actor, volume: Volume, size_gib: int) -> Volume:
    """Grow an available volume to ``size_gib`` (never shrink): ``resizing`` until its backend has grown it."""
    volume = _locked(volume)
    if volume.state != V.AVAILABLE:
        raise Conflict(f"The volume is '{volume.state}': it can grow once it is available.",
                       code="invalid_transition", current_state=volume.state)
    if size_gib <= volume.size_gib:
        raise invalid("size_gib", f"A volume only grows: give more than its {volume.size_gib} GiB.",
                      code="size_not_larger")
    _check_size(volume.storage_class, size_gib)
    tenant = Tenant.objects.select_for_update().get(pk=volume.tenant_id)
    _check_quota(tenant, volume.team, size_gib - volume.size_gib, volume.storage_class.kind)
    before = audit_snapshot(volume, AUDITED)
    volume.target_gib, volume.state, volume.state_reason = size_gib, V.RESIZING, ""
    volume.save(update_fields=["target_gib", "state", "state_reason", "updated_at"])
    audit_record(actor=actor, action="volume.resize", target=volume, before=before,
                 after=audit_snapshot(volume, AUDITED))
    dispatch.converge_on_commit(volume)
    return volume


@transaction.atomic
def volume_delete(*, actor, volume: Volume) -> Volume:
    """
    Ask for the volume to go: 409 while it is attached or busy. It is ``deleting`` until its backend
    has removed it; then its data key is destroyed (crypto-erase), and that is audited too.
    """
    volume = _locked(volume)
    if volume.state not in (V.AVAILABLE, V.FAILED):
        raise Conflict(f"The volume is '{volume.state}': it can be deleted once it is available or failed.",
                       code="invalid_transition", current_state=volume.state)
    attached = list(VolumeAttachment.objects.filter(volume=volume, detached_at__isnull=True)
                    .values_list("reservation__name", flat=True)[:5])
    if attached:
        raise Conflict(f"The volume is attached to {', '.join(attached)}: detach it first.", code="volume_attached")
    kept = list(volume.snapshots.exclude(state=V.DELETED).values_list("name", flat=True)[:5])
    if kept:
        raise Conflict(f"The volume has snapshots ({', '.join(kept)}): delete them first, or restore one to a new "
                       "volume to keep it.", code="volume_has_snapshots")
    before = audit_snapshot(volume, AUDITED)
    volume.state, volume.state_reason = V.DELETING, ""
    volume.save(update_fields=["state", "state_reason", "updated_at"])
    audit_record(actor=actor, action="volume.delete", target=volume, before=before,
                 after=audit_snapshot(volume, AUDITED))
    dispatch.converge_on_commit(volume)
    return volume


@transaction.atomic
def volume_attach(*, actor, volume: Volume, reservation: Reservation, read_only: bool = False,
                  mount_path: str = "", restore: list[str] | tuple = ()) -> VolumeAttachment:
    """
    Attach an available block volume or file system to a reservation of the same tenant in its
    region: a block volume to one reservation at a time, a file system to many. Its instances
    get it as a disk (VMs) or a mount (bare metal, containers). The cold checkpoints named in
    ``restore`` come back first: the reservation's hand-over waits for them.
    """
    volume = _locked(volume)
    if reservation.tenant_id != volume.tenant_id:  # the views look both up in the actor's tenant
        raise invalid("reservation", "Name a reservation of your tenant.", code="does_not_exist")
    if volume.storage_class.kind not in ATTACHABLE:
        raise invalid("volume", f"A {volume.storage_class.get_kind_display().lower()} is not attached to "
                                "reservations.", code="not_attachable")
    if volume.state != V.AVAILABLE:
        raise Conflict(f"The volume is '{volume.state}': it can be attached once it is available.",
                       code="invalid_transition", current_state=volume.state)
    if reservation.state in TERMINAL_STATES:
        raise Conflict(f"The reservation is '{reservation.state}': attach to one that has not ended.",
                       code="invalid_transition", current_state=reservation.state)
    if reservation.state in STARTED:
        # Its instances are made already: what they mount was written into them then.
        raise Conflict(f"{reservation.name} is '{reservation.state}': its instances are made, and mount what was "
                       "attached before they started. Attach to it before it starts, or to a new reservation.",
                       code="reservation_started", current_state=reservation.state)
    region = volume.storage_class.region.slug
    if region not in _regions_of(reservation):
        raise invalid("reservation", f"The volume is in {region}; the reservation runs in "
                                     f"{', '.join(_regions_of(reservation))}. Attach a volume of its region.",
                      code="region_mismatch")
    exclusive = volume.storage_class.kind == StorageKind.BLOCK
    if exclusive and reservation.offering.kind == OfferingKind.CONTAINER:
        raise invalid("reservation", "Containers mount file systems, not block devices: attach a shared file "
                                     "system, or this volume to a VM or bare-metal reservation.",
                      code="not_attachable")
    holder = VolumeAttachment.objects.filter(volume=volume, detached_at__isnull=True).select_related("reservation")
    if exclusive and (current := holder.first()) is not None:
        raise Conflict(f"A block volume is attached to one reservation at a time: it is attached to "
                       f"{current.reservation.name}.", code="volume_attached")
    if holder.filter(reservation=reservation).exists():
        raise Conflict("The volume is attached to this reservation already.", code="already_attached")
    try:
        with transaction.atomic():  # the database holds both rules when two attaches race
            attachment = VolumeAttachment.objects.create(
                tenant_id=volume.tenant_id, volume=volume, reservation=reservation, read_only=read_only,
                exclusive=exclusive, mount_path=mount_path or f"/mnt/{volume.name}")
    except IntegrityError:
        raise Conflict("The volume was attached meanwhile.", code="volume_attached") from None
    audit_record(actor=actor, action="volume.attach", target=volume,
                 after={"reservation": str(reservation.pk), "read_only": read_only,
                        "mount_path": attachment.mount_path})
    found = {c.name: c for c in Checkpoint.objects.filter(volume=volume, name__in=list(restore))}
    if missing := sorted(set(restore) - set(found)):
        raise invalid("restore", f"{volume.name} has no checkpoint {', '.join(missing)}.",
                      code="checkpoint_not_found")
    for name in sorted(found):
        checkpoints.restore(actor=actor, checkpoint=found[name], reservation=reservation)
    return attachment


@transaction.atomic
def volume_detach(*, actor, volume: Volume, reservation: Reservation) -> VolumeAttachment:
    """Detach the volume from the reservation (its instances lose it at their next start)."""
    volume = _locked(volume)
    attachment = VolumeAttachment.objects.select_for_update().filter(
        volume=volume, reservation=reservation, detached_at__isnull=True).first()
    if attachment is None:
        raise Conflict("The volume is not attached to this reservation.", code="not_attached")
    attachment.detached_at = timezone.now()
    attachment.save(update_fields=["detached_at"])
    audit_record(actor=actor, action="volume.detach", target=volume, after={"reservation": str(reservation.pk)})
    return attachment


@transaction.atomic
def snapshot_create(*, actor, volume: Volume, name: str) -> VolumeSnapshot:
    """
    Take a snapshot of an available block volume or file system (``creating`` until its backend
    has it). It counts against the storage quotas at the volume's size, as a volume does.
    """
    _check_name(name)
    volume = _locked(volume)
    if volume.storage_class.kind not in ATTACHABLE:
        raise invalid("volume", f"A {volume.storage_class.get_kind_display().lower()} has no snapshots.",
                      code="not_snapshottable")
    if volume.state != V.AVAILABLE:
        raise Conflict(f"The volume is '{volume.state}': a snapshot is taken once it is available.",
                       code="invalid_transition", current_state=volume.state)
    live = volume.snapshots.exclude(state=V.DELETED)
    if live.filter(name=name).exists():
        raise Conflict(f"{volume.name} already has a snapshot named '{name}'.", code="name_taken")
    if live.count() >= settings.MERIDIAN_STORAGE_SNAPSHOTS_PER_VOLUME:
        raise Conflict(f"{volume.name} keeps {settings.MERIDIAN_STORAGE_SNAPSHOTS_PER_VOLUME} snapshots at most: "
                       "delete an older one first.", code="too_many_snapshots")
    tenant = Tenant.objects.select_for_update().get(pk=volume.tenant_id)
    _check_quota(tenant, volume.team, volume.size_gib, volume.storage_class.kind)
    taken = VolumeSnapshot.objects.create(tenant_id=volume.tenant_id, volume=volume, name=name,
                                          size_gib=volume.size_gib, created_by=actor.user)
    audit_record(actor=actor, action="volume.snapshot", target=volume,
                 after={"snapshot": str(taken.pk), "name": name, "size_gib": volume.size_gib})
    dispatch.snapshot_converge_on_commit(taken)
    return taken


@transaction.atomic
def snapshot_delete(*, actor, snapshot: VolumeSnapshot) -> VolumeSnapshot:
    """Delete a snapshot no creating volume is being restored from (409 otherwise)."""
    snapshot = VolumeSnapshot.objects.select_for_update().select_related("volume").get(pk=snapshot.pk)
    if snapshot.state not in (V.AVAILABLE, V.FAILED):
        raise Conflict(f"The snapshot is '{snapshot.state}': it can be deleted once it is available or failed.",
                       code="invalid_transition", current_state=snapshot.state)
    if snapshot.restored_volumes.filter(state=V.CREATING).exists():
        raise Conflict("A volume is being restored from this snapshot: delete it once that volume is available.",
                       code="snapshot_in_use")
    snapshot.state, snapshot.state_reason = V.DELETING, ""
    snapshot.save(update_fields=["state", "state_reason", "updated_at"])
    audit_record(actor=actor, action="volume.snapshot_delete", target=snapshot.volume,
                 after={"snapshot": str(snapshot.pk), "name": snapshot.name})
    dispatch.snapshot_converge_on_commit(snapshot)
    return snapshot


def volume_credentials(*, actor, volume: Volume) -> dict:
    """New access keys to an object volume's bucket, and to nothing else (shown once; the older pair goes)."""
    volume = _locked(volume)
    if volume.storage_class.kind != StorageKind.OBJECT:
        raise invalid("volume", "Access keys open object storage; this volume is mounted, not reached by key.",
                      code="not_object_storage")
    if volume.state != V.AVAILABLE:
        raise Conflict(f"The volume is '{volume.state}': keys are issued once it is available.",
                       code="invalid_transition", current_state=volume.state)
    try:
        keys = driver_for(volume.storage_class.backend).credentials(ref=volume.backend_ref)
    except StorageDriverError as exc:
        raise Unavailable(f"The object store did not issue keys: {exc} Try again shortly.",
                          code="backend_unavailable") from exc
    audit_record(actor=actor, action="volume.credentials", target=volume,
                 after={"access_key_id": keys["access_key_id"]})
    return keys


def attachments_release_ended() -> int:
    """Detach every attachment whose reservation ended (the system's part of a release); returns how many."""
    ended = VolumeAttachment.objects.filter(detached_at__isnull=True, reservation__state__in=TERMINAL_STATES)
    with transaction.atomic():
        rows = list(ended.select_for_update(of=("self",)).select_related("volume"))
        now = timezone.now()
        for attachment in rows:
            attachment.detached_at = now
            attachment.save(update_fields=["detached_at"])
            audit_record(actor=None, action="volume.detach", target=attachment.volume,
                         after={"reservation": str(attachment.reservation_id), "reason": "reservation ended"})
    return len(rows)


# The quota of each kind of storage class beside the overall one (scratch lives with an instance).
KIND_QUOTAS = {StorageKind.BLOCK: QuotaResource.BLOCK_GIB, StorageKind.SHARED_FS: QuotaResource.SHARED_FS_GIB,
               StorageKind.OBJECT: QuotaResource.OBJECT_GIB}


def storage_in_use(tenant_id, team_id=None, kind: str | None = None) -> int:
    """GiB that count against storage quotas (of one kind, when given): every volume not deleted, at its asked size."""
    volumes = Volume.objects.filter(tenant_id=tenant_id, state__in=COUNTED)
    if team_id is not None:
        volumes = volumes.filter(team_id=team_id)
    snapshots = VolumeSnapshot.objects.filter(tenant_id=tenant_id, state__in=COUNTED)
    if team_id is not None:
        snapshots = snapshots.filter(volume__team_id=team_id)
    if kind is not None:
        volumes = volumes.filter(storage_class__kind=kind)
        snapshots = snapshots.filter(volume__storage_class__kind=kind)
    return (volumes.aggregate(n=Sum("target_gib"))["n"] or 0) + (snapshots.aggregate(n=Sum("size_gib"))["n"] or 0)


def _check_name(name: str) -> None:
    if not re.fullmatch(NAME, name or ""):
        raise invalid("name", "Use lower-case letters, digits and dashes, starting and ending with a letter or digit "
                              "(e.g. checkpoints).", code="invalid")


def _check_restorable(snapshot: VolumeSnapshot, storage_class: StorageClass, size_gib: int) -> None:
    if snapshot.state != V.AVAILABLE:
        raise invalid("snapshot", f"The snapshot is '{snapshot.state}': restore it once it is available.",
                      code="snapshot_not_available")
    source = snapshot.volume.storage_class
    if storage_class.pk != source.pk:
        raise invalid("storage_class", f"A snapshot is restored into its own class ({source.slug}).",
                      code="class_mismatch")
    if size_gib < snapshot.size_gib:
        raise invalid("size_gib", f"The snapshot holds {snapshot.size_gib:,} GiB: restore it to at least that.",
                      code="size_out_of_range")


def _check_size(storage_class: StorageClass, size_gib: int) -> None:
    if not storage_class.min_gib <= size_gib <= storage_class.max_gib:
        raise invalid("size_gib", f"{storage_class.name} volumes are {storage_class.min_gib:,} to "
                                  f"{storage_class.max_gib:,} GiB.", code="size_out_of_range")


def _check_quota(tenant: Tenant, team, asked: int, kind: str) -> None:
    """The overall storage quota, then the one of the class's kind (tenant's and team's each)."""
    def in_use(kind=None):
        return lambda limit: storage_in_use(tenant.pk, team.pk if limit.scope == "team" and team else None, kind)

    quota_check(tenant=tenant, team=team, resource=QuotaResource.STORAGE_GIB, asked=asked, in_use=in_use())
    if kind in KIND_QUOTAS:
        quota_check(tenant=tenant, team=team, resource=KIND_QUOTAS[kind], asked=asked, in_use=in_use(kind))


def _locked(volume: Volume) -> Volume:
    return Volume.objects.select_for_update(of=("self",)).select_related("storage_class__region", "team").get(
        pk=volume.pk)


def _regions_of(reservation: Reservation) -> list[str]:
    """Where the reservation runs: its region once placed, else the regions it may be placed in."""
    return [reservation.region.slug] if reservation.region_id else list(reservation.regions)
