"""
How a reservation's hardware work is going, as its page shows it: its provisioning (or release)
as one row per step of the pipeline, in a person's words, with each step's time; how far along
it is, how many nodes passed attestation while that step runs, and when it should be done.

Read-only. An operation's StepRuns are its history: a step that waits for a node agent is
retried as new runs, so one step can have many rows there; here each step is one row that ends
in the state of its latest run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from statistics import median

from django.core.cache import cache

from provisioning.choices import OperationKind, OperationState, StepState
from provisioning.lifecycle.dispatch import pipeline_of
from provisioning.lifecycle.steps import step_title
from provisioning.models import Instance, Operation, Reservation
from security.models import AttestationNonce, AttestationReport

# The operations a reservation's page follows: the ones that run steps on its hardware.
FOLLOWED = (OperationKind.PROVISION, OperationKind.RELEASE)
# How many recent operations of the kind and offering make the typical time, and how long it is kept.
TYPICAL_OF = 20
TYPICAL_CACHE_S = 300


@dataclass
class StepRow:
    name: str
    title: str
    state: str  # done, running, waiting, retrying, failed, to_do
    seconds: float | None = None
    retries: int = 0  # failed runs before this one
    note: str = ""  # what it waits for, or the error of its last failed run
    counted: str = ""  # "verified 9 of 14 nodes", while attestation runs

    @property
    def is_active(self) -> bool:
        return self.state in ("running", "waiting", "retrying")

    @property
    def badge(self) -> tuple[str, str]:
        """The badge's style (a state's colour in the console's CSS) and its word."""
        return BADGES[self.state]


BADGES = {"done": ("succeeded", "Done"), "running": ("running", "Running"), "waiting": ("waiting", "Waiting"),
          "retrying": ("pending", "Retrying"), "failed": ("failed", "Failed"), "to_do": ("released", "To do")}


@dataclass
class Progress:
    operation: Operation | None
    percent: int = 0
    steps: list[StepRow] = field(default_factory=list)
    elapsed_s: float | None = None
    typical_s: float | None = None
    eta: datetime | None = None

    @property
    def current(self) -> int | None:
        """The 1-based number of the step under way."""
        return next((i for i, row in enumerate(self.steps, 1) if row.is_active or row.state == "failed"), None)

    @property
    def remaining_s(self) -> float | None:
        return None if self.typical_s is None or self.elapsed_s is None else self.typical_s - self.elapsed_s


def progress_of(reservation: Reservation, now: datetime) -> Progress:
    """The latest provisioning or release of ``reservation``; before either, nothing done (0 %)."""
    operation = (Operation.objects.filter(reservation=reservation, kind__in=FOLLOWED).order_by("-created_at")
                 .prefetch_related("steps").first())
    if operation is None:
        return Progress(operation=None)
    operation.reservation = reservation
    rows = _rows(operation, now)
    done = sum(row.state == "done" for row in rows)
    finished = operation.state == OperationState.SUCCEEDED
    progress = Progress(operation=operation, steps=rows,
                        percent=100 if finished else round(100 * done / max(len(rows), 1)))
    end = operation.finished_at or now
    progress.elapsed_s = (end - operation.created_at).total_seconds()
    if not operation.is_finished:
        progress.typical_s = typical_seconds(operation.kind, reservation.offering_id)
        if progress.typical_s is not None:
            progress.eta = operation.created_at + timedelta(seconds=progress.typical_s)
    return progress


def _rows(operation: Operation, now: datetime) -> list[StepRow]:
    runs: dict[str, list] = {}
    for run in operation.steps.all():  # in id order: the order they ran
        runs.setdefault(run.name, []).append(run)
    rows = []
    for step in pipeline_of(operation):
        mine = runs.get(step.name, [])
        row = StepRow(name=step.name, title=step_title(step.name), state="to_do")
        if mine:
            last = mine[-1]
            row.seconds = ((last.finished_at or now) - mine[0].started_at).total_seconds()
            row.retries = sum(run.state in (StepState.FAILED, StepState.GAVE_UP) for run in mine[:-1])
            # A step that waits for an agent runs again and again, each run asking once more: it is
            # waiting (or retrying) as long as its last finished run says so.
            settled = next((run for run in reversed(mine) if run.state != StepState.RUNNING), None)
            if any(run.state == StepState.SUCCEEDED for run in mine):
                row.state = "done"
            elif last.state == StepState.GAVE_UP or (operation.state == OperationState.FAILED
                                                     and operation.step == step.name):
                row.state, row.note = "failed", last.error or operation.error
            elif operation.is_finished:
                row.state = "to_do"  # stopped before it ran again (the reservation moved on)
            elif settled is not None and settled.state == StepState.WAITING:
                row.state, row.note = "waiting", settled.error
            elif settled is not None and settled.state == StepState.FAILED:
                row.state, row.note = "retrying", settled.error
            else:
                row.state = "running"
        row.note = _without_repeated_host(row.note)
        if step.name == "verify" and row.is_active:
            row.counted = _verified(operation)
        rows.append(row)
    return rows


def _without_repeated_host(note: str) -> str:
    """A step's error names its node first ("n1: Waiting for the agent of n1 ..."): once is enough."""
    host, _, rest = note.partition(": ")
    return rest if rest and host in rest else note


def _verified(operation: Operation) -> str:
    """
    How many of the operation's machines passed attestation so far: a bare-metal node is attested
    whole, an instance on a shared host for its own GPUs (one challenge each, named by the
    operation: security.attestation_challenge's reference).
    """
    link = "provisioned_by" if operation.kind == OperationKind.PROVISION else "released_by"
    instances = list(Instance.objects.filter(**{link: operation}).values_list("node_id", "node__pool"))
    if not instances:
        return ""
    shared = any(pool == "shared" for _, pool in instances)
    total = len(instances) if shared else len({node for node, _ in instances})
    asked = dict(AttestationNonce.objects.filter(reference__startswith=f"{operation.pk}:", used_at__isnull=False)
                 .values_list("value", "reference"))
    passed = set(AttestationReport.objects.filter(node_id__in={node for node, _ in instances}, nonce__in=list(asked),
                                                  status=AttestationReport.Status.PASS).values_list("nonce", flat=True))
    done = len({asked[nonce] for nonce in passed})
    word = "instance" if shared else "node"
    return f"verified {done} of {total} {word}{'' if total == 1 else 's'}"


def typical_seconds(kind: str, offering_id) -> float | None:
    """The median time of the latest finished operations of ``kind`` for the offering (kept a few minutes)."""
    key = f"meridian:typical-operation:{kind}:{offering_id}"
    kept = cache.get(key)
    if kept is not None:
        return kept or None
    recent = Operation.objects.filter(kind=kind, state=OperationState.SUCCEEDED, reservation__offering_id=offering_id,
                                      finished_at__isnull=False).order_by("-finished_at")
    spans = list(recent.values_list("created_at", "finished_at")[:TYPICAL_OF])
    typical = median((end - start).total_seconds() for start, end in spans) if spans else 0.0
    cache.set(key, typical, TYPICAL_CACHE_S)
    return typical or None
