"""
The periodic tick (every few seconds): start what is due, release what ended, retry replacements
that wait for capacity, attest idle nodes, revalidate nodes waiting on a reference value, and
resume or fail what is stuck.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from cloud.choices import NodeState
from cloud.models import Node
from core.batches import FAILED, each_atomic
from provisioning import notices
from provisioning.allocations import allocations_archive
from provisioning.choices import InstanceState, OperationKind, OperationState
from provisioning.choices import ReservationState as R
from provisioning.lifecycle import dispatch as dispatching
from provisioning.lifecycle import operation_state, outcomes
from provisioning.lifecycle import release as releasing
from provisioning.lifecycle import start as starting
from provisioning.lifecycle import validate as validating
from provisioning.lifecycle.replacement import replacements_due, reservation_replace
from provisioning.lifecycle.steps import NodeFault
from provisioning.models import Instance, Operation, Reservation

log = logging.getLogger(__name__)
N = NodeState


#
# The periodic tick
#


def tick(*, now=None, limit: int = 200) -> dict:
    """
    Start due reservations, release ended ones, validate waiting nodes (and those held
    for reference values registered since), attest idle ones that are
    due (MERIDIAN_ATTESTATION_IDLE_INTERVAL, a few per tick), replace failed hardware that still
    waits for capacity (provisioning.lifecycle.replacement), resume or fail stuck work, tell teams whose
    reservations end soon.
    """
    now = now or timezone.now()
    report = {"started": 0, "expired": 0, "releases": 0, "validations": 0, "attestations": 0, "replacements": 0,
              "resumed": 0, "failed_stuck": 0, "ending_soon": 0, "errors": 0}

    def each(items, act, counter):
        # One bad item is logged and skipped: it must not stop the rest of the tick.
        for _item, outcome in each_atomic(items, act, what=f"lifecycle tick: {counter}"):
            if outcome is FAILED:
                report["errors"] += 1
            elif isinstance(outcome, str):
                report[outcome] += 1
            elif outcome:
                report[counter] += 1

    # What the tick starts, releases or resumes goes out in batches (dispatch_together).
    with dispatching.dispatch_together():
        each(Reservation.objects.filter(state=R.SCHEDULED, starts_at__lte=now, ends_at__gt=now).order_by("starts_at")
             .values_list("pk", flat=True)[:limit],
             lambda pk: starting.reservation_provision_start(pk, now=now) is not None, "started")
        each(Reservation.objects.filter(state__in=[R.SCHEDULED, R.PROVISIONING, R.ACTIVE], ends_at__lte=now)[:limit],
             lambda reservation: releasing.reservation_expire(reservation=reservation), "expired")
        live = Instance.objects.filter(reservation=OuterRef("pk"),
                                       state__in=[InstanceState.PROVISIONING, InstanceState.ACTIVE])
        cleaning = Operation.objects.filter(reservation=OuterRef("pk"), kind=OperationKind.RELEASE)
        each(Reservation.objects.filter(state=R.RELEASING, released_at__lte=now)
             .filter(Exists(live) | ~Exists(cleaning)).select_related("offering")[:limit],
             releasing.release_start, "releases")
        under_way = Operation.objects.filter(node=OuterRef("pk"), kind=OperationKind.VALIDATE,
                                             state__in=dispatching.UNFINISHED)
        each(Node.objects.filter(state=N.VALIDATING).exclude(Exists(under_way))[:limit],
             lambda node: validating.node_validate(actor=None, node=node), "validations")
        # Nodes held for want of reference values that staff registered since: validated (and attested) again.
        each(validating.nodes_held_for_references(limit), lambda node: validating.node_validate(actor=None, node=node),
             "validations")
        # Tenants without their hardware come before routine attestation of idle nodes (which holds a node back).
        each(replacements_due(now, limit),
             lambda pk: reservation_replace(pk, now=now) in ("started", "restored", "failed"), "replacements")
        each(validating.idle_nodes_due(now, limit=max(1, limit // 10)),
             lambda node: validating.node_attest(node) is not None, "attestations")
        stuck_before = now - settings.MERIDIAN_STUCK_AFTER
        each(Operation.objects.filter(state__in=dispatching.UNFINISHED, updated_at__lt=stuck_before)[:limit],
             lambda operation: "resumed" if _resume(operation) else "failed_stuck", "resumed")
    try:  # told once per reservation and end (provisioning.notices): a second tick finds them told
        with transaction.atomic():
            report["ending_soon"] = notices.reservations_ending_soon(now=now)
    except Exception:
        log.exception("lifecycle tick: the ending-soon notices failed")
        report["errors"] += 1
    report["archived"] = allocations_archive()  # by the clock, whatever ``now`` the tick was given
    return report


@transaction.atomic
def _resume(operation: Operation) -> bool:
    """A worker died with no redelivery: run the step again, or give up after the resume limit."""
    operation_state.operation_lock(operation)
    locked = Operation.objects.select_related("reservation__offering", "node").get(pk=operation.pk)
    if locked.is_finished:
        return True
    if locked.resumed < settings.MERIDIAN_RESUME_LIMIT:
        Operation.objects.filter(pk=locked.pk).update(resumed=locked.resumed + 1, updated_at=timezone.now())
        dispatching.enqueue(locked, locked.step)
        return True
    node = locked.node or next((i.node for i in operation_state.context(locked).instances), None)
    stuck_s = int(settings.MERIDIAN_STUCK_AFTER.total_seconds())
    message = f"{locked.step} made no progress in {stuck_s} s, {locked.resumed} times; given up."
    if node is None:
        operation_state.operation_close(locked, OperationState.FAILED, message)
        return False
    outcomes.FAILURES[locked.kind](locked, NodeFault(node, message, transient=False), message)
    return False
