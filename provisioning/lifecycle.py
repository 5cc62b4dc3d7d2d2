"""
From ``scheduled`` to ``active`` and back: provisioning, release (cleaning) and node validation
as operations of named steps (provisioning.steps), run by Celery tasks.

How a step runs (``operation_run_step``): the task names the operation and the step it expects;
a task whose step is already done (a redelivery after the commit) does nothing. The step calls
its drivers outside any transaction -- hardware does not roll back -- and then one transaction
records the outcome and enqueues the next step on commit. A worker killed between the driver
call and that commit leaves the step where it was: the redelivered task runs it again, and the
step finds the work done (steps check before they act). Transient driver errors retry with
backoff up to a limit; a failure for good marks the node faulty and re-queues the reservation
(it keeps its place), or fails it after MERIDIAN_PROVISION_FAILURES nodes -- unless its hardware
failed under it (provisioning.replacement): then only that attempt's units are placed again.
Reservations started together (``reservations_start``) go through their steps as a batch: one
message and one bookkeeping transaction per step for them all, each operation's history its own,
and an operation whose step must wait, retry or fail leaves the batch with a message of its own.
``tick`` (every few seconds) starts what is due, releases what ended, retries replacements that
wait for capacity, and resumes or fails what is stuck.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import defaultdict
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, Max, OuterRef, Q, Value
from django.db.models.functions import Concat
from django.utils import timezone

from cloud.choices import GPUState, Health, NodePool, NodeState, OfferingKind
from cloud.errors import Conflict
from cloud.models import GPU, Node
from cloud.services import node_transition
from cloud.transient import transient_database_error
from cloud.transitions import GPU_TRANSITIONS
from security.audit import audit_record, audit_record_many

from . import notices
from .allocations import allocation_end, allocations_archive
from .choices import InstanceState, OperationKind, OperationState, StepState
from .choices import ReservationState as R
from .drivers import NotYet, drivers_for
from .models import Allocation, Instance, Operation, Reservation, StepRun
from .network import ports_abandon
from .start_sender import StartSender
from .steps import PIPELINES, Context, NodeFault

log = logging.getLogger(__name__)
N = NodeState
UNFINISHED = [OperationState.PENDING, OperationState.RUNNING]
# Bare-metal nodes that failed or are held cannot take the reservation: it is placed again.
LOST_NODE_STATES = {N.SUSPECT, N.QUARANTINED, N.REFERENCE_UNAVAILABLE, N.FAULTY, N.REPAIR, N.MAINTENANCE}


def pipeline_of(operation: Operation) -> list:
    kind = operation.reservation.offering.kind if operation.reservation_id else None
    return PIPELINES[(operation.kind, kind)]


def _enqueue(operations: Operation | str | list, step: str, countdown: float = 0) -> None:
    """
    Send ``step`` of the operation (or of a batch of operations at that step: one message for
    them all) to the workers, after the commit, under a new dispatch token: the operations then
    answer only this message (an older one, redelivered, is skipped).
    """
    from .tasks import operation_step

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
    transaction.on_commit(lambda: operation_step.apply_async((carried, step, token), countdown=countdown))


_sent_together: ContextVar[list | None] = ContextVar("operations_sent_together", default=None)


@contextmanager
def dispatch_together():
    """
    The operations ``_enqueue`` sends now (not later) while this is open go out together when it
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
                _enqueue(ids[first:first + STARTS_PER_TASK], step)


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
    The start messages, on the sender's thread (provisioning.start_sender) after the commit. A
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
    from cloud.celery import app

    from .tasks import reservation_start_many

    with app.producer_or_acquire() as producer:  # one connection for the lot
        for first in range(0, len(reservation_ids), STARTS_PER_TASK):
            reservation_start_many.apply_async((reservation_ids[first:first + STARTS_PER_TASK],), producer=producer)


def reservations_start(reservation_ids: list[str]) -> int:
    """
    Start reservations placed together in one transaction (their rows read and written in a
    statement or two for them all); if that fails, each is started in its own, and one that fails
    then is logged and left to the tick while the others go on. The operations started go through
    their steps together: one message for those at the same first step. Returns how many started.

    A message that names fewer than STARTS_PER_TASK takes on others placed moments ago whose own
    messages are still queued (creates placed at once send one each): under a burst they are
    started in batches, and their messages, when they come, find them started.
    """
    reservation_ids = [str(pk) for pk in reservation_ids]
    also = _placed_just_now(exclude=reservation_ids, limit=STARTS_PER_TASK - len(reservation_ids))
    try:
        operations = _provision_start_many(reservation_ids, also=also)
    except Exception:
        log.warning("Starting %d reservations together failed; starting each alone.", len(reservation_ids),
                    exc_info=True)
        operations = []
        for reservation_id in reservation_ids + also:
            try:
                operations += _provision_start_many([reservation_id])
            except Exception:
                log.exception("Starting reservation %s failed; the lifecycle tick tries again.", reservation_id)
    started: dict[str, list[Operation]] = defaultdict(list)
    for operation in operations:
        started[operation.step].append(operation)
    # A worker lost before this (autocommitted) dispatch leaves them pending: the reaper resumes them.
    for step, batch in started.items():
        _enqueue(batch, step)
    return len(operations)


# A reservation placed this recently and not started has its start message on the way (or queued).
JUST_PLACED = timedelta(seconds=30)


def _placed_just_now(*, exclude: list[str], limit: int) -> list[str]:
    if limit <= 0:
        return []
    now = timezone.now()
    due = (Reservation.objects.filter(state=R.SCHEDULED, scheduled_at__gte=now - JUST_PLACED,
                                      starts_at__lte=now + timedelta(seconds=1))
           .exclude(pk__in=exclude).order_by("scheduled_at").values_list("pk", flat=True)[:limit])
    return [str(pk) for pk in due]


def _move_gpus(gpu_ids, source: str, target: str) -> int:
    assert target in GPU_TRANSITIONS[source], f"GPU {source} -> {target} is not in the table"
    return GPU.objects.filter(pk__in=list(gpu_ids), state=source).update(state=target)


def _move_reservation(reservation: Reservation, target: str, *, only_from, reason: str = "", **also) -> bool:
    """The reservation moves if it is still where this lifecycle expects it (a cancel may have won)."""
    from .services import _move

    try:
        _move(reservation, target, only_from=only_from, reason=reason, **also)
    except Conflict:
        return False
    return True


