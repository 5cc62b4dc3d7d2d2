"""
Binding reservations to GPUs under the database's guarantee, and ending those bindings.

PostgreSQL refuses an overlapping allocation with its exclusion constraint (the race between
the fast path and the scheduler loop is decided there); SQLite runs every write transaction
IMMEDIATE, one at a time, so the same rule is a query made before the insert in that
transaction. Either way a conflict is ``CapacityTaken``, never a 500: the caller re-plans.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, IntegrityError, OperationalError, connection, connections, transaction
from django.db.models import Q
from django.utils import timezone

from cloud.choices import NodeState
from cloud.models import GPU, Node
from core.db import copy_rows
from core.errors import Conflict
from provisioning.models import Allocation, Reservation
from provisioning.scheduling.plan_types import Assignment

DEADLOCK_DETECTED = "40P01"
# Nodes in these states may take new allocations (for now or a later window). Everything else
# -- validating, suspect, quarantined, faulty, in repair or maintenance -- is never allocated.
ALLOCATABLE_NODE_STATES = frozenset({NodeState.AVAILABLE, NodeState.ALLOCATED, NodeState.IN_SERVICE})


class CapacityTaken(Conflict):
    """Another writer took (part of) the capacity first; the request is re-planned or queued."""

    default_code = "capacity_taken"
    default_detail = "The capacity was taken by another request; try again."


class BindDeadlocked(Exception):
    """
    A one-statement insert of allocations (``bound_clause``) lost a deadlock to a racing insert:
    PostgreSQL aborted the whole transaction, which its caller runs again.
    """


def overlapping(gpu_ids: Iterable, starts_at: datetime, ends_at: datetime):
    """Allocations on these GPUs whose time range overlaps ``[starts_at, ends_at)``."""
    return Allocation.objects.filter(gpu_id__in=list(gpu_ids), starts_at__lt=ends_at, ends_at__gt=starts_at)


def unallocatable(gpu_ids) -> set:
    """Those of ``gpu_ids`` that may not be allocated now: missing, on a spare, or on a node held back."""
    gpu_ids = set(gpu_ids)
    fine = GPU.objects.filter(pk__in=gpu_ids, node__is_spare=False, node__state__in=ALLOCATABLE_NODE_STATES)
    return gpu_ids - set(fine.values_list("pk", flat=True))


def nodes_held_back(node_ids) -> set:
    """
    Those of ``node_ids`` that may not take allocations now (a spare, or a node held back): the
    scheduler's check, once a cycle, of nodes its snapshot found fine.
    """
    node_ids = set(node_ids)
    fine = Node.objects.filter(pk__in=node_ids, is_spare=False, state__in=ALLOCATABLE_NODE_STATES)
    return node_ids - set(fine.values_list("pk", flat=True))


def _check_fresh(bindings: list[Binding]) -> None:
    """
    Allocations that ended MERIDIAN_ALLOCATION_ARCHIVE_AFTER ago leave the no-overlap constraint
    (``allocations_archive``), so nothing bound may start that far back: a plan that would (one
    made, then kept waiting for its insert) could overlap one the constraint no longer sees. Half
    the horizon is the limit, which leaves the other half for clocks that disagree between the
    processes that allocate and archive. Such a plan is stale: re-planned, as after a lost race.
    """
    oldest = min((b.starts_at for b in bindings), default=None)
    if oldest is not None and not bound_in_time(oldest):
        raise CapacityTaken("The plan is too old to bind (it starts before what the no-overlap rule still "
                            "holds); it is planned again.")


def _check_allocatable(gpu_ids: list) -> None:
    refused = unallocatable(gpu_ids)
    if refused:
        raise CapacityTaken(f"{len(refused)} of the planned GPUs can no longer take allocations.")


def _check_no_overlap_sqlite(assignments: list[Assignment], starts_at: datetime, ends_at: datetime) -> None:
    """SQLite's counterpart of the exclusion constraint against what is stored (writers are serialised)."""
    by_gpu: dict = {}
    for a in assignments:
        by_gpu.setdefault(a.gpu_id, []).append((a.mem_lo, a.mem_hi))
    memory_clash = Q()
    for gpu_id, ranges in by_gpu.items():
        for lo, hi in ranges:
            memory_clash |= Q(gpu_id=gpu_id, mem_lo__lt=hi, mem_hi__gt=lo)
    if overlapping(by_gpu, starts_at, ends_at).filter(memory_clash).exists():
        raise CapacityTaken()
    # allocation_one_slice_class: time-sliced slots of two classes never share a GPU at once.
    for a in assignments:
        if a.share_class and overlapping([a.gpu_id], starts_at, ends_at).exclude(share_class="").exclude(
                share_class=a.share_class).exists():
            raise CapacityTaken()


