"""
How a step runs (``operation_run_step``): the task names the operations and the step it expects;
a task whose step is already done (a redelivery after the commit) does nothing. The step calls
its drivers outside any transaction -- hardware does not roll back -- and then one transaction
records the outcome and sends the next step on commit. A worker killed between the driver call
and that commit leaves the step where it was: the redelivered task runs it again, and the step
finds the work done (steps check before they act). Transient driver errors retry with backoff up
to a limit; a failure for good goes to ``provisioning.lifecycle.outcomes``. Operations started
together go through their steps as a batch: one message and one bookkeeping transaction per step
for them all, each operation's history its own; one that must wait, retry or fail leaves the
batch with a message of its own.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from cloud.choices import NodeState
from core.transient import transient_database_error
from provisioning.choices import OperationKind, OperationState, StepState
from provisioning.drivers import NotYet
from provisioning.lifecycle import dispatch as dispatching
from provisioning.lifecycle import operation_state, outcomes
from provisioning.lifecycle.steps import Context, NodeFault
from provisioning.models import Operation, StepRun

log = logging.getLogger(__name__)
N = NodeState


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
    answers: dict[str, str] = {}
    chained: list[Chained] = []
    while True:
        chain = dispatch is not None and time.monotonic() < deadline
        if chained:
            ran = _run_batch([(link.context, link.run) for link in chained], dispatch, chain=chain)
        else:
            ran = _run_steps(ids, step, dispatch, chain=chain)
        chained = [outcome for outcome in ran.values() if isinstance(outcome, Chained)]
        answers.update({pk: outcome for pk, outcome in ran.items() if not isinstance(outcome, Chained)})
        if not chained:
            return answers.get(ids[0], "skipped") if single else answers


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


def _run_steps(ids: list[str], step: str, dispatch: str | None, *, chain: bool) -> dict:
    """The first step a message carries: the operations that answer it are marked running at it, then run."""
    operations = list(Operation.objects.select_related(*operation_state.OPERATION_WITH).filter(pk__in=ids)
                      .order_by("pk"))
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
        node = operation.node or next(
            (i.node for i in operation_state.contexts([operation])[operation.pk].instances), None)
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
    contexts = operation_state.contexts(ready)
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
                # (config.celery.MeridianTask) and the steps find their work done.
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
    return next(step for step in dispatching.pipeline_of(operation) if step.name == name)


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
    ending = any(run.name == dispatching.pipeline_of(context.operation)[-1].name for context, run in succeeded)
    locked = operation_state.operations_lock([context.operation for context, _ in succeeded], reservations_too=ending)
    now = timezone.now()
    StepRun.objects.filter(pk__in=[run.pk for _, run in succeeded]).update(state=StepState.SUCCEEDED,
                                                                            finished_at=now)
    answers: dict = {}
    finished, going_on, sent_out = [], defaultdict(list), defaultdict(list)  # by (next step, progress)
    for context, run in succeeded:
        operation = context.operation
        if operation.pk not in locked:
            answers[str(operation.pk)] = "skipped"  # gone
            continue
        operation.state, operation.step, operation.dispatch = locked[operation.pk]
        if operation.is_finished or operation.step != run.name:
            answers[str(operation.pk)] = "skipped"  # stopped meanwhile (the reservation was released)
            continue
        names = [step.name for step in dispatching.pipeline_of(operation)]
        index = names.index(run.name)
        if index + 1 == len(names):
            finished.append(operation)
            answers[str(operation.pk)] = "done"
            continue
        following = (names[index + 1], round(100 * (index + 1) / len(names)))
        if chain and operation.dispatch == dispatch:
            going_on[following].append(context)
        else:
            # A newer message (the reaper's) may be running this very step at once, and then finds the
            # operation moved on and stops: the next step goes out under a new token either way, so one
            # message always carries the operation.
            sent_out[following].append(operation)
    outcomes.finish_many(finished)
    for (step, progress), operations in sent_out.items():
        Operation.objects.filter(pk__in=[operation.pk for operation in operations]).update(
            step=step, attempt=0, error="", progress=progress, updated_at=now)
        dispatching.enqueue(operations, step)
        answers |= {str(operation.pk): "done" for operation in operations}
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
        answers[str(run.operation.pk)] = Chained(run=run, context=by_operation[run.operation.pk])
    return answers


def _keep_live_instances(contexts: list[Context]) -> None:
    """
    What a step reloaded before: instances failed meanwhile (their node or GPUs lost,
    provisioning.lifecycle.replacement) are no longer their operation's to work on.
    """
    with_reservation = [context for context in contexts if context.reservation is not None]
    for kind in {context.operation.kind for context in with_reservation}:
        group = [context for context in with_reservation if context.operation.kind == kind]
        live = set(operation_state.instances_of_many([context.operation for context in group])
                   .values_list("pk", flat=True))
        for context in group:
            context.instances = [instance for instance in context.instances if instance.pk in live]


@transaction.atomic
def _step_failed(operation: Operation, run: StepRun, fault: NodeFault, attempt: int) -> str:
    locked = operation_state.operation_lock(operation)
    if locked.is_finished or locked.step != run.name:
        StepRun.objects.filter(pk=run.pk).update(state=StepState.FAILED, error=str(fault), finished_at=timezone.now())
        return "skipped"
    if fault.wait_s is not None and _waits(locked, run.name, fault.node) < settings.MERIDIAN_STEP_WAITS:
        # Asked, not failed (an agent has the work): look again soon, without spending an attempt.
        # The run names the node waited for: a step over many nodes waits for each in turn.
        StepRun.objects.filter(pk=run.pk).update(state=StepState.WAITING, error=str(fault), finished_at=timezone.now(),
                                                 node=fault.node)
        Operation.objects.filter(pk=locked.pk).update(attempt=attempt - 1)
        dispatching.enqueue(locked, run.name, countdown=fault.wait_s)
        return "waiting"
    limit = _attempt_limit(locked)
    message = f"{run.name} (attempt {min(attempt, limit)} of {limit}) on {fault}"
    if fault.transient and attempt < limit:
        StepRun.objects.filter(pk=run.pk).update(state=StepState.FAILED, error=str(fault), finished_at=timezone.now())
        Operation.objects.filter(pk=locked.pk).update(error=message)
        dispatching.enqueue(locked, run.name, countdown=min(2.0 ** attempt, settings.MERIDIAN_STEP_BACKOFF_MAX_S))
        return "retrying"
    StepRun.objects.filter(pk=run.pk).update(state=StepState.GAVE_UP, error=str(fault), finished_at=timezone.now())
    log.warning("Step failed for good: %s", message)
    outcomes.FAILURES[locked.kind](locked, fault, message)
    return "failed"


def _waits(operation: Operation, step: str, node) -> int:
    """How often the step looked in vain for an answer from ``node``'s agent (the budget is per node)."""
    return StepRun.objects.filter(operation=operation, name=step, state=StepState.WAITING, node=node).count()


def _attempt_limit(operation: Operation) -> int:
    return settings.MERIDIAN_CLEANING_ATTEMPTS if operation.kind == OperationKind.RELEASE else \
        settings.MERIDIAN_STEP_ATTEMPTS