#
# Start provisioning
#


@transaction.atomic
def reservation_provision_start(reservation_id, *, now=None) -> Operation | None:
    """
    Begin provisioning a scheduled reservation whose window has opened: one instance per unit,
    its nodes (bare metal) or GPUs (whole GPUs on shared hosts) taken, the first step enqueued.
    None when it is not due, moved on, or its nodes are still being cleaned (the tick retries).
    """
    operations = _provision_start_many([reservation_id], now=now)
    for operation in operations:
        _enqueue(operation, operation.step)
    return operations[0] if operations else None


@transaction.atomic
def _provision_start_many(reservation_ids, *, now=None, also=()) -> list[Operation]:
    """
    ``reservation_provision_start`` for several reservations, their first steps not yet sent:
    each read, locked and written in one statement for them all (locks in key order). ``also``:
    more to start if no one else holds them (their locks skipped, not waited for, and taken after
    the others': this transaction never waits once it holds one of them, so closes no cycle).
    """
    now = now or timezone.now()
    rows = Reservation.objects.select_related("offering", "region").order_by("pk")
    named = list(rows.select_for_update(of=("self",)).filter(pk__in=list(reservation_ids)))
    extra = list(rows.select_for_update(of=("self",), skip_locked=True).filter(pk__in=list(also))) if also else []
    reservations = [r for r in named + extra if r.state == R.SCHEDULED and r.starts_at <= now + timedelta(seconds=1)]
    # Only what they hold now: an earlier attempt's allocations stay as history, ended.
    held = defaultdict(list)
    for allocation in (Allocation.objects.filter(reservation__in=reservations, ends_at__gt=now)
                       .select_related("gpu", "node").order_by("node__hostname", "gpu__index", "mem_lo")):
        held[allocation.reservation_id].append(allocation)
    scrubbing = _previous_tenant_still_there([a for allocations in held.values() for a in allocations])
    whole_gpus = {a.gpu_id for r in reservations if r.offering.kind != OfferingKind.BARE_METAL
                  and r.offering.slots_per_gpu == 1 for a in held[r.pk]}
    gpu_states = dict(GPU.objects.select_for_update().filter(pk__in=whole_gpus).order_by("pk")
                      .values_list("pk", "state")) if whole_gpus else {}
    ready, taking = [], set()
    for reservation in reservations:
        allocations = held[reservation.pk]
        nodes = {a.node_id: a.node for a in allocations}
        lost = [node for node in nodes.values() if node.state in LOST_NODE_STATES]
        if lost:
            _requeue(reservation, f"Node {lost[0].hostname} became {lost[0].state} before the start; "
                                  "placing the reservation again.")
            continue
        if any((a.gpu_id, a.mem_lo, a.mem_hi) in scrubbing for a in allocations):
            continue  # the memory is still being scrubbed after its previous tenant: the tick tries again
        offering = reservation.offering
        if offering.kind == OfferingKind.BARE_METAL:
            if any(node.state != N.AVAILABLE for node in nodes.values()):
                continue  # the previous tenant's cleaning is still running: the tick tries again
            for node in nodes.values():
                node_transition(actor=None, node=node, target=N.ALLOCATED, reason=f"Reservation {reservation.pk}.")
        elif offering.slots_per_gpu == 1:
            states = {gpu_states.get(a.gpu_id) for a in allocations}
            if GPUState.QUARANTINED in states:
                _requeue(reservation, "A GPU was quarantined before the start; placing the reservation again.")
                continue
            if states != {GPUState.AVAILABLE}:
                continue  # a GPU is still being scrubbed after its previous tenant
            taking |= {a.gpu_id for a in allocations}
        ready.append(reservation)
    if not ready:
        return []
    if taking:
        _move_gpus(taking, GPUState.AVAILABLE, GPUState.ALLOCATED)
    # Locked above and still scheduled: all of them move, or the transaction is undone.
    moved = Reservation.objects.filter(pk__in=[r.pk for r in ready], state=R.SCHEDULED).update(
        state=R.PROVISIONING, state_reason="Provisioning.", state_changed_at=now)
    if moved != len(ready):
        raise Conflict("A reservation moved on while provisioning started.", code="invalid_transition")
    operations = Operation.objects.bulk_create([
        Operation(tenant_id=r.tenant_id, reservation=r, kind=OperationKind.PROVISION,
                  step=PIPELINES[(OperationKind.PROVISION, r.offering.kind)][0].name) for r in ready])
    for reservation in ready:
        reservation.state, reservation.state_reason, reservation.state_changed_at = R.PROVISIONING, "Provisioning.", now
    _create_instances_many([(r, held[r.pk], operation) for r, operation in zip(ready, operations, strict=True)])
    audit_record_many(actor=None, action="reservation.provision", changes=[
        (r, {"state": R.PROVISIONING, "operation": str(operation.pk)}) for r, operation in zip(ready, operations,
                                                                                             strict=True)])
    return operations


def _previous_tenant_still_there(allocations: list) -> set:
    """
    The allocations' memory (gpu, mem_lo, mem_hi) that still belongs to an instance being cleaned
    (a slot's scrub has no other gate).
    """
    if not allocations:
        return set()
    busy = set()
    for devices in Instance.objects.filter(state=InstanceState.RELEASING, node_id__in={a.node_id for a in allocations}
                                           ).values_list("devices", flat=True):
        for d in devices:
            busy |= {(gpu, lo, hi) for gpu, lo, hi in ((a.gpu_id, a.mem_lo, a.mem_hi) for a in allocations)
                     if str(gpu) == d["gpu_id"] and lo < d["mem_hi"] and d["mem_lo"] < hi}
    return busy


def _create_instances(reservation: Reservation, allocations: list, operation: Operation) -> list[Instance]:
    return _create_instances_many([(reservation, allocations, operation)])


