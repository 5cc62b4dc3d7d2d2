"""
Checkpoint tiers (docs/storage.md, "Checkpoint tiers"): a shared file system's checkpoints -- each
entry under its policy's prefix -- stay hot while they are among the newest ``keep_hot`` or were
used (written or restored) within ``demote_after_hours``; older ones move to the policy's cold
volume (an object bucket of the same tenant and region) and come back when restored, before the
hand-over of a reservation that asked for them.

This module holds the rules: the policy set, the scan that learns what the volume holds, the pass
that picks what to demote, a restore asked for, and a move's progress. The moves themselves are
``storage.moves``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from core.errors import Conflict, invalid
from provisioning.models import Reservation
from security.audit import audit_record
from storage.choices import CheckpointState as C
from storage.choices import StorageKind
from storage.choices import VolumeState as V
from storage.drivers import driver_for
from storage.models import Checkpoint, CheckpointPolicy, Volume
from storage.task_names import CHECKPOINT_MOVE, send


@transaction.atomic
def policy_set(*, actor, volume: Volume, cold_volume: Volume, prefix: str = "checkpoints/",
               demote_after_hours: int = 24, keep_hot: int = 2) -> CheckpointPolicy:
    """Set (or change) a file system's checkpoint policy; its cold volume: an object volume, same tenant and region."""
    if volume.storage_class.kind != StorageKind.SHARED_FS:
        raise invalid("volume", "Checkpoint tiers move a shared file system's checkpoints; this volume is a "
                                f"{volume.storage_class.get_kind_display().lower()}.", code="not_tierable")
    if cold_volume.tenant_id != volume.tenant_id:
        raise invalid("cold_volume", "Name a volume of your tenant.", code="does_not_exist")
    if cold_volume.storage_class.kind != StorageKind.OBJECT:
        raise invalid("cold_volume", "The cold tier is an object volume: create one (kind object) in "
                                     f"{volume.storage_class.region.slug} and name it.", code="not_object_storage")
    if cold_volume.storage_class.region_id != volume.storage_class.region_id:
        raise invalid("cold_volume", f"The cold volume is in {cold_volume.storage_class.region.slug}; the file "
                                     f"system in {volume.storage_class.region.slug}. Name one of the same region.",
                      code="region_mismatch")
    if cold_volume.state in (V.DELETING, V.DELETED):
        raise invalid("cold_volume", "That volume is being deleted: name another.", code="invalid_transition")
    policy, _ = CheckpointPolicy.objects.update_or_create(volume=volume, defaults={
        "tenant_id": volume.tenant_id, "cold_volume": cold_volume, "prefix": prefix.strip("/") + "/",
        "demote_after_hours": demote_after_hours, "keep_hot": keep_hot})
    audit_record(actor=actor, action="volume.checkpoint_policy", target=volume, after={
        "cold_volume": str(cold_volume.pk), "prefix": policy.prefix, "demote_after_hours": demote_after_hours,
        "keep_hot": keep_hot})
    return policy


def scan(policy: CheckpointPolicy, now: datetime | None = None) -> int:
    """Learn the volume's hot checkpoints from its backend (new, rewritten, removed); returns how many are hot."""
    now = now or timezone.now()
    volume = policy.volume
    listed = driver_for(volume.storage_class.backend).files(ref=volume.backend_ref, prefix=policy.prefix)
    found: dict[str, dict] = {}
    for key, info in listed.items():
        name = key[len(policy.prefix):].split("/", 1)[0]
        entry = found.setdefault(name, {"files": {}, "written_at": info.modified})
        entry["files"][key] = info.size
        entry["written_at"] = max(entry["written_at"], info.modified)
    with transaction.atomic():
        known = {c.name: c for c in Checkpoint.objects.select_for_update().filter(volume=volume)}
        for name, entry in found.items():
            size, checkpoint = sum(entry["files"].values()), known.get(name)
            if checkpoint is None:
                Checkpoint.objects.create(
                    tenant_id=volume.tenant_id, volume=volume, name=name, files=entry["files"], size_bytes=size,
                    written_at=entry["written_at"], last_used_at=entry["written_at"])
            elif checkpoint.state == C.HOT and checkpoint.files != entry["files"]:
                Checkpoint.objects.filter(pk=checkpoint.pk, state=C.HOT).update(
                    files=entry["files"], size_bytes=size, written_at=entry["written_at"],
                    last_used_at=max(checkpoint.last_used_at, entry["written_at"]))
        gone = [c.pk for name, c in known.items() if c.state == C.HOT and name not in found]
        Checkpoint.objects.filter(pk__in=gone, state=C.HOT).delete()  # the tenant removed them
        CheckpointPolicy.objects.filter(pk=policy.pk).update(scanned_at=now)
    return len(found)


