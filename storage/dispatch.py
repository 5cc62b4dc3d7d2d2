"""Sending a volume's step to a worker once the change that needs it commits (before, the worker could not see it)."""

from __future__ import annotations

from django.db import transaction

from storage.task_names import SNAPSHOT_CONVERGE, VOLUME_CONVERGE, send


def converge_on_commit(volume) -> None:
    volume_id = str(volume.pk)
    transaction.on_commit(lambda: send(VOLUME_CONVERGE, (volume_id,)))


def send_now(volume_id) -> None:
    send(VOLUME_CONVERGE, (str(volume_id),))


def snapshot_converge_on_commit(snapshot) -> None:
    snapshot_id = str(snapshot.pk)
    transaction.on_commit(lambda: send(SNAPSHOT_CONVERGE, (snapshot_id,)))


def snapshot_send_now(snapshot_id) -> None:
    send(SNAPSHOT_CONVERGE, (str(snapshot_id),))