def _create_instances_many(starts: list[tuple[Reservation, list, Operation]]) -> list[Instance]:
    """One instance per unit: a bare-metal node, a VM's GPUs on one host, or a container's GPUs or slot."""
    # Serial numbers go on after earlier attempts' instances (a re-placed reservation keeps them).
    last = dict(Instance.objects.filter(reservation__in=[r for r, _, _ in starts]).values("reservation")
                .annotate(last=Max("index")).values_list("reservation", "last"))
    instances = []
    for reservation, allocations, operation in starts:
        offering = reservation.offering
        units: list[tuple] = []
        by_node: dict = {}
        for a in allocations:
            by_node.setdefault(a.node_id, []).append(a)
        for on_node in by_node.values():
            per_unit = len(on_node) if offering.kind == OfferingKind.BARE_METAL else (
                1 if offering.slots_per_gpu > 1 else offering.gpus_per_unit)
            units += [(on_node[0].node, on_node[i:i + per_unit]) for i in range(0, len(on_node), per_unit)]
        first = last[reservation.pk] + 1 if reservation.pk in last else 0

        def name(node, index, reservation=reservation, offering=offering):
            # A server is its node; a VM or pod is named for the host's hypervisor or kubelet.
            return node.hostname if offering.kind == OfferingKind.BARE_METAL else f"r{reservation.pk.hex[:12]}-{index}"

        instances += [
            Instance(tenant_id=reservation.tenant_id, team_id=reservation.team_id, reservation=reservation, node=node,
                     provisioned_by=operation, index=first + i, kind=offering.kind, name=name(node, first + i),
                     devices=[{"gpu_id": str(a.gpu_id), "index": a.gpu.index, "pci_bus_id": a.gpu.pci_bus_id,
                               "mem_lo": a.mem_lo, "mem_hi": a.mem_hi} for a in on_node])
            for i, (node, on_node) in enumerate(units)
        ]
    return Instance.objects.bulk_create(instances)


def _requeue(reservation: Reservation, reason: str) -> None:
    """
    Back to the queue keeping its place (submitted_at is unchanged), its capacity given back (the
    time it held stays in its allocations, and in its spend); the reason stays on it as its last
    re-placement's once the state has moved on.
    """
    now = timezone.now()
    allocation_end(reservation=reservation, at=now)
    _move_reservation(reservation, R.QUEUED, only_from={R.SCHEDULED, R.PROVISIONING}, reason=reason[:500],
                      starts_at=None, ends_at=None, region=None, **replaced(reservation, reason, now))


def replaced(reservation: Reservation, reason: str, now) -> dict:
    """The fields that record one more re-placement of ``reservation`` (what the tenant reads on it)."""
    return {"replacements": reservation.replacements + 1, "replaced_at": now, "replacement_reason": reason[:500]}


#
# Release (cleaning)
#


def release_start(reservation: Reservation) -> Operation:
    """
    Clean up after a reservation that is ``releasing`` (inside the caller's transaction): stop
    its provisioning, mark its instances releasing, take its nodes or GPUs into cleaning, and
    enqueue the first cleaning step. With no instances it is released at once.
    """
    Operation.objects.filter(reservation=reservation, kind=OperationKind.PROVISION, state__in=UNFINISHED).update(
        state=OperationState.CANCELLED, error="Stopped: the reservation was released.", finished_at=timezone.now())
    live = list(reservation.instances.filter(state__in=[InstanceState.PROVISIONING, InstanceState.ACTIVE]))
    return _clean(reservation, live)


def _clean(reservation: Reservation, instances: list[Instance]) -> Operation:
    offering = reservation.offering
    steps = PIPELINES[(OperationKind.RELEASE, offering.kind)]
    operation = Operation.objects.create(tenant_id=reservation.tenant_id, reservation=reservation,
                                         kind=OperationKind.RELEASE, step=steps[0].name)
    Instance.objects.filter(pk__in=[i.pk for i in instances]).update(state=InstanceState.RELEASING,
                                                                     released_by=operation)
    if offering.kind == OfferingKind.BARE_METAL:
        for node in Node.objects.filter(pk__in={i.node_id for i in instances}, state=N.ALLOCATED):
            node_transition(actor=None, node=node, target=N.RELEASING, reason=f"Cleaning after {reservation.pk}.")
    elif offering.slots_per_gpu == 1:
        _move_gpus({d["gpu_id"] for i in instances for d in i.devices}, GPUState.ALLOCATED, GPUState.SCRUBBING)
    if instances:
        _enqueue(operation, steps[0].name)
    else:
        _finish(operation)
    return operation


#
# Node validation (burn-in)
#


@transaction.atomic
def node_validate(*, actor, node: Node) -> Operation:
    """Validate a node (enrolment, after repair or maintenance): BMC, GPUs, burn-in -> available."""
    if node.state != N.VALIDATING:
        node = node_transition(actor=actor, node=node, target=N.VALIDATING, reason="Validation (burn-in).")
    running = Operation.objects.filter(node=node, kind=OperationKind.VALIDATE, state__in=UNFINISHED).first()
    if running:
        return running
    steps = PIPELINES[(OperationKind.VALIDATE, None)]
    operation = Operation.objects.create(node=node, kind=OperationKind.VALIDATE, step=steps[0].name)
    _enqueue(operation, steps[0].name)
    return operation


def node_attest(node: Node) -> Operation | None:
    """Attest an idle node again (it stays in the pool meanwhile); None when one is already under way."""
    if Operation.objects.filter(node=node, kind__in=[OperationKind.ATTEST, OperationKind.VALIDATE],
                                state__in=UNFINISHED).exists():
        return None
    steps = PIPELINES[(OperationKind.ATTEST, None)]
    operation = Operation.objects.create(node=node, kind=OperationKind.ATTEST, step=steps[0].name)
    _enqueue(operation, steps[0].name)
    return operation


def idle_nodes_due(now, limit: int):
    """Idle nodes (available bare metal, in-service shared hosts) with no passing attestation for a while."""
    from security.models import AttestationReport

    since = now - settings.MERIDIAN_ATTESTATION_IDLE_INTERVAL
    recent = AttestationReport.objects.filter(node_id=OuterRef("pk"), status=AttestationReport.Status.PASS,
                                              verified_at__gte=since)
    attesting = Operation.objects.filter(node=OuterRef("pk"), kind=OperationKind.ATTEST, state__in=UNFINISHED)
    return (Node.objects.filter(state__in=[N.AVAILABLE, N.IN_SERVICE]).exclude(Exists(recent))
            .exclude(Exists(attesting)).order_by("hostname")[:limit])


#
# Running steps
#