def tier_pass(now: datetime | None = None) -> dict:
    """The beat's pass: scan each policy's volume and start demoting what it no longer keeps hot."""
    now = now or timezone.now()
    demoted = scanned = 0
    policies = CheckpointPolicy.objects.select_related("volume__storage_class").filter(volume__state=V.AVAILABLE)
    for policy in policies:
        scan(policy, now)
        scanned += 1
        hot = list(Checkpoint.objects.filter(volume=policy.volume, state=C.HOT).order_by("-written_at", "name"))
        unused_since = now - timedelta(hours=policy.demote_after_hours)
        for checkpoint in hot[policy.keep_hot:]:
            if checkpoint.last_used_at <= unused_since and _start(checkpoint, C.HOT, C.DEMOTING, now):
                demoted += 1
    return {"scanned": scanned, "demoting": demoted}


@transaction.atomic
def restore(*, actor, checkpoint: Checkpoint, reservation: Reservation | None = None) -> Checkpoint:
    """
    Bring a cold checkpoint back to its volume (``restoring`` until it is there); with a
    reservation, its hand-over waits for it. One that is hot or on its way back already is left as
    it is (the reservation noted); one being demoted is a 409 until it is cold.
    """
    checkpoint = Checkpoint.objects.select_for_update().get(pk=checkpoint.pk)
    if reservation is not None and reservation.tenant_id != checkpoint.tenant_id:
        raise invalid("reservation", "Name a reservation of your tenant.", code="does_not_exist")
    if checkpoint.state == C.DEMOTING:
        raise Conflict(f"{checkpoint.name} is being moved to the cold tier ({progress(checkpoint).percent}% done): "
                       "restore it once it is cold.", code="checkpoint_moving", current_state=checkpoint.state)
    if checkpoint.state == C.COLD:
        _start(checkpoint, C.COLD, C.RESTORING, timezone.now())
    if reservation is not None and checkpoint.state != C.HOT:
        Checkpoint.objects.filter(pk=checkpoint.pk).update(restore_for=reservation)
    audit_record(actor=actor, action="checkpoint.restore", target=checkpoint.volume, after={
        "checkpoint": checkpoint.name, "reservation": str(reservation.pk) if reservation else None})
    checkpoint.refresh_from_db()
    return checkpoint


def restores_pending(reservation) -> list[str]:
    """What a reservation's hand-over waits for: its checkpoints still on their way back (provisioning asks)."""
    waiting = Checkpoint.objects.filter(restore_for=reservation, state=C.RESTORING)
    return [f"the restore of checkpoint {c.name} ({progress(c).percent}%)" for c in waiting.only(
        "name", "size_bytes", "moved_bytes", "move_started_at", "state")]


@dataclass(frozen=True)
class Progress:
    percent: int
    moved_bytes: int
    size_bytes: int
    eta: datetime | None  # None: not moving, or too early to tell


def progress(checkpoint: Checkpoint, now: datetime | None = None) -> Progress:
    """How far a move is, and when it should end at the rate it has gone so far."""
    size, moved = checkpoint.size_bytes, min(checkpoint.moved_bytes, checkpoint.size_bytes)
    if checkpoint.state not in (C.DEMOTING, C.RESTORING):
        return Progress(100, size, size, None)
    percent = int(moved * 100 / size) if size else 0
    now = now or timezone.now()
    elapsed = (now - checkpoint.move_started_at).total_seconds() if checkpoint.move_started_at else 0
    eta = now + timedelta(seconds=(size - moved) * elapsed / moved) if moved and elapsed > 0 else None
    return Progress(percent, moved, size, eta)


def _start(checkpoint: Checkpoint, expected: str, state: str, now: datetime) -> bool:
    """Compare-and-set the checkpoint into a move, and send its step once that commits."""
    moved = Checkpoint.objects.filter(pk=checkpoint.pk, state=expected).update(
        state=state, state_reason="", moved_bytes=0, cursor_file=0, cursor_chunk=0, move_started_at=now,
        attempts=0, updated_at=now)
    if moved:
        checkpoint_id = str(checkpoint.pk)
        transaction.on_commit(lambda: send(CHECKPOINT_MOVE, (checkpoint_id,)))
    return bool(moved)
