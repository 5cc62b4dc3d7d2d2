"""
A volume's step: bring its backend to what its state asks -- made (``creating``), grown
(``resizing``), removed (``deleting``) -- then move the state on. Safe to run twice or after a
worker died anywhere in it: every driver call is idempotent by the volume's backend reference,
and the state moves on only from the state the step read (a compare-and-set), so a second run
finds the work done and the state moved, or does the same call again and moves it.

The reconcile (``storage_reconcile``, a beat task) sends again the step of volumes left in flight
(their worker lost), detaches what ended reservations held, and removes from the backends what no
live volume owns (a volume deleted in the database while its backend call never ran).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from security.audit import audit_record
from storage import dispatch
from storage.choices import IN_FLIGHT, StorageKind
from storage.choices import VolumeState as V
from storage.drivers import StorageDriverError, driver_for
from storage.models import StorageClass, Volume, VolumeSnapshot
from storage.mounts import tenant_networks
from storage.moves import moves_resend
from storage.services import attachments_release_ended

log = logging.getLogger(__name__)


class TryAgain(Exception):
    """A transient backend error: the task retries the step later."""


def volume_converge(volume_id) -> str:
    """Run the volume's step; returns what it did (``done``, ``nothing``, ``failed``). TryAgain when transient."""
    volume = Volume.objects.select_related("storage_class", "source_snapshot__volume").filter(pk=volume_id).first()
    if volume is None or volume.state not in IN_FLIGHT:
        return "nothing"
    driver = driver_for(volume.storage_class.backend)
    try:
        if volume.state == V.CREATING:
            taken = volume.source_snapshot
            driver.create(ref=volume.backend_ref, kind=volume.storage_class.kind, size_gib=volume.target_gib,
                          source=(taken.volume.backend_ref, taken.backend_ref) if taken else None)
            if volume.storage_class.kind == StorageKind.OBJECT:  # reached by URL: limited to its networks now
                driver.export(ref=volume.backend_ref, clients=tenant_networks(volume.tenant_id))
            _move(volume, V.CREATING, state=V.AVAILABLE, size_gib=volume.target_gib)
        elif volume.state == V.RESIZING:
            driver.resize(ref=volume.backend_ref, size_gib=volume.target_gib)
            _move(volume, V.RESIZING, state=V.AVAILABLE, size_gib=volume.target_gib)
        else:
            driver.delete(ref=volume.backend_ref)
            with transaction.atomic():
                if _move(volume, V.DELETING, state=V.DELETED, wrapped_key="", key_destroyed_at=timezone.now()):
                    audit_record(actor=None, action="volume.crypto_erase", target=volume,
                                 after={"backend_ref": volume.backend_ref, "key": "destroyed"})
    except StorageDriverError as exc:
        return _failed_step(volume, exc)
    return "done"


def snapshot_converge(snapshot_id) -> str:
    """A snapshot's step: taken (``creating``) or removed (``deleting``), then its state moved on; TryAgain."""
    taken = VolumeSnapshot.objects.select_related("volume__storage_class").filter(pk=snapshot_id).first()
    if taken is None or taken.state not in (V.CREATING, V.DELETING):
        return "nothing"
    driver, ref = driver_for(taken.volume.storage_class.backend), taken.volume.backend_ref
    try:
        if taken.state == V.CREATING:
            driver.snapshot(ref=ref, snapshot=taken.backend_ref)
        else:
            driver.snapshot_delete(ref=ref, snapshot=taken.backend_ref)
    except StorageDriverError as exc:
        return _failed_step(taken, exc)
    after = V.AVAILABLE if taken.state == V.CREATING else V.DELETED
    VolumeSnapshot.objects.filter(pk=taken.pk, state=taken.state).update(
        state=after, state_reason="", attempts=0, updated_at=timezone.now())
    return "done"


def _move(volume: Volume, expected: str, **changes) -> bool:
    """Compare-and-set: move the volume on only if it is still ``expected``."""
    return bool(Volume.objects.filter(pk=volume.pk, state=expected).update(
        **changes, state_reason="", attempts=0, updated_at=timezone.now()))


def _failed_step(volume: Volume | VolumeSnapshot, exc: StorageDriverError) -> str:
    """Try again while transient and attempts are left; else the volume (or snapshot) fails, saying why."""
    model = type(volume)
    attempts = model.objects.filter(pk=volume.pk, state=volume.state).update(attempts=F("attempts") + 1)
    volume.refresh_from_db(fields=["attempts"])
    if exc.transient and attempts and volume.attempts < settings.MERIDIAN_STORAGE_ATTEMPTS:
        log.warning("Volume %s, %s: %s (attempt %d, tried again)", volume.pk, volume.state, exc, volume.attempts)
        raise TryAgain(str(exc)) from exc
    # A create that failed for good leaves the backend's part to the delete that follows (the
    # driver's delete is idempotent); a failed resize keeps the volume at its size.
    reason = f"{volume.get_state_display()} failed: {exc}"[:500]
    if volume.state == V.RESIZING:
        Volume.objects.filter(pk=volume.pk, state=V.RESIZING).update(
            state=V.AVAILABLE, target_gib=F("size_gib"), state_reason=reason, updated_at=timezone.now())
    else:
        model.objects.filter(pk=volume.pk, state=volume.state).update(
            state=V.FAILED, state_reason=reason, updated_at=timezone.now())
    return "failed"


def storage_reconcile(now=None) -> dict:
    """The beat's pass: lost steps sent again, ended reservations' attachments detached, orphans removed."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.MERIDIAN_STORAGE_STALE_SECONDS)
    lost = list(Volume.objects.filter(state__in=IN_FLIGHT, updated_at__lt=stale).values_list("pk", flat=True)[:500])
    for volume_id in lost:
        dispatch.send_now(volume_id)
    for snapshot_id in VolumeSnapshot.objects.filter(state__in=IN_FLIGHT, updated_at__lt=stale).values_list(
            "pk", flat=True)[:500]:
        dispatch.snapshot_send_now(snapshot_id)
    return {"resent": len(lost), "moves_resent": moves_resend(stale), "detached": attachments_release_ended(),
            "orphans": orphans_remove()}


def orphans_remove() -> int:
    """Remove what a backend holds that no volume owns any more (deleted, or never stored); returns how many."""
    removed = 0
    for backend in set(StorageClass.objects.values_list("backend", flat=True)):
        driver = driver_for(backend)
        held = driver.refs()
        owned = {f"vol-{pk}" for pk in Volume.objects.filter(storage_class__backend=backend).exclude(
            state=V.DELETED).values_list("pk", flat=True)}
        for ref in held - owned:
            try:
                driver.delete(ref=ref)
                removed += 1
            except StorageDriverError as exc:
                log.warning("Orphaned storage %s could not be removed: %s", ref, exc)
    return removed