def operation_run_step(operation_ids, step: str, dispatch: str | None = None) -> str | dict[str, str]:
    """
    Run ``step`` of the operations that stand there: one operation id, or a batch sent under one
    dispatch token (reservations started together go through their steps together, their
    bookkeeping in one statement per step for them all). Then -- for a message that carries the
    operations' dispatch token -- the steps after it in the same task while
    MERIDIAN_STEP_CHAIN_SECONDS last (a task per step cost more than the steps of a VM); the next
    step is enqueued when the time is up. An operation whose step must wait, retry or fail leaves
    the batch with a message of its own. A redelivered chain (its worker was lost) carries the
    token still and goes on where each operation stands; an older message is skipped. Returns what
    happened last ("done", "skipped", "waiting", "retrying", "failed"): for one id, as a string;
    for a batch, by operation id. Drivers are called outside any transaction.
    """
    single = not isinstance(operation_ids, list | tuple)
    ids = [str(operation_ids)] if single else [str(pk) for pk in operation_ids]
    deadline = time.monotonic() + settings.MERIDIAN_STEP_CHAIN_SECONDS
    outcomes: dict[str, str] = {}
    chained: list[Chained] = []
    while True:
        chain = dispatch is not None and time.monotonic() < deadline
        if chained:
            ran = _run_batch([(link.context, link.run) for link in chained], dispatch, chain=chain)
        else:
            ran = _run_steps(ids, step, dispatch, chain=chain)
        chained = [outcome for outcome in ran.values() if isinstance(outcome, Chained)]
        outcomes.update({pk: outcome for pk, outcome in ran.items() if not isinstance(outcome, Chained)})
        if not chained:
            return outcomes.get(ids[0], "skipped") if single else outcomes


@dataclass
class Chained:
    """
    The chain goes on in this task: ``run``, the next step's StepRun, was recorded (and the
    operation moved to it, running) in the transaction that closed the step before, and
    ``context`` is what that step worked with -- the step after reads only which of its instances
    are still the operation's.
    """

    run: StepRun
    context: Context


OPERATION_WITH = ("reservation__offering", "reservation__region", "reservation__vpc__fabric__region", "node__region")


def _run_steps(ids: list[str], step: str, dispatch: str | None, *, chain: bool) -> dict:
    """The first step a message carries: the operations that answer it are marked running at it, then run."""
    operations = list(Operation.objects.select_related(*OPERATION_WITH).filter(pk__in=ids).order_by("pk"))
    outcomes: dict = {pk: "skipped" for pk in ids}  # gone: nothing to do
    ready = []
    for operation in operations:
        if operation.is_finished:
            continue  # done already: a redelivery, or a stopped operation
        if dispatch is not None and operation.dispatch != dispatch:
            continue  # a newer message carries the operation (a retry, a resume, a later step)
        if dispatch is None and operation.step != step:
            continue  # (with its token, a message runs the step the operation stands at: its chain went on)
        ready.append(operation)
    lost = [operation for operation in ready if operation.attempt]
    if lost:
        # A run still "running" here lost its worker or its database connection (this is its
        # redelivery, its task's retry or the reaper's resume).
        lost_runs = Q()
        for operation in lost:
            lost_runs |= Q(operation=operation, name=operation.step)
        StepRun.objects.filter(lost_runs, state=StepState.RUNNING).update(
            state=StepState.FAILED, error="The worker was lost during this step (or its database connection was); "
                                          "it ran again.",
            finished_at=timezone.now())
    for operation in [operation for operation in ready if operation.attempt + 1 > _attempt_limit(operation)]:
        # Every delivery so far died with its worker (out of memory, a driver crash): stop here.
        attempt = operation.attempt + 1
        run = StepRun.objects.create(operation=operation, node=operation.node, name=operation.step, attempt=attempt)
        node = operation.node or next((i.node for i in _contexts([operation])[operation.pk].instances), None)
        if node is not None:
            ready.remove(operation)
            outcomes[str(operation.pk)] = _step_failed(
                operation, run, NodeFault(node, "the step's worker died on every attempt", transient=False), attempt)
    if not ready:
        return outcomes
    Operation.objects.filter(pk__in=[operation.pk for operation in ready]).update(
        state=OperationState.RUNNING, attempt=F("attempt") + 1, updated_at=timezone.now())
    for operation in ready:
        operation.attempt += 1
        operation.state = OperationState.RUNNING
    runs = StepRun.objects.bulk_create([StepRun(operation=operation, node=operation.node, name=operation.step,
                                                attempt=operation.attempt) for operation in ready])
    contexts = _contexts(ready)
    return outcomes | _run_batch([(contexts[run.operation.pk], run) for run in runs], dispatch, chain=chain)


def _run_batch(batch: list[tuple[Context, StepRun]], dispatch: str | None, *, chain: bool) -> dict:
    """
    Run each operation's step (its operation marked running at it); the ones that succeeded are
    recorded together, the others one by one (a wait, a retry or a failure is the operation's own).
    """
    outcomes, succeeded, unexpected = {}, [], None
    together = _run_together(batch)
    for context, run in batch:
        operation = context.operation
        try:
            if not together:
                _step_body(context, run)
        except NodeFault as fault:
            outcomes[str(operation.pk)] = _step_failed(operation, run, fault, run.attempt)
            continue
        except Exception as exc:
            if transient_database_error(exc):
                # The database, not the node: the whole task runs again on a fresh connection
                # (cloud.celery.MeridianTask) and the steps find their work done.
                raise
            # A bug or an unexpected answer: retried like a transient error, then failed for good,
            # never left running until the reaper finds it.
            log.exception("Step %s of operation %s raised", run.name, operation.pk)
            node = operation.node or next((i.node for i in context.instances), None)
            if node is None:
                unexpected = unexpected or exc  # raised once the others are recorded
                continue
            outcomes[str(operation.pk)] = _step_failed(operation, run, NodeFault(
                node, f"unexpected error: {type(exc).__name__}: {exc}", transient=True), run.attempt)
            continue
        succeeded.append((context, run))
    if succeeded:
        outcomes |= _steps_succeeded(succeeded, chain=chain, dispatch=dispatch)
    if unexpected is not None:
        raise unexpected
    return outcomes


def _run_together(batch: list[tuple[Context, StepRun]]) -> bool:
    """
    A step that can act for the whole batch at once (one fabric call for all its ports) does;
    whatever goes wrong is looked for again one operation at a time (False), where a fault names
    its operation and node.
    """
    steps = {_step_of(context.operation, run.name) for context, run in batch}
    if len(batch) < 2 or len(steps) != 1:
        return False
    step = steps.pop()
    if step.run_many is None or batch[0][0].operation.kind == OperationKind.RELEASE:
        return False
    try:
        step.run_many([context for context, _ in batch])
    except Exception as exc:
        log.info("Step %s for %d operations at once failed (%s); running it for each alone.", step.name,
                 len(batch), exc)
        return False
    return True


