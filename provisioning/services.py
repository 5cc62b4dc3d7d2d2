"""
State changes of reservations: create (admission, score, fast-path placement), schedule,
evict, cancel, release, extend. Each is atomic and moves the reservation only through the
transition table by compare-and-set; each call from a person or token writes one audit event.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from cloud.choices import pool_of
from cloud.models import Region
from core.db import fast_cursor, insert_objects, insert_statement, mark_saved, update_rows
from core.errors import Conflict, Forbidden, Unavailable
from core.transitions import sources_of
from provisioning import admission, images, lock_objects, notices
from provisioning.allocations import (
    BindDeadlocked,
    Binding,
    CapacityTaken,
    allocation_bind,
    allocation_bind_many,
    allocation_end,
    allocation_extend,
    bound_clause,
    bound_in_time,
    deadlocked,
)
from provisioning.choices import BillingTerm, EvictionPolicy, InstanceState, OperationKind, OperationState
from provisioning.choices import ReservationState as R
from provisioning.drivers import DriverError
from provisioning.lifecycle import dispatch as dispatching
from provisioning.lifecycle import release as releasing
from provisioning.lifecycle import steps
from provisioning.models import Instance, Operation, Reservation
from provisioning.scheduling.free_hint import FREE_HINT
from provisioning.scheduling.plan_types import Placement, Request
from provisioning.scheduling.planner import Planner, uses_headroom
from provisioning.scheduling.priority import ScoreInputs, Weights, score
from provisioning.scheduling.snapshot import load_snapshot, request_for
from provisioning.scheduling.team_record import team_inputs, team_inputs_recent
from provisioning.transitions import (
    RESERVATION_TRANSITIONS,
    reservation_audited,
    reservation_transition,
    reservations_changed,
)
from security.audit import audit_event, audit_record, audit_record_many
from security.models import AuditEvent
from tenants.models import Tenant


def weights() -> Weights:
    return Weights.from_mapping(settings.MERIDIAN_PRIORITY_WEIGHTS)


#
# Scoring
#


def reservation_rescore(reservation: Reservation, *, now: datetime | None = None, recent: bool = False) -> float:
    """
    Recompute and store the reservation's score and its breakdown (not audited: derived data).
    ``recent``: the team's record may be a few seconds old (MERIDIAN_SCHEDULER_RECORD_REFRESH).
    """
    now = now or timezone.now()
    breakdown = _score(reservation, now=now, recent=recent,
                       waited_s=max(0.0, (now - reservation.submitted_at).total_seconds()))
    Reservation.objects.filter(pk=reservation.pk).update(score=breakdown.total, score_breakdown=breakdown.as_dict())
    reservation.score, reservation.score_breakdown = breakdown.total, breakdown.as_dict()
    return breakdown.total


def _score(reservation: Reservation, *, now: datetime, recent: bool, waited_s: float):
    """The reservation's score breakdown now, from its owner's record (``recent``: a few seconds old will do)."""
    w = weights()
    if recent:
        record = team_inputs_recent(tenant=reservation.tenant_id, team=reservation.team_id,
                                    gpu_model_id=reservation.gpu_model_id, now=now, weights=w,
                                    max_age_s=settings.MERIDIAN_SCHEDULER_RECORD_REFRESH)
    else:
        record = team_inputs(tenant=reservation.tenant_id, team=reservation.team_id,
                             gpu_model_id=reservation.gpu_model_id, now=now, weights=w)
    return score(ScoreInputs(
        urgency=reservation.urgency, fulfilment_rate=record.fulfilment_rate, current_load=record.current_load,
        waited_s=waited_s, high_priority=record.high_priority, usage_share=record.usage_share,
        adjustment=reservation.priority_adjustment,
    ), w)


#
# Create
#


def reservation_create(*, actor, ask: admission.Ask, team=None) -> Reservation:
    """
    Admit and create a reservation in the actor's tenant. Never-fits checks are a 400, quotas a
    409 with the numbers. When it starts now and no queued reservation of higher priority wants
    the same GPU model, it is placed at once (the fast path: the scheduler's planner and the
    database's no-overlap rule) and comes back ``scheduled``; otherwise ``queued``.
    """
    try:
        return _create(actor=actor, ask=ask, team=team, savepoint=False)
    except BindDeadlocked:
        # The one-statement store lost a deadlock to a racing insert, which aborted everything
        # this create did: once more, storing under a savepoint that a lost race rolls back.
        return _create(actor=actor, ask=ask, team=team, savepoint=True)


@transaction.atomic
def _create(*, actor, ask: admission.Ask, team, savepoint: bool) -> Reservation:
    if actor.tenant is None:
        raise Forbidden("Reservations are made inside a tenant; choose one with the X-Meridian-Tenant header.")
    team = team_for(actor, team)
    if ask.vpc is not None and ask.vpc.team_id is not None and ask.vpc.team_id != getattr(team, "pk", None):
        raise admission.invalid("vpc", f"VPC {ask.vpc.name} belongs to a team; book the reservation for that team.",
                                code="vpc_team")
    if any(key.tenant_id != actor.tenant.pk for key in ask.ssh_keys):
        raise admission.invalid("ssh_keys", "Name saved keys of this tenant.", code="does_not_exist")
    if ask.image is not None:
        if ask.image.tenant_id not in (None, actor.tenant.pk):
            raise admission.invalid("image", "Name a public image or one of this tenant's.", code="does_not_exist")
        images.image_check(ask.image, offering=ask.offering, regions=ask.regions)
    admission.check_never_fits(ask, timezone.now())
    tenant = lock_objects.tenant_lock(actor.tenant)
    # Taken once the lock is held: a create that waited for others of its tenant binds from now,
    # not from when it arrived (nothing may be bound to start long ago: allocations._check_fresh).
    now = timezone.now()
    admission.check_quota(tenant=tenant, team=team, ask=ask, window_start=max(ask.requested_start or now, now))
    admission.admission_checks(tenant=tenant, team=team, ask=ask)
    reservation = Reservation(
        tenant=tenant, team=team, name=ask.name, created_by=actor.user, offering=ask.offering,
        gpu_model=ask.offering.gpu_model, spec=ask.spec, units=ask.units, gpus=ask.gpus,
        regions=[region.slug for region in ask.regions], requested_start=ask.requested_start, duration=ask.duration,
        billing_term=ask.billing_term, committed=ask.committed, spot_max_price=ask.spot_max_price,
        managed_by=ask.managed_by,
        eviction_policy=ask.eviction_policy,
        urgency=ask.urgency, ssh_public_key=ask.ssh_public_key, vpc=ask.vpc, image=ask.image, public_ip=ask.public_ip,
        user_data=ask.user_data, environment=dict(ask.environment),
    )
    # Scored, and placed when it can be, before it is stored: one INSERT in the state it ends in
    # (it has waited nothing yet), with its operation and audit event.
    breakdown = _score(reservation, now=now, recent=True, waited_s=0.0)
    reservation.score, reservation.score_breakdown = breakdown.total, breakdown.as_dict()
    placement = _fast_path(reservation, now)
    if placement is not None and _store_scheduled(
            reservation, placement, actor=actor, savepoint=savepoint,
            region=next(r for r in ask.regions if r.slug == placement.region)):
        _keep_keys(reservation, ask)
        return reservation
    reservation.state, reservation.state_reason = R.QUEUED, "Waiting for the scheduler."
    reservation.save(force_insert=True)
    reservations_changed([reservation])
    insert_objects(_place_operation(reservation), _create_event(actor, reservation))
    _keep_keys(reservation, ask)
    if ask.requested_start is None or ask.requested_start <= now:
        notices.reservations_notify([reservation], notices.QUEUED)  # wanted now, but waits
    return reservation


def _keep_keys(reservation: Reservation, ask: admission.Ask) -> None:
    """The saved keys its instances get (one INSERT, and none when it names no key)."""
    if ask.ssh_keys:
        reservation.ssh_keys.through.objects.bulk_create(
            reservation.ssh_keys.through(reservation_id=reservation.pk, sshkey_id=key.pk) for key in ask.ssh_keys)


def _place_operation(reservation: Reservation) -> Operation:
    """The new reservation's placing, for the client to poll: done when it was placed at once."""
    placed = reservation.state == R.SCHEDULED
    return Operation(tenant_id=reservation.tenant_id, reservation=reservation, kind=OperationKind.PLACE, step="place",
                     state=OperationState.SUCCEEDED if placed else OperationState.PENDING,
                     progress=100 if placed else 0)


def _create_event(actor, reservation: Reservation):
    # A commitment's reservation is a consequence of the commitment, audited in the person's name: this is the system's.
    return audit_event(actor=None if reservation.committed else actor, action="reservation.create", target=reservation,
                       after=reservation_audited(reservation))


def team_for(actor, team):
    """
    The team a reservation is booked for: a team-bound token books for its team only (by default
    too); others book tenant-wide or for a team they belong to (tenant admins: any team).
    """
    if actor.team is not None:
        if team is not None and team.pk != actor.team.pk:
            raise Forbidden(f"This token acts for team '{actor.team.slug}' only.")
        return actor.team
    if team is not None and not actor.sees_all_teams and team.pk not in actor.team_roles:
        raise Forbidden("You can book only for teams you belong to.")
    return team


def _fast_path(reservation: Reservation, now: datetime) -> Placement | None:
    """Where a start-now reservation goes at once when nothing queued outranks it (None: it waits)."""
    starts_now = reservation.requested_start is None or reservation.requested_start <= now + timedelta(seconds=1)
    if not starts_now:
        return None
    if _outranked(reservation):
        return None  # queued work of higher priority wants this capacity: the scheduler decides
    request = request_for(reservation, now)
    # Only the request's pool: five times less to load than the whole region (the fast path is
    # on every create). The headroom is then a share of that pool's GPUs of the model. Whole-GPU
    # work that may use the headroom (uses_headroom: on-demand, spot with MERIDIAN_SPOT_IN_HEADROOM,
    # reserved work that has waited for it) need not count it, so it first plans on the few nodes
    # that would take it, read with their free GPUs in one statement (the nodes a recent read
    # chose, free_hint, else the pool's best-fit hosts or preferred leaves' whole-free nodes); only
    # when that does not settle it does it load the pool with what holds it (and may evict spot
    # work). Fractional slots need the shared GPUs to pack onto; work kept
    # out of the headroom, the whole pool to count it on.
    placement = None
    in_headroom = uses_headroom(request, request.start, spot_in_headroom=settings.MERIDIAN_SPOT_IN_HEADROOM)
    if in_headroom and request.slots_per_gpu == 1:
        placement = _place_on_free(request, now)
    if placement is None:
        where = {"now": now, "until": request.end, "regions": request.regions,
                 "gpu_model_ids": request.gpu_model_ids, "pool": pool_of(request.kind)}
        placement = Planner(load_snapshot(**where), headroom=settings.MERIDIAN_HEADROOM,
                            spot_in_headroom=settings.MERIDIAN_SPOT_IN_HEADROOM).place(request)
    return placement


def _outranked(reservation: Reservation) -> bool:
    """Whether queued work of a higher score (not held by staff) wants its GPU model in one of its regions."""
    if connection.vendor == "postgresql":
        # One short statement of the same text every time, answered by the first competitor found
        # (``?|``: the JSON array of regions holds any of these): it is on every create.
        table = connection.ops.quote_name(Reservation._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {table} WHERE state = %s AND gpu_model_id = %s "  # noqa: S608
                           "AND score > %s AND held_at IS NULL AND regions ?| %s)",
                           [R.QUEUED, reservation.gpu_model_id, reservation.score, list(reservation.regions)])
            return cursor.fetchone()[0]
    wanted = set(reservation.regions)
    competitors = Reservation.objects.filter(state=R.QUEUED, gpu_model_id=reservation.gpu_model_id,
                                             score__gt=reservation.score, held_at__isnull=True
                                             ).values_list("regions", flat=True)
    return any(wanted & set(regions) for regions in competitors.iterator())


def _store_scheduled(reservation: Reservation, placement: Placement, *, region: Region, actor,
                     savepoint: bool) -> bool:
    """
    Store a new reservation already ``scheduled`` on the fast path's placement, with its GPUs,
    its operation and its audit event, and the spot work it evicts. False when the database
    finds the capacity taken (a race lost): nothing of it stays, and the caller stores it queued
    for the scheduler. On PostgreSQL, when it evicts nobody and ``savepoint`` is not asked for,
    that is one statement (``_store_in_one``); otherwise the steps one by one under a savepoint.
    """
    reservation.state, reservation.state_reason = R.SCHEDULED, ""
    reservation.scheduled_at = timezone.now()  # state_changed_at and submitted_at: set by the INSERT
    reservation.starts_at, reservation.ends_at, reservation.region = placement.start, placement.end, region
    if connection.vendor == "postgresql" and not placement.evictions and not savepoint:
        stored = _store_in_one(reservation, placement, actor=actor)
    else:
        stored = _store_under_savepoint(reservation, placement, actor=actor)
    if not stored:  # it is stored queued next, as a new row
        reservation._state.adding = True
        reservation.scheduled_at = None
        reservation.starts_at = reservation.ends_at = reservation.region = None
        return False
    reservations_changed([reservation])
    dispatching.provision_when_due([reservation])
    return True


def _store_in_one(reservation: Reservation, placement: Placement, *, actor) -> bool:
    """
    The reservation, its operation, its audit event and its allocations in one statement: one
    round trip where a savepoint, three INSERTs and a COPY took seven (it is on every create).
    The allocations go in ON CONFLICT DO NOTHING, so a GPU taken meanwhile does not abort the
    transaction: fewer allocations than planned is a lost race, and what the statement inserted
    is deleted again (no one outside the transaction saw it). A deadlock with a racing insert
    does abort it: BindDeadlocked, and the create runs again (``reservation_create``).
    """
    operation, event = _place_operation(reservation), _create_event(actor, reservation)
    rows = list(placement.assignments)
    bound, bound_params = bound_clause(reservation=reservation, assignments=rows, starts_at=placement.start,
                                       ends_at=placement.end)
    sql, params = insert_statement([reservation, operation, event], also=bound, also_params=bound_params,
                                   result="SELECT count(*) FROM bound")
    try:
        # Its text is the same on every create: prepared once per connection, never parsed again.
        with fast_cursor() as cursor:
            cursor.execute(sql, params)
            made = cursor.fetchone()[0]
    except OperationalError as exc:
        if deadlocked(exc):
            raise BindDeadlocked() from exc
        raise
    mark_saved(reservation, operation, event)
    # An insert that waited on a racing one's rows may have waited past what the rule still holds.
    if made == len(rows) and bound_in_time(placement.start):
        return True
    AuditEvent.objects.filter(public_id=event.public_id).delete()
    Reservation.objects.filter(pk=reservation.pk).delete()  # its operation and allocations with it (CASCADE)
    return False


def _store_under_savepoint(reservation: Reservation, placement: Placement, *, actor) -> bool:
    """``_store_in_one`` step by step, with the evictions, under a savepoint that a lost race rolls back."""
    try:
        with transaction.atomic():
            reservation.save(force_insert=True)
            for eviction in placement.evictions:
                reservation_evict(victim_id=eviction.victim_reservation_id, by=reservation, at=eviction.at)
            # The snapshot has just read the GPUs allocatable, in this transaction (``checked``).
            allocation_bind(reservation=reservation, assignments=list(placement.assignments),
                            starts_at=placement.start, ends_at=placement.end, checked=True)
    except CapacityTaken:
        return False
    insert_objects(_place_operation(reservation), _create_event(actor, reservation))
    return True


def _place_on_free(request: Request, now: datetime) -> Placement | None:
    """
    The fast path's placement from free capacity alone, region by region in the order asked:
    the candidates are chosen by fit, and a tighter fit in a later region must not take work
    the first region has room for.
    """
    for region in request.regions:
        in_region = dataclasses.replace(request, regions=(region,))
        for free in FREE_HINT.snapshots(in_region, now=now):
            placement = Planner(free, headroom=settings.MERIDIAN_HEADROOM,
                                spot_in_headroom=settings.MERIDIAN_SPOT_IN_HEADROOM).place(in_region)
            if placement is not None:
                FREE_HINT.took(in_region, placement)
                return placement
    return None


#
# Schedule and evict (scheduler and fast path)
#


@transaction.atomic
def reservation_schedule(
    *, reservation: Reservation, placement: Placement, actor=None, region: Region | None = None,
    checked: bool = False,
) -> None:
    """
    Bind the placement's GPUs and move the reservation to ``scheduled``; evict the spot work the
    placement displaces. All or nothing: CapacityTaken when the database finds a clash. The
    scheduler passes the region and ``checked`` (GPUs verified allocatable for the whole cycle).
    """
    region = region or Region.objects.get(slug=placement.region)
    if reservation.state == R.QUEUED and Reservation.objects.select_for_update().filter(
            pk=reservation.pk, held_at__isnull=False).exists():
        raise Conflict("Staff hold the reservation in the queue: it is placed once they let it go.",
                       code="reservation_held")
    for eviction in placement.evictions:
        reservation_evict(victim_id=eviction.victim_reservation_id, by=reservation, at=eviction.at)
    allocation_bind(reservation=reservation, assignments=list(placement.assignments), starts_at=placement.start,
                    ends_at=placement.end, checked=checked)
    reservation_transition(reservation, R.SCHEDULED, only_from={R.PENDING, R.QUEUED}, reason="",
                           scheduled_at=timezone.now(),
                           starts_at=placement.start, ends_at=placement.end, region=region, score=reservation.score)
    Operation.objects.filter(reservation=reservation, kind=OperationKind.PLACE).exclude(
        state=OperationState.SUCCEEDED).update(state=OperationState.SUCCEEDED, progress=100)
    audit_record(actor=actor, action="reservation.schedule", target=reservation, after=reservation_audited(reservation))
    dispatching.provision_when_due([reservation])


@transaction.atomic
def reservation_schedule_many(*, items: list[tuple[Reservation, Placement, Region]]) -> list[Reservation]:
    """
    ``reservation_schedule`` for a batch of the scheduler's placements that evict nobody, in a
    few statements: lock those still waiting, bind all their GPUs in one INSERT, move them to
    ``scheduled`` in one UPDATE, close their place operations and audit them. Returns those
    moved (the others moved on meanwhile, e.g. were cancelled). CapacityTaken when the database
    finds any clash: nothing of the batch stays, and the caller places it one by one. The GPUs
    must have been checked allocatable (the scheduler does it once per cycle).
    """
    sources = sources_of(RESERVATION_TRANSITIONS, R.SCHEDULED) & {R.PENDING, R.QUEUED}
    waiting = set(Reservation.objects.select_for_update().filter(
        pk__in=[reservation.pk for reservation, _, _ in items], state__in=sources, held_at__isnull=True,
    ).values_list("pk", flat=True))
    moving = [(reservation, placement, region) for reservation, placement, region in items if reservation.pk in waiting]
    if not moving:
        return []
    allocation_bind_many([Binding(reservation, list(placement.assignments), placement.start, placement.end)
                          for reservation, placement, _ in moving], checked=True)
    now = timezone.now()
    moved = []
    for reservation, placement, region in moving:
        reservation.state, reservation.state_reason, reservation.state_changed_at = R.SCHEDULED, "", now
        reservation.scheduled_at, reservation.starts_at, reservation.ends_at = now, placement.start, placement.end
        reservation.region = region
        moved.append(reservation)
    update_rows(Reservation, moved, ["state", "state_reason", "state_changed_at", "scheduled_at", "starts_at",
                                     "ends_at", "region", "score"])
    Operation.objects.filter(reservation__in=moved, kind=OperationKind.PLACE).exclude(
        state=OperationState.SUCCEEDED).update(state=OperationState.SUCCEEDED, progress=100)
    audit_record_many(actor=None, action="reservation.schedule",
                      changes=[(reservation, reservation_audited(reservation)) for reservation in moved])
    reservations_changed(moved)
    dispatching.provision_when_due(moved)
    return moved


def reservation_evict(*, victim_id, by: Reservation | None, at: datetime,
                      cause: str = "Preempted by higher-priority work") -> None:
    """
    Preempt a spot reservation for ``by`` (None: the spot price rose above its max price, ``cause``
    says so). A soft victim keeps its capacity until ``at`` (the grace period the planner left it);
    a hard one loses it at once. Work that has not started ends as ``preempted``; running work is
    released.
    """
    victim = Reservation.objects.select_for_update().get(pk=victim_id)
    if victim.billing_term != BillingTerm.SPOT or victim.state not in (R.SCHEDULED, R.PROVISIONING, R.ACTIVE):
        # It ended or changed since the snapshot: the plan that counted on its GPUs is void.
        raise CapacityTaken("Capacity the plan would have taken from spot work is no longer there.")
    now = timezone.now()
    if victim.eviction_policy == EvictionPolicy.HARD and at <= now + settings.MERIDIAN_SPOT_GRACE:
        at = now  # hard: at once (the planner leaves every victim the soft grace; a later window keeps its start)
    allocation_end(reservation=victim, at=at)
    # The reason names no other reservation: the preemptor may belong to another tenant.
    why = f"{cause}."
    if at > now:  # soft: say when, here as on the instance (spot/termination-time in its metadata)
        why = (f"{cause}: its instances stop at {at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC "
               "(the end of its grace period); save your work before then.")
    if victim.state == R.SCHEDULED and (victim.starts_at is None or victim.starts_at >= at):
        reservation_transition(victim, R.PREEMPTED, reason=why, preempted_by=by)
    else:
        reservation_transition(victim, R.RELEASING, reason=why, preempted_by=by, released_at=at)
    # The victim's tenant reads this event: it says when, not by whom (preempted_by stays internal).
    audit_record(actor=None, action="reservation.preempt", target=victim,
                 after={"at": at.isoformat(), "state": victim.state})
    notices.reservations_notify([victim], notices.EVICTED, at=at, now=now)


#
# Cancel, release, extend
#


@transaction.atomic
def reservation_cancel(*, actor, reservation: Reservation, reason: str = "Cancelled by the tenant.",
                       commitment_ends: bool = False) -> Reservation:
    """
    Cancel a reservation that has not become active: waiting or scheduled ones end ``cancelled``
    and give their capacity back; one being provisioned is released. Active ones are released
    instead (409 says so); ended ones are a 409 naming their state. ``reason`` is its state's reason.
    A commitment's reservation ends only with its commitment (``commitment_ends``).
    """
    now = timezone.now()
    _check_not_committed(reservation, commitment_ends)
    if reservation.state == R.ACTIVE:
        raise Conflict("The reservation is active: release it instead of cancelling.", code="invalid_transition",
                       current_state=reservation.state)
    if reservation.state == R.PROVISIONING:
        allocation_end(reservation=reservation, at=now)
        reservation_transition(reservation, R.RELEASING, only_from={R.PROVISIONING}, reason=reason, released_at=now)
    else:
        reservation_transition(reservation, R.CANCELLED, only_from={R.PENDING, R.QUEUED, R.SCHEDULED}, reason=reason)
        allocation_end(reservation=reservation, at=now)
    Operation.objects.filter(reservation=reservation, kind=OperationKind.PLACE, state=OperationState.PENDING).update(
        state=OperationState.CANCELLED, error="Cancelled before it was placed.")
    if reservation.state == R.RELEASING:
        releasing.release_start(reservation)
    audit_record(actor=None if commitment_ends else actor, action="reservation.cancel", target=reservation,
                 after=reservation_audited(reservation))
    return reservation


def _check_not_committed(reservation: Reservation, commitment_ends: bool) -> None:
    if reservation.committed and not commitment_ends:
        raise Conflict("This reservation holds a commitment's capacity until its term ends, and is billed until "
                       "then; it cannot be cancelled or released on its own.", code="commitment_binding")


@transaction.atomic
def reservation_release(*, actor, reservation: Reservation) -> Reservation:
    """Release a scheduled, provisioning or active reservation early: its capacity is free from now."""
    now = timezone.now()
    _check_not_committed(reservation, False)
    reservation_transition(reservation, R.RELEASING, only_from={R.SCHEDULED, R.PROVISIONING, R.ACTIVE},
                           reason="Released by the tenant.", released_at=now)
    allocation_end(reservation=reservation, at=now)
    releasing.release_start(reservation)
    audit_record(actor=actor, action="reservation.release", target=reservation, after=reservation_audited(reservation))
    return reservation


@transaction.atomic
def reservation_extend(*, actor, reservation: Reservation, by: timedelta) -> Reservation:
    """
    Make a scheduled or active reservation longer, on the same GPUs, if they are free for the
    extra time (409 ``capacity_taken`` otherwise) and the total stays within the maximum duration.
    """
    Tenant.objects.select_for_update().get(pk=reservation.tenant_id)  # as creates do: quota checks in turn
    locked = Reservation.objects.select_for_update().select_related("offering").get(pk=reservation.pk)
    if locked.state not in (R.SCHEDULED, R.PROVISIONING, R.ACTIVE):
        raise Conflict(f"The reservation is '{locked.state}' and cannot be extended.", code="invalid_transition",
                       current_state=locked.state)
    new_end = locked.ends_at + by
    if new_end - locked.starts_at > settings.MERIDIAN_MAX_RESERVATION_DURATION:
        longest = settings.MERIDIAN_MAX_RESERVATION_DURATION
        left_h = max((longest - (locked.ends_at - locked.starts_at)).total_seconds(), 0) / 3600
        raise admission.invalid("hours", f"A reservation lasts at most {longest.days} days: extend it by "
                                         f"{left_h:.4g} hours at most.", code="duration_too_long")
    extra = admission.Ask(name=locked.name, offering=locked.offering, units=locked.units, regions=(),
                          duration=new_end - locked.ends_at)
    admission.check_quota(tenant=locked.tenant, team=locked.team, ask=extra, window_start=locked.ends_at)
    before = reservation_audited(locked)
    allocation_extend(reservation=locked, new_end=new_end)
    Reservation.objects.filter(pk=locked.pk).update(ends_at=new_end, duration=locked.duration + by)
    locked.refresh_from_db()
    audit_record(actor=actor, action="reservation.extend", target=locked, before=before,
                 after=reservation_audited(locked))
    return locked


#
# Instances
#


def instance_console(*, instance: Instance) -> tuple[str, bool]:
    """
    The last MERIDIAN_CONSOLE_OUTPUT_BYTES of what the instance printed on its serial console, and
    whether earlier output was cut; 503 when its driver cannot be reached now.
    """
    if instance.state not in (InstanceState.PROVISIONING, InstanceState.ACTIVE):
        return "", False
    try:
        text = steps.console_output(instance)
    except DriverError as exc:
        raise Unavailable(f"The console of {instance.name} cannot be read now ({exc}); try again shortly.",
                          code="console_unavailable") from None
    data = text.encode()
    limit = settings.MERIDIAN_CONSOLE_OUTPUT_BYTES
    if len(data) <= limit:
        return text, False
    return data[-limit:].decode(errors="ignore"), True
