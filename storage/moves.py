"""
A checkpoint's move between its volume (hot) and its policy's cold volume, chunk by chunk through
the two backends' drivers (``storage.data``). Each chunk is read, written at its own place, and
recorded (the cursor and the bytes moved) with a compare-and-set on the cursor, so:

- a worker killed anywhere goes on, on the next run, from the last recorded chunk (a chunk written
  but not recorded is written again: the same bytes at the same place);
- two runs of the same move never both record a chunk: the second finds the cursor moved and stops;
- only when every chunk is over are the source's files removed, then the state moves on.

A run works for ``MERIDIAN_STORAGE_MOVE_SLICE_SECONDS`` and sends the rest to the queue, so a long
move never holds a worker for hours and its progress is visible all along.
"""

from __future__ import annotations

import logging
import math
import time

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from storage.choices import CheckpointState as C
from storage.drivers import StorageDriverError, driver_for
from storage.models import Checkpoint
from storage.task_names import CHECKPOINT_MOVE, send

log = logging.getLogger(__name__)


class TryAgain(Exception):
    """A transient backend error: the task runs the move again later."""


def cold_key(checkpoint: Checkpoint, key: str) -> str:
    """Where a hot file lies in the cold volume: under the hot volume's reference, so one bucket serves many."""
    return f"{checkpoint.volume.backend_ref}/{key}"


def checkpoint_move(checkpoint_id, *, slice_s: float | None = None) -> str:
    """Go on with the checkpoint's move: ``done``, ``continues``, ``stopped``, ``nothing``, ``failed``; TryAgain."""
    checkpoint = (Checkpoint.objects.select_related("volume__storage_class",
                                                    "volume__checkpoint_policy__cold_volume__storage_class")
                  .filter(pk=checkpoint_id).first())
    if checkpoint is None or checkpoint.state not in (C.DEMOTING, C.RESTORING):
        return "nothing"
    hot, cold = checkpoint.volume, checkpoint.volume.checkpoint_policy.cold_volume
    hot_driver, cold_driver = driver_for(hot.storage_class.backend), driver_for(cold.storage_class.backend)
    demoting = checkpoint.state == C.DEMOTING
    if demoting:
        source, target = (hot_driver, hot.backend_ref, lambda k: k), (cold_driver, cold.backend_ref,
                                                                     lambda k: cold_key(checkpoint, k))
    else:
        source, target = (cold_driver, cold.backend_ref, lambda k: cold_key(checkpoint, k)), (
            hot_driver, hot.backend_ref, lambda k: k)
    deadline = time.monotonic() + (settings.MERIDIAN_STORAGE_MOVE_SLICE_SECONDS if slice_s is None else slice_s)
    try:
        finished = _copy(checkpoint, source, target, deadline)
        if not finished:
            return "stopped" if finished is None else _continue(checkpoint)
        source_driver, source_ref, source_key = source
        for key in checkpoint.files:
            source_driver.remove(ref=source_ref, key=source_key(key))
    except StorageDriverError as exc:
        return _failed(checkpoint, exc, target)
    now = timezone.now()
    changes = {"state": C.COLD if demoting else C.HOT, "moved_at": now, "moved_bytes": checkpoint.size_bytes,
               "attempts": 0, "state_reason": "", "updated_at": now}
    if not demoting:
        changes.update(last_used_at=now, restore_for=None)
    Checkpoint.objects.filter(pk=checkpoint.pk, state=checkpoint.state).update(**changes)
    return "done"


def _copy(checkpoint: Checkpoint, source, target, deadline: float) -> bool | None:
    """Copy from the cursor on: True when all is over, False when the slice ended, None when another run moved on."""
    chunk = settings.MERIDIAN_STORAGE_CHUNK_BYTES
    source_driver, source_ref, source_key = source
    target_driver, target_ref, target_key = target
    files = sorted(checkpoint.files.items())
    at_file, at_chunk = checkpoint.cursor_file, checkpoint.cursor_chunk
    while at_file < len(files):
        key, size = files[at_file]
        chunks = max(1, math.ceil(size / chunk))
        if at_chunk < chunks:
            data = source_driver.read_chunk(ref=source_ref, key=source_key(key), index=at_chunk, chunk=chunk)
            target_driver.write_chunk(ref=target_ref, key=target_key(key), index=at_chunk, chunk=chunk, data=data)
            next_file, next_chunk, moved = at_file, at_chunk + 1, len(data)
        else:
            target_driver.truncate(ref=target_ref, key=target_key(key), size=size)
            next_file, next_chunk, moved = at_file + 1, 0, 0
        recorded = Checkpoint.objects.filter(
            pk=checkpoint.pk, state=checkpoint.state, cursor_file=at_file, cursor_chunk=at_chunk).update(
            cursor_file=next_file, cursor_chunk=next_chunk, moved_bytes=F("moved_bytes") + moved,
            updated_at=timezone.now())
        if not recorded:
            return None
        at_file, at_chunk = next_file, next_chunk
        if at_file < len(files) and time.monotonic() > deadline:
            return False
    return True


def _continue(checkpoint: Checkpoint) -> str:
    send(CHECKPOINT_MOVE, (str(checkpoint.pk),))
    return "continues"


def _failed(checkpoint: Checkpoint, exc: StorageDriverError, target) -> str:
    Checkpoint.objects.filter(pk=checkpoint.pk, state=checkpoint.state).update(attempts=F("attempts") + 1)
    checkpoint.refresh_from_db(fields=["attempts"])
    if exc.transient and checkpoint.attempts < settings.MERIDIAN_STORAGE_ATTEMPTS:
        log.warning("Checkpoint %s, %s: %s (attempt %d, tried again)", checkpoint.pk, checkpoint.state, exc,
                    checkpoint.attempts)
        raise TryAgain(str(exc)) from exc
    # The move stops: the data is whole where it came from (the source is removed only at the end),
    # so the checkpoint goes back there and says why; what was copied so far is removed.
    back = C.HOT if checkpoint.state == C.DEMOTING else C.COLD
    if Checkpoint.objects.filter(pk=checkpoint.pk, state=checkpoint.state).update(
            state=back, state_reason=f"{checkpoint.get_state_display()} failed: {exc}"[:500], restore_for=None,
            cursor_file=0, cursor_chunk=0, updated_at=timezone.now()):
        target_driver, target_ref, target_key = target
        for key in checkpoint.files:
            try:
                target_driver.remove(ref=target_ref, key=target_key(key))
            except StorageDriverError as cleanup:
                log.warning("Part of checkpoint %s stays in %s: %s", checkpoint.pk, target_ref, cleanup)
    return "failed"


def moves_resend(stale_before) -> int:
    """Send again the moves nobody has advanced since ``stale_before`` (their worker lost); returns how many."""
    lost = list(Checkpoint.objects.filter(state__in=(C.DEMOTING, C.RESTORING), updated_at__lt=stale_before)
                .values_list("pk", flat=True)[:500])
    for checkpoint_id in lost:
        send(CHECKPOINT_MOVE, (str(checkpoint_id),))
    return len(lost)