def _step_of(operation: Operation, name: str):
    return next(step for step in pipeline_of(operation) if step.name == name)


def _step_body(context: Context, run: StepRun) -> None:
    if context.operation.kind == OperationKind.RELEASE:
        _wait_for_provisioning(context)
    _step_of(context.operation, run.name).run(context)


def _wait_for_provisioning(context: Context) -> None:
    """
    Cleaning waits while a provisioning step is still inside a driver call for this reservation
    (its worker does not know it was stopped): otherwise that call could land after the wipe.
    """
    since = timezone.now() - timedelta(seconds=settings.CELERY_TASK_TIME_LIMIT)
    busy = StepRun.objects.filter(operation__reservation=context.reservation, operation__kind=OperationKind.PROVISION,
                                  state=StepState.RUNNING, started_at__gt=since).exists()
    if busy and context.instances:
        raise NodeFault(context.instances[0].node, NotYet("A provisioning step is still running on this hardware; "
                                                          "cleaning waits for it.", wait_s=2.0))


def _instances_of(operation: Operation):
    """The instances this operation works on: its own, still in the state it moves them from."""
    return _instances_of_many([operation])


def _instances_of_many(operations: list[Operation]):
    """The instances these operations work on (a provisioning's or a cleaning's, not both)."""
    if operations[0].kind == OperationKind.RELEASE:
        return Instance.objects.filter(released_by__in=operations, state=InstanceState.RELEASING)
    return Instance.objects.filter(provisioned_by__in=operations, state=InstanceState.PROVISIONING)


def _context(operation: Operation) -> Context:
    return _contexts([operation])[operation.pk]


def _contexts(operations: list[Operation]) -> dict:
    """Each operation's context, their instances read in one query per kind of operation."""
    instances: dict = {operation.pk: [] for operation in operations}
    releasing = [operation for operation in operations if operation.kind == OperationKind.RELEASE]
    for group in (releasing, [operation for operation in operations if operation.kind != OperationKind.RELEASE]):
        with_reservation = [operation for operation in group if operation.reservation_id]
        if not with_reservation:
            continue
        owner = "released_by_id" if group is releasing else "provisioned_by_id"
        for instance in _instances_of_many(with_reservation).select_related("node__region", "node__fabric__region"):
            instances[getattr(instance, owner)].append(instance)
    contexts = {}
    for operation in operations:
        mine = instances[operation.pk]
        # The hardware's region picks the drivers (a re-queued reservation has no region of its own).
        node = operation.node or (mine[0].node if mine else None)
        region = node.region.slug if node else operation.reservation.region.slug
        contexts[operation.pk] = Context(operation=operation, drivers=drivers_for(region),
                                         reservation=operation.reservation, instances=mine, node=operation.node)
    return contexts


def _lock(operation: Operation) -> Operation:
    """
    Lock the reservation, then the operation: the order services take them in (a cancel moves the
    reservation, then stops its operations), so the two never wait on each other in a deadlock.
    """
    if operation.reservation_id:
        Reservation.objects.select_for_update().filter(pk=operation.reservation_id).values_list("pk").first()
    return Operation.objects.select_for_update(of=("self",)).select_related(*OPERATION_WITH).get(pk=operation.pk)


def _lock_many(operations: list[Operation], *, reservations_too: bool = True) -> dict:
    """
    ``_lock`` for a batch: the reservations, then the operations, each in key order (no deadlock
    between batches). Without ``reservations_too`` only the operations: a transaction that will
    not touch the reservations cannot close a cycle with one that holds a reservation and waits
    for its operation. Returns what may have changed since the batch read them: each
    operation's state, step and dispatch token, by key (the rest it already holds).
    """
    reservations = sorted({operation.reservation_id for operation in operations if operation.reservation_id})
    if reservations and reservations_too:
        list(Reservation.objects.select_for_update().filter(pk__in=reservations).order_by("pk").values_list("pk"))
    locked = (Operation.objects.select_for_update().filter(pk__in=[operation.pk for operation in operations])
              .order_by("pk").values_list("pk", "state", "step", "dispatch"))
    return {pk: (state, step, dispatch) for pk, state, step, dispatch in locked}


@transaction.atomic
def _steps_succeeded(succeeded: list[tuple[Context, StepRun]], *, chain: bool = False,
                     dispatch: str | None = None) -> dict:
    """
    Each operation moves to its next step, or finishes. With ``chain`` the next step runs in this
    task: it is marked running and its StepRun recorded here, in the same transaction, and it works
    on the instances still the operation's -- unless a newer message carries the operation now (the
    reaper resumed it): then, as without ``chain``, the next step is sent out as a new task (one
    message for the operations that go on together).
    """
    # Only a step that ends an operation moves its reservation (and must lock it first).
    ending = any(run.name == pipeline_of(context.operation)[-1].name for context, run in succeeded)
    locked = _lock_many([context.operation for context, _ in succeeded], reservations_too=ending)
    now = timezone.now()
    StepRun.objects.filter(pk__in=[run.pk for _, run in succeeded]).update(state=StepState.SUCCEEDED,
                                                                            finished_at=now)
    outcomes: dict = {}
    finished, going_on, sent_out = [], defaultdict(list), defaultdict(list)  # by (next step, progress)
    for context, run in succeeded:
        operation = context.operation
        if operation.pk not in locked:
            outcomes[str(operation.pk)] = "skipped"  # gone
            continue
        operation.state, operation.step, operation.dispatch = locked[operation.pk]
        if operation.is_finished or operation.step != run.name:
            outcomes[str(operation.pk)] = "skipped"  # stopped meanwhile (the reservation was released)
            continue
        names = [step.name for step in pipeline_of(operation)]
        index = names.index(run.name)
        if index + 1 == len(names):
            finished.append(operation)
            outcomes[str(operation.pk)] = "done"
            continue
        following = (names[index + 1], round(100 * (index + 1) / len(names)))
        if chain and operation.dispatch == dispatch:
            going_on[following].append(context)
        else:
            # A newer message (the reaper's) may be running this very step at once, and then finds the
            # operation moved on and stops: the next step goes out under a new token either way, so one
            # message always carries the operation.
            sent_out[following].append(operation)
    _finish_many(finished)
    for (step, progress), operations in sent_out.items():
        Operation.objects.filter(pk__in=[operation.pk for operation in operations]).update(
            step=step, attempt=0, error="", progress=progress, updated_at=now)
        _enqueue(operations, step)
        outcomes |= {str(operation.pk): "done" for operation in operations}
    contexts = [context for group in going_on.values() for context in group]
    if contexts:
        _keep_live_instances(contexts)
    runs = []
    for (step, progress), group in going_on.items():
        Operation.objects.filter(pk__in=[context.operation.pk for context in group]).update(
            step=step, attempt=1, error="", progress=progress, state=OperationState.RUNNING, updated_at=now)
        for context in group:
            operation = context.operation
            operation.step, operation.attempt, operation.state = step, 1, OperationState.RUNNING
            runs.append(StepRun(operation=operation, node=operation.node, name=step, attempt=1))
    by_operation = {context.operation.pk: context for context in contexts}
    for run in StepRun.objects.bulk_create(runs):
        outcomes[str(run.operation.pk)] = Chained(run=run, context=by_operation[run.operation.pk])
    return outcomes


