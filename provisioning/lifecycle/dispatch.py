"""
Sending work to the workers: a step of one operation or of a batch (``enqueue``, after the
commit, under a dispatch token the operation then answers only), operations sent together
(``dispatch_together``), and start messages for reservations whose window is open
(``provision_when_due``, off the request's path through ``provisioning.lifecycle.start_sender``).
"""

from __future__ import annotations

import logging
import secrets
from collections import defaultdict
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from cloud.choices import NodeState
from provisioning import task_names
from provisioning.choices import OperationState
from provisioning.lifecycle.start_sender import StartSender
from provisioning.lifecycle.steps import PIPELINES
from provisioning.models import Operation

log = logging.getLogger(__name__)
N = NodeState


UNFINISHED = [OperationState.PENDING, OperationState.RUNNING]
# Bare-metal nodes that failed or are held cannot take the reservation: it is placed again.
LOST_NODE_STATES = {N.SUSPECT, N.QUARANTINED, N.REFERENCE_UNAVAILABLE, N.FAULTY, N.REPAIR, N.MAINTENANCE}


def pipeline_of(operation: Operation) -> list:
    kind = operation.reservation.offering.kind if operation.reservation_id else None
    return PIPELINES[(operation.kind, kind)]


def enqueue(operations: Operation | str | list, step: str, countdown: float = 0) -> None:
    """
    Send ``step`` of the operation (or of a batch of operations at that step: one message for
    them all) to the workers, after the commit, under a new dispatch token: the operations then
    answer only this message (an older one, redelivered, is skipped).
    """
    batch = operations if isinstance(operations, list) else [operations]
    ids = [str(getattr(operation, "pk", operation)) for operation in batch]
    if not ids:
        return
    token = secrets.token_hex(8)
    Operation.objects.filter(pk__in=ids).update(dispatch=token)
    together = _sent_together.get()
    if together is not None and not countdown:
        together.append(token)  # no message carries them until dispatch_together sends them with the others
        return
    carried = ids if isinstance(operations, list) else ids[0]
    transaction.on_commit(lambda: task_names.send(task_names.OPERATION_STEP, (carried, step, token),
                                                  countdown=countdown))


_sent_together: ContextVar[list | None] = ContextVar("operations_sent_together", default=None)


@contextmanager
def dispatch_together():
    """
    The operations ``enqueue`` sends now (not later) while this is open go out together when it
    closes: one message for those at the same step, STARTS_PER_TASK at most -- reservations whose
    windows end (or open) at the same tick are cleaned (or provisioned) as batches. Only what was
    committed goes: an operation whose transaction rolled back kept no token of its own.
    """
    tokens: list = []
    reset = _sent_together.set(tokens)
    try:
        yield
    finally:
        _sent_together.reset(reset)
        by_step = defaultdict(list)
        for pk, step in Operation.objects.filter(dispatch__in=tokens).order_by("pk").values_list("pk", "step"):
            by_step[step].append(pk)
        for step, ids in by_step.items():
            for first in range(0, len(ids), STARTS_PER_TASK):
                enqueue(ids[first:first + STARTS_PER_TASK], step)


# Reservations started by one task: a scheduler cycle places hundreds at once, and one message
# per reservation cost it more than the placing did; a few per message still spread over workers.
STARTS_PER_TASK = 8


def provision_when_due(reservations) -> None:
    """After the commit that scheduled them, start provisioning those whose window is open now."""
    soon = timezone.now() + timedelta(seconds=1)
    due = [str(r.pk) for r in reservations if r.starts_at and r.starts_at <= soon]
    if due:
        transaction.on_commit(lambda: START_SENDER.send(due))


def _send_starts(reservation_ids: list[str]) -> None:
    """
    The start messages, on the sender's thread (provisioning.lifecycle.start_sender) after the commit. A
    broker that refuses them costs a few seconds -- the tick starts every scheduled reservation
    whose time has come -- not an error for the request (or the cycle) whose reservations exist.
    """
    try:
        _publish_starts(reservation_ids)
    except Exception:  # noqa: BLE001 -- anything the broker's client raises; the tick makes up for it
        log.warning("Could not send the start of %d reservations; the lifecycle tick starts them.",
                    len(reservation_ids), exc_info=True)


# Looks _send_starts up when it sends, so that a test may stand in for the broker.
START_SENDER = StartSender(lambda reservation_ids: _send_starts(reservation_ids),
                           linger_s=settings.MERIDIAN_START_LINGER_MS / 1000, batch=STARTS_PER_TASK)


def _publish_starts(reservation_ids: list[str]) -> None:
    with current_app.producer_or_acquire() as producer:  # one connection for the lot
        for first in range(0, len(reservation_ids), STARTS_PER_TASK):
            task_names.send(task_names.RESERVATION_START_MANY, (reservation_ids[first:first + STARTS_PER_TASK],),
                            producer=producer)