def allocation_bind(
    *, reservation: Reservation, assignments: list[Assignment], starts_at: datetime, ends_at: datetime,
    checked: bool = False,
) -> list[Allocation]:
    """
    Hold ``assignments`` for ``reservation`` over ``[starts_at, ends_at)``; all or nothing.
    Must run inside the caller's transaction. Raises CapacityTaken on any clash. ``checked``:
    the caller has just made sure the GPUs are allocatable (the scheduler does it for a whole cycle).
    """
    return allocation_bind_many([Binding(reservation, assignments, starts_at, ends_at)], checked=checked)


@dataclass(frozen=True)
class Binding:
    reservation: Reservation
    assignments: list[Assignment]
    starts_at: datetime
    ends_at: datetime


def allocation_bind_many(bindings: list[Binding], *, checked: bool = False) -> int:
    """
    ``allocation_bind`` for many reservations in one statement, all or nothing: one clash
    anywhere raises CapacityTaken for the lot (the scheduler then binds that batch one by one).
    Returns how many allocations were made. A clash leaves the transaction to be rolled back:
    the caller's own savepoint (the fast path's, a scheduler batch's, a replacement's) undoes it,
    and a second savepoint here would cost two more round trips on every create.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("allocation_bind must run inside the transaction that schedules the reservation.")
    if not checked:
        _check_allocatable([a.gpu_id for b in bindings for a in b.assignments])
    if connection.vendor != "postgresql":
        for b in bindings:
            _check_no_overlap_sqlite(b.assignments, b.starts_at, b.ends_at)
        _check_disjoint(bindings)
    rows = [(b.reservation.pk, a.gpu_id, a.node_id, a.mem_lo, a.mem_hi, b.starts_at, b.ends_at, a.share_class)
            for b in bindings for a in b.assignments]
    try:
        with transaction.atomic(savepoint=False):  # on a clash: marked for rollback, up to the caller's savepoint
            _insert(rows)
            # Once in, not before: an insert that waited on another's clashing row checks the
            # constraint after the wait, against what is archived by then.
            _check_fresh(bindings)
        return len(rows)
    except IntegrityError as exc:
        raise CapacityTaken() from exc
    except OperationalError as exc:
        # Two inserts that clash with each other can both wait on the other's index entry while
        # checking the exclusion constraint; PostgreSQL then aborts one as a deadlock. That one
        # simply lost the race.
        if deadlocked(exc):
            raise CapacityTaken() from exc
        raise


INSERTED_COLUMNS = ("reservation_id", "gpu_id", "node_id", "mem_lo", "mem_hi", "starts_at", "ends_at", "share_class")


def _insert(rows: list[tuple]) -> None:
    """Rows of INSERTED_COLUMNS into the allocation table, by COPY on PostgreSQL (core.db.copy_rows)."""
    copy_rows(Allocation, INSERTED_COLUMNS, rows)


def bound_clause(*, reservation: Reservation, assignments: list[Assignment], starts_at: datetime,
                 ends_at: datetime) -> tuple[str, list]:
    """
    PostgreSQL: the WITH clause ``bound`` that inserts ``reservation``'s allocations ON CONFLICT DO
    NOTHING, one row returned per allocation made, for a statement that stores the reservation
    too (the fast path's: services). A clash then leaves out the clashing rows instead of aborting
    the transaction: fewer rows than assignments is a lost race. GPUs in ascending order, so that
    two such inserts meet on their first shared GPU rather than each holding one the other needs.
    """
    db = connections[DEFAULT_DB_ALIAS]  # the connection itself: every use of the proxy is a lookup
    fields = [Allocation._meta.get_field(name) for name in ("gpu", "node", "mem_lo", "mem_hi", "share_class")]
    ordered = sorted(assignments, key=lambda a: str(a.gpu_id))
    arrays = [[field.get_db_prep_save(getattr(a, field.attname), db) for a in ordered] for field in fields]
    prep = {name: Allocation._meta.get_field(name).get_db_prep_save(value, db)
            for name, value in (("reservation", reservation.pk), ("starts_at", starts_at), ("ends_at", ends_at))}
    qn = db.ops.quote_name
    columns = ", ".join(qn(Allocation._meta.get_field(name).column) for name in INSERTED_COLUMNS)
    types = ", ".join(f"%s::{field.db_type(db)}[]" for field in fields)
    # Only quoted names and types from the model's metadata are formatted in; every value is a parameter.
    sql = (f"bound AS (INSERT INTO {qn(Allocation._meta.db_table)} ({columns}) "  # noqa: S608
           f"SELECT %s, u.gpu, u.node, u.lo, u.hi, %s, %s, u.klass "
           f"FROM unnest({types}) WITH ORDINALITY AS u(gpu, node, lo, hi, klass, n) ORDER BY u.n "
           "ON CONFLICT DO NOTHING RETURNING 1)")
    return sql, [prep["reservation"], prep["starts_at"], prep["ends_at"], *arrays]


def bound_in_time(starts_at: datetime) -> bool:
    """Whether allocations bound from ``starts_at`` are still under the no-overlap rule (``_check_fresh``)."""
    return starts_at >= timezone.now() - settings.MERIDIAN_ALLOCATION_ARCHIVE_AFTER / 2


def deadlocked(exc: Exception) -> bool:
    """Whether PostgreSQL aborted the statement as a deadlock (two inserts clashing on each other's rows)."""
    return getattr(exc.__cause__, "sqlstate", None) == DEADLOCK_DETECTED


def _check_disjoint(bindings: list[Binding]) -> None:
    """SQLite: the bindings of one batch must not clash with each other either (the constraint's other half)."""
    by_gpu: dict = {}
    for b in bindings:
        for a in b.assignments:
            by_gpu.setdefault(a.gpu_id, []).append((b.starts_at, b.ends_at, a.mem_lo, a.mem_hi, a.share_class))
    for held in by_gpu.values():
        for i, (start, end, lo, hi, klass) in enumerate(held):
            if any(start < other_end and other_start < end
                   and ((lo < other_hi and other_lo < hi) or (klass and other and klass != other))
                   for other_start, other_end, other_lo, other_hi, other in held[i + 1:]):
                raise CapacityTaken("The plan gives one GPU's memory twice, or to two slice classes at once.")


def allocation_end(*, reservation: Reservation, at: datetime) -> int:
    """
    Give back ``reservation``'s capacity from ``at`` on: allocations that have not begun are
    deleted, running ones end at ``at``. Returns how many allocations changed.
    """
    never_started = Allocation.objects.filter(reservation=reservation, starts_at__gte=at).delete()[0]
    shortened = Allocation.objects.filter(reservation=reservation, starts_at__lt=at, ends_at__gt=at).update(ends_at=at)
    return never_started + shortened


def allocations_archive(*, now: datetime | None = None) -> int:
    """
    Archive the allocations that ended more than MERIDIAN_ALLOCATION_ARCHIVE_AFTER ago: they
    leave the no-overlap constraint (their history stays). Nothing is bound to start more than
    half that long ago (``_check_fresh``), so one that ended that long ago can clash with none.
    Returns how many.
    """
    horizon = (now or timezone.now()) - settings.MERIDIAN_ALLOCATION_ARCHIVE_AFTER
    return Allocation.objects.filter(ends_at__lt=horizon, archived=False).update(archived=True)


def allocation_extend(*, reservation: Reservation, new_end: datetime) -> None:
    """
    Move the end of ``reservation``'s allocations to ``new_end`` on the same GPUs, or raise
    CapacityTaken when another allocation holds that memory in the extra time.
    """
    # Only what it holds now: allocations ended earlier (a previous attempt) stay as history.
    rows = list(Allocation.objects.filter(reservation=reservation, ends_at__gt=timezone.now(), archived=False))
    if not rows:
        raise CapacityTaken("The reservation holds no capacity to extend.")
    if connection.vendor != "postgresql":
        for row in rows:
            clash = (
                overlapping([row.gpu_id], row.ends_at, new_end)
                .filter(mem_lo__lt=row.mem_hi, mem_hi__gt=row.mem_lo)
                .exclude(reservation=reservation)
            )
            if clash.exists():
                raise CapacityTaken("Another reservation holds these GPUs in the extra time.")
    try:
        with transaction.atomic():
            Allocation.objects.filter(pk__in=[row.pk for row in rows]).update(ends_at=new_end)
    except IntegrityError as exc:
        raise CapacityTaken("Another reservation holds these GPUs in the extra time.") from exc
    except OperationalError as exc:
        if deadlocked(exc):
            raise CapacityTaken() from exc
        raise