def _keep_live_instances(contexts: list[Context]) -> None:
    """
    What a step reloaded before: instances failed meanwhile (their node or GPUs lost,
    provisioning.replacement) are no longer their operation's to work on.
    """
    with_reservation = [context for context in contexts if context.reservation is not None]
    for kind in {context.operation.kind for context in with_reservation}:
        group = [context for context in with_reservation if context.operation.kind == kind]
        live = set(_instances_of_many([context.operation for context in group]).values_list("pk", flat=True))
        for context in group:
            context.instances = [instance for instance in context.instances if instance.pk in live]


@transaction.atomic
def _step_failed(operation: Operation, run: StepRun, fault: NodeFault, attempt: int) -> str:
    locked = _lock(operation)
    if locked.is_finished or locked.step != run.name:
        StepRun.objects.filter(pk=run.pk).update(state=StepState.FAILED, error=str(fault), finished_at=timezone.now())
        return "skipped"
    if fault.wait_s is not None and _waits(locked, run.name, fault.node) < settings.MERIDIAN_STEP_WAITS:
        # Asked, not failed (an agent has the work): look again soon, without spending an attempt.
        # The run names the node waited for: a step over many nodes waits for each in turn.
        StepRun.objects.filter(pk=run.pk).update(state=StepState.WAITING, error=str(fault), finished_at=timezone.now(),
                                                 node=fault.node)
        Operation.objects.filter(pk=locked.pk).update(attempt=attempt - 1)
        _enqueue(locked, run.name, countdown=fault.wait_s)
        return "waiting"
    limit = _attempt_limit(locked)
    message = f"{run.name} (attempt {min(attempt, limit)} of {limit}) on {fault}"
    if fault.transient and attempt < limit:
        StepRun.objects.filter(pk=run.pk).update(state=StepState.FAILED, error=str(fault), finished_at=timezone.now())
        Operation.objects.filter(pk=locked.pk).update(error=message)
        _enqueue(locked, run.name, countdown=min(2.0 ** attempt, settings.MERIDIAN_STEP_BACKOFF_MAX_S))
        return "retrying"
    StepRun.objects.filter(pk=run.pk).update(state=StepState.GAVE_UP, error=str(fault), finished_at=timezone.now())
    log.warning("Step failed for good: %s", message)
    FAILURES[locked.kind](locked, fault, message)
    return "failed"


def _waits(operation: Operation, step: str, node) -> int:
    """How often the step looked in vain for an answer from ``node``'s agent (the budget is per node)."""
    return StepRun.objects.filter(operation=operation, name=step, state=StepState.WAITING, node=node).count()


def _attempt_limit(operation: Operation) -> int:
    return settings.MERIDIAN_CLEANING_ATTEMPTS if operation.kind == OperationKind.RELEASE else \
        settings.MERIDIAN_STEP_ATTEMPTS


def _close(operation: Operation, state: str, error: str = "") -> None:
    Operation.objects.filter(pk=operation.pk).update(
        state=state, error=error[:2000], finished_at=timezone.now(),
        **({"progress": 100} if state == OperationState.SUCCEEDED else {}))


def _node_failed(node: Node, reason: str, *, reservation_id=None) -> None:
    """
    The node is faulty. Other tenants' live work on it (a shared host) is replaced
    (provisioning.replacement); ``reservation_id``, whose step failed, is handled by the caller.
    """
    from .replacement import node_failed_in_lifecycle

    node.refresh_from_db(fields=["state"])
    if node.state != N.FAULTY:
        try:
            node_transition(actor=None, node=node, target=N.FAULTY, reason=reason)
        except Conflict:
            log.warning("Could not mark %s faulty from %s: %s", node.hostname, node.state, reason)
            return
    node_failed_in_lifecycle(node, reason, reservation_id=reservation_id)


#
# Outcomes, per kind of operation
#


def _finish_many(operations: list[Operation]) -> None:
    """Operations whose last step succeeded: provisionings together, the others one by one."""
    provisioned = [operation for operation in operations if operation.kind == OperationKind.PROVISION]
    if provisioned:
        _provisioned_many(provisioned)
    for operation in operations:
        if operation.kind != OperationKind.PROVISION:
            _finish(operation)


def _finish(operation: Operation) -> None:
    {OperationKind.PROVISION: _provisioned, OperationKind.RELEASE: _released,
     OperationKind.VALIDATE: _validated, OperationKind.ATTEST: _attested}[operation.kind](operation)


def _provisioned(operation: Operation) -> None:
    _provisioned_many([operation])


def _provisioned_many(operations: list[Operation]) -> None:
    """
    Provisionings whose last step succeeded (their reservations locked by the caller): instances
    active with their addresses, operations closed, reservations active and audited -- one
    statement each for them all; a reservation whose hardware is being replaced goes its own way.
    """
    from .replacement import open_incidents_of, reservation_restored, settled

    now = timezone.now()
    by_region = defaultdict(list)
    for operation in operations:
        by_region[operation.reservation.region.slug].append(operation)
    for region, group in by_region.items():
        # A VM's or container's name never says which host it shares with other tenants.
        _instances_of_many(group).update(state=InstanceState.ACTIVE, address=Concat("name", Value(f".{region}.gpu")),
                                         ssh_user="ubuntu")
    Operation.objects.filter(pk__in=[operation.pk for operation in operations]).update(
        state=OperationState.SUCCEEDED, error="", finished_at=now, progress=100)
    replacing = open_incidents_of(operation.reservation_id for operation in operations)
    for operation in operations:
        reservation, incidents = operation.reservation, replacing.get(operation.reservation_id)
        if incidents is None:
            continue
        if not settled(reservation):
            continue  # another attempt still provisions, or units still wait for capacity: the last one activates
        if _move_reservation(reservation, R.ACTIVE, only_from={R.PROVISIONING}, reason=""):
            audit_record(actor=None, action="reservation.active", target=reservation, after={"state": R.ACTIVE})
            reservation_restored(reservation=reservation, incidents=incidents)
    # Still provisioning (a cancel may have won): read under the caller's locks, moved in one UPDATE.
    moving = set(Reservation.objects.filter(
        pk__in=[o.reservation_id for o in operations if o.reservation_id not in replacing],
        state=R.PROVISIONING).values_list("pk", flat=True))
    if not moving:
        return
    Reservation.objects.filter(pk__in=moving, state=R.PROVISIONING).update(state=R.ACTIVE, state_reason="",
                                                                          state_changed_at=now)
    activated = [operation.reservation for operation in operations if operation.reservation_id in moving]
    for reservation in activated:
        reservation.state, reservation.state_reason, reservation.state_changed_at = R.ACTIVE, "", now
    audit_record_many(actor=None, action="reservation.active",
                      changes=[(reservation, {"state": R.ACTIVE}) for reservation in activated])
    notices.reservations_notify(activated, notices.READY)


def _released(operation: Operation, *, outcome: str = OperationState.SUCCEEDED, error: str = "") -> None:
    reservation = operation.reservation
    instances = list(_instances_of(operation))
    Instance.objects.filter(pk__in=[i.pk for i in instances]).update(state=InstanceState.RELEASED)
    if reservation.offering.kind == OfferingKind.BARE_METAL:
        for node in Node.objects.filter(pk__in={i.node_id for i in instances}, state=N.RELEASING):
            node_transition(actor=None, node=node, target=N.AVAILABLE, reason="Cleaned.")
    elif reservation.offering.slots_per_gpu == 1:
        _move_gpus({d["gpu_id"] for i in instances for d in i.devices}, GPUState.SCRUBBING, GPUState.AVAILABLE)
    _close(operation, outcome, error)
    if reservation.instances.filter(state__in=[InstanceState.PROVISIONING, InstanceState.ACTIVE,
                                               InstanceState.RELEASING]).exists():
        return  # another attempt's instances are still live or being cleaned: that operation finishes it
    if _move_reservation(reservation, R.RELEASED, only_from={R.RELEASING}, reason=""):
        audit_record(actor=None, action="reservation.released", target=reservation, after={"state": R.RELEASED})


def _validated(operation: Operation) -> None:
    node = operation.node
    target = N.IN_SERVICE if node.pool == NodePool.SHARED else N.AVAILABLE
    node_transition(actor=None, node=node, target=target, reason="Validation passed.")
    Node.objects.filter(pk=node.pk).update(health=Health.HEALTHY)
    node.gpus.update(health=Health.HEALTHY)
    # Burnt in and verified: GPUs held out after a failed scrub or provisioning are clean again.
    _move_gpus(node.gpus.filter(state=GPUState.QUARANTINED).values_list("pk", flat=True), GPUState.QUARANTINED,
               GPUState.AVAILABLE)
    _close(operation, OperationState.SUCCEEDED)


def _provision_failed(operation: Operation, fault: NodeFault, message: str) -> None:
    """The node is faulty; the others are cleaned; the reservation is placed again or fails."""
    reservation = Reservation.objects.select_for_update().select_related("offering").get(pk=operation.reservation_id)
    if fault.blame:  # attestation holds the node (or its GPUs) itself; a request fault leaves it be
        _node_failed(fault.node, f"Provisioning failed: {fault.cause}", reservation_id=reservation.pk)
    _close(operation, OperationState.FAILED, message)
    instances = list(_instances_of(operation))
    on_faulty = [i for i in instances if i.node_id == fault.node.pk and (fault.blame or fault.held)]
    # Never cleaned (their node is held): their ports still leave the tenant's network now.
    ports_abandon(on_faulty)
    Instance.objects.filter(pk__in=[i.pk for i in on_faulty]).update(state=InstanceState.FAILED)
    if reservation.offering.kind != OfferingKind.BARE_METAL and reservation.offering.slots_per_gpu == 1:
        # Never scrubbed, maybe half set up: held out until the node is repaired and validated.
        _move_gpus({d["gpu_id"] for i in on_faulty for d in i.devices}, GPUState.ALLOCATED, GPUState.QUARANTINED)
    _clean(reservation, [i for i in instances if i not in on_faulty])
    failures = reservation.provision_failures + 1
    Reservation.objects.filter(pk=reservation.pk).update(provision_failures=failures)
    from .replacement import attempt_failed, open_incidents

    if open_incidents(reservation):
        # Its hardware failed under it: only this attempt's units are placed again (the others keep running).
        attempt_failed(reservation=reservation, instances=instances, failures=failures, cause=fault.cause)
    elif failures < settings.MERIDIAN_PROVISION_FAILURES:
        _requeue(reservation, f"Provisioning failed on a node ({fault.cause}); placing the reservation again, "
                              "keeping its place in the queue.")
    else:
        allocation_end(reservation=reservation, at=timezone.now())
        if _move_reservation(reservation, R.FAILED, only_from={R.PROVISIONING},
                             reason=f"Provisioning failed on {failures} nodes; last: {fault.cause}"):
            notices.reservations_notify([reservation], notices.FAILED)
    audit_record(actor=None, action="reservation.provision_failed", target=reservation,
                 after={"error": message[:500], "failures": failures})


def _release_failed(operation: Operation, fault: NodeFault, message: str) -> None:
    """
    Cleaning failed for good on one node: that node goes faulty (never back to the pool) with
    the reason, its instance is released; cleaning goes on for the others. A scrub that cannot be
    verified quarantines what held the tenant's memory instead: the GPUs of a shared host (its
    other tenants go on), or the whole bare-metal node -- never re-sold until validated again.
    """
    reservation = operation.reservation
    shared = reservation.offering.kind != OfferingKind.BARE_METAL
    if fault.blame and operation.step == "scrub":
        _scrub_unverified(fault.node, fault.cause, whole_node=not shared)
    elif fault.blame:  # attestation holds the node (or its GPUs) itself
        _node_failed(fault.node, f"Cleaning failed: {fault.cause}", reservation_id=reservation.pk)
    on_node = list(_instances_of(operation).filter(node=fault.node))
    ports_abandon(on_node)
    Instance.objects.filter(pk__in=[i.pk for i in on_node]).update(state=InstanceState.RELEASED)
    if shared:
        _move_gpus({d["gpu_id"] for i in on_node for d in i.devices}, GPUState.SCRUBBING, GPUState.QUARANTINED)
    if _instances_of(operation).exists():
        Operation.objects.filter(pk=operation.pk).update(attempt=0, error=message)
        _enqueue(operation, operation.step)
        return
    _released(operation, outcome=OperationState.FAILED, error=message)


def _scrub_unverified(node: Node, cause: str, *, whole_node: bool) -> None:
    from security.models import Incident

    Incident.objects.create(kind="scrub_unverified", node_id=node.pk, summary=f"{node.hostname}: {cause}"[:500],
                            evidence={"cause": cause[:1000], "whole_node": whole_node})
    if whole_node:
        node.refresh_from_db(fields=["state"])
        try:
            node_transition(actor=None, node=node, target=N.QUARANTINED, reason=f"Scrub not verified: {cause}")
        except Conflict:
            _node_failed(node, f"Scrub not verified: {cause}")


def _validation_failed(operation: Operation, fault: NodeFault, message: str) -> None:
    if fault.blame:  # attestation holds the node itself
        _node_failed(operation.node, f"Validation failed: {fault.cause}")
    _close(operation, OperationState.FAILED, message)


def _attested(operation: Operation) -> None:
    _close(operation, OperationState.SUCCEEDED)


def _attestation_failed(operation: Operation, fault: NodeFault, message: str) -> None:
    """
    An idle node that fails (or cannot answer) is held: quarantined by its verdict, or faulty. A
    shared host in service carries tenants' work even when "idle": held, that work is replaced.
    """
    if fault.blame:
        _node_failed(operation.node, f"Attestation could not run: {fault.cause}")
    elif fault.held:
        from .replacement import node_failed_in_lifecycle

        node_failed_in_lifecycle(operation.node, f"Attestation failed: {fault.cause}")
    _close(operation, OperationState.FAILED, message)


FAILURES = {OperationKind.PROVISION: _provision_failed, OperationKind.RELEASE: _release_failed,
            OperationKind.VALIDATE: _validation_failed, OperationKind.ATTEST: _attestation_failed}


#
# The periodic tick
#


def tick(*, now=None, limit: int = 200) -> dict:
    """
    Start due reservations, release ended ones, validate waiting nodes, attest idle ones that are
    due (MERIDIAN_ATTESTATION_IDLE_INTERVAL, a few per tick), replace failed hardware that still
    waits for capacity (provisioning.replacement), resume or fail stuck work, tell teams whose
    reservations end soon.
    """
    from .replacement import replacements_due, reservation_replace
    from .services import reservation_expire

    now = now or timezone.now()
    report = {"started": 0, "expired": 0, "releases": 0, "validations": 0, "attestations": 0, "replacements": 0,
              "resumed": 0, "failed_stuck": 0, "ending_soon": 0, "errors": 0}

    def each(items, act, counter):
        # One bad item is logged and skipped: it must not stop the rest of the tick.
        for item in items:
            try:
                with transaction.atomic():
                    outcome = act(item)
            except Exception:
                log.exception("lifecycle tick: %s failed on %s", counter, item)
                report["errors"] += 1
                continue
            if isinstance(outcome, str):
                report[outcome] += 1
            elif outcome:
                report[counter] += 1

    # What the tick starts, releases or resumes goes out in batches (dispatch_together).
    with dispatch_together():
        each(Reservation.objects.filter(state=R.SCHEDULED, starts_at__lte=now, ends_at__gt=now).order_by("starts_at")
             .values_list("pk", flat=True)[:limit],
             lambda pk: reservation_provision_start(pk, now=now) is not None, "started")
        each(Reservation.objects.filter(state__in=[R.SCHEDULED, R.PROVISIONING, R.ACTIVE], ends_at__lte=now)[:limit],
             lambda reservation: reservation_expire(reservation=reservation), "expired")
        live = Instance.objects.filter(reservation=OuterRef("pk"),
                                       state__in=[InstanceState.PROVISIONING, InstanceState.ACTIVE])
        cleaning = Operation.objects.filter(reservation=OuterRef("pk"), kind=OperationKind.RELEASE)
        each(Reservation.objects.filter(state=R.RELEASING, released_at__lte=now)
             .filter(Exists(live) | ~Exists(cleaning)).select_related("offering")[:limit],
             release_start, "releases")
        validating = Operation.objects.filter(node=OuterRef("pk"), kind=OperationKind.VALIDATE, state__in=UNFINISHED)
        each(Node.objects.filter(state=N.VALIDATING).exclude(Exists(validating))[:limit],
             lambda node: node_validate(actor=None, node=node), "validations")
        # Tenants without their hardware come before routine attestation of idle nodes (which holds a node back).
        each(replacements_due(now, limit),
             lambda pk: reservation_replace(pk, now=now) in ("started", "restored", "failed"), "replacements")
        each(idle_nodes_due(now, limit=max(1, limit // 10)), lambda node: node_attest(node) is not None, "attestations")
        stuck_before = now - settings.MERIDIAN_STUCK_AFTER
        each(Operation.objects.filter(state__in=UNFINISHED, updated_at__lt=stuck_before)[:limit],
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
    _lock(operation)
    locked = Operation.objects.select_related("reservation__offering", "node").get(pk=operation.pk)
    if locked.is_finished:
        return True
    if locked.resumed < settings.MERIDIAN_RESUME_LIMIT:
        Operation.objects.filter(pk=locked.pk).update(resumed=locked.resumed + 1, updated_at=timezone.now())
        _enqueue(locked, locked.step)
        return True
    node = locked.node or next((i.node for i in _context(locked).instances), None)
    stuck_s = int(settings.MERIDIAN_STUCK_AFTER.total_seconds())
    message = f"{locked.step} made no progress in {stuck_s} s, {locked.resumed} times; given up."
    if node is None:
        _close(locked, OperationState.FAILED, message)
        return False
    FAILURES[locked.kind](locked, NodeFault(node, message, transient=False), message)
    return False
