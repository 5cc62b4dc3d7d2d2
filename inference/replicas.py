"""
Replicas follow their endpoint: started as reservations (scheduled, attested, isolated and billed
like any other work), serving once active and healthy, drained out of the load balancer before
their reservation is released, replaced when lost. ``converge`` is idempotent: run it twice, or
after a worker died half way, and it does only what is still missing.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from cloud.models import Region
from core.errors import DomainError
from inference.choices import LIVE_REPLICA_STATES, Decision, EndpointState, ReplicaState
from inference.loads import region_load
from inference.models import BalancerState, Endpoint, Replica, ScalingDecision
from inference.probes import healthy
from provisioning import admission
from provisioning.choices import ReservationState as R
from provisioning.models import Instance
from provisioning.services import reservation_cancel, reservation_create, reservation_release
from provisioning.transitions import TERMINAL_STATES
from tenants.choices import TenantRole
from tenants.events import emit
from tenants.models import Membership
from tenants.scoping import Principal

log = logging.getLogger("meridian.inference")
RELEASABLE = (R.SCHEDULED, R.PROVISIONING, R.ACTIVE)
CANCELLABLE = (R.PENDING, R.QUEUED)
# A replica whose reservation ends this soon is replaced ahead of its end (a new one serves first).
RENEW_BEFORE = timedelta(hours=1)


def converge(endpoint_id) -> dict:
    """Bring the endpoint's replicas to what it wants now; returns what changed."""
    done = {"started": 0, "serving": 0, "lost": 0, "draining": 0, "released": 0}
    with transaction.atomic():
        endpoint = (Endpoint.objects.select_for_update(of=("self",)).select_related("tenant", "offering", "team")
                    .filter(pk=endpoint_id).first())
        if endpoint is None or endpoint.state == EndpointState.DELETED:
            return done
        _follow(endpoint, done)
        if endpoint.state == EndpointState.DELETING:
            live = _live(endpoint)
            _drain(live, len(live), done, reason="the endpoint is deleted")
        else:
            _scale(endpoint, done)
    done["released"] = release_drained(endpoint_id)
    _finish_delete(endpoint_id)
    return done


def _live(endpoint: Endpoint) -> list[Replica]:
    return list(endpoint.replicas.filter(state__in=LIVE_REPLICA_STATES).select_related("reservation"))


def _follow(endpoint: Endpoint, done: dict) -> None:
    """Each live replica's state from its reservation and its health check."""
    live = _live(endpoint)
    instances: dict = {}
    for instance in Instance.objects.filter(reservation_id__in=[r.reservation_id for r in live]).select_related("node"):
        instances.setdefault(instance.reservation_id, []).append(instance)
    now = timezone.now()
    for replica in live:
        reservation = replica.reservation
        if reservation.state in TERMINAL_STATES or reservation.state == R.RELEASING:
            record(endpoint, Decision.REPLACE, len(live), len(live) - 1,
                   f"replica {reservation.name} lost ({reservation.state}: {reservation.state_reason[:200]})")
            _set(replica, ReplicaState.GONE, f"its reservation is {reservation.state}", gone_at=now)
            done["lost"] += 1
            continue
        ok = reservation.state == R.ACTIVE and any(
            healthy(i, port=endpoint.port, path=endpoint.health_path) for i in instances.get(reservation.pk, []))
        if ok and replica.state == ReplicaState.STARTING:
            _set(replica, ReplicaState.SERVING, "active and healthy", serving_since=now)
            done["serving"] += 1
        elif not ok and replica.state == ReplicaState.SERVING:
            _set(replica, ReplicaState.STARTING, f"not serving: reservation {reservation.state}, health check failed "
                                                 "or its node is not sound")
        elif replica.state == ReplicaState.STARTING and reservation.state in (R.PENDING, R.QUEUED):
            replica.state_reason = f"waiting: {reservation.state_reason}"[:300]
            replica.save(update_fields=["state_reason"])


def _scale(endpoint: Endpoint, done: dict) -> None:
    """
    Start what is missing (where the burst rule says) and drain the surplus. Replicas that are
    leaving -- burst ones once the endpoint is back home, and those whose reservation ends within
    RENEW_BEFORE -- do not count: others start in their place, and each leaving one drains once the
    serving replicas are enough without it.
    """
    target = endpoint.desired_replicas
    live = _live(endpoint)
    if endpoint.bursting:  # replicas still waiting at home start over where the burst sends them
        stuck = [r for r in live if not r.burst and r.state == ReplicaState.STARTING
                 and r.reservation.state in (R.PENDING, R.QUEUED)]
        _drain(stuck, len(stuck), done, reason="moved: it waited at home while the endpoint bursts")
        live = _live(endpoint)
    now = timezone.now()
    staying = [r for r in live if not _leaving(r, endpoint, now)]
    for _ in range(max(0, target - len(staying))):
        if not _start(endpoint, burst=endpoint.bursting):
            break
        done["started"] += 1
    live = _live(endpoint)
    staying = [r for r in live if not _leaving(r, endpoint, now)]
    _drain(staying, len(staying) - target, done, reason="scaled in")
    leaving = [r for r in live if _leaving(r, endpoint, now)]
    _drain(leaving, len(leaving), done, reason="replaced: another replica serves in its place",
           keep_serving=target, serving=sum(1 for r in _live(endpoint) if r.state == ReplicaState.SERVING))


def _leaving(replica: Replica, endpoint: Endpoint, now) -> bool:
    """A burst replica once the endpoint is back home, or one whose reservation is about to end."""
    ends = replica.reservation.ends_at
    return (replica.burst and not endpoint.bursting) or (ends is not None and ends - now <= RENEW_BEFORE)


def _drain(candidates: list[Replica], count: int, done: dict, *, reason: str, keep_serving: int = 0,
           serving: int | None = None) -> None:
    """
    Take ``count`` of ``candidates`` out: burst ones first, then those not serving yet, newest first;
    never leaving fewer than ``keep_serving`` of the ``serving`` replicas serving.
    """
    if count <= 0:
        return
    if serving is None:
        serving = sum(1 for r in candidates if r.state == ReplicaState.SERVING)
    order = sorted(candidates, key=lambda r: (not r.burst, r.state == ReplicaState.SERVING,
                                              -r.created_at.timestamp()))
    now = timezone.now()
    for replica in order:
        if count <= 0:
            break
        if replica.state == ReplicaState.SERVING:
            if serving - 1 < keep_serving:
                continue
            serving -= 1
        _set(replica, ReplicaState.DRAINING, reason, draining_since=now)
        done["draining"] += 1
        count -= 1


def _start(endpoint: Endpoint, *, burst: bool) -> bool:
    """One new replica (a reservation of one unit); False when admission refuses it (said in a decision)."""
    slugs = burst_regions(endpoint) if burst else [endpoint.home]
    if not slugs:
        record(endpoint, Decision.HOLD, endpoint.desired_replicas, endpoint.desired_replicas,
               "no region after home has room outside its on-demand headroom: the new replica waits")
        return False
    regions = tuple(Region.objects.filter(slug__in=slugs))
    regions = tuple(sorted(regions, key=lambda r: slugs.index(r.slug)))
    number = endpoint.replicas.count() + 1
    ask = admission.Ask(
        name=f"{endpoint.name}-r{number}", offering=endpoint.offering, units=1, regions=regions,
        duration=timedelta(hours=settings.MERIDIAN_ENDPOINT_REPLICA_HOURS), image=endpoint.image,
        environment=tuple({**endpoint.environment, "MERIDIAN_ENDPOINT": endpoint.name,
                           "PORT": str(endpoint.port)}.items()),
        managed_by=f"endpoint:{endpoint.pk}")
    try:
        with transaction.atomic():
            reservation = reservation_create(actor=acting_for(endpoint), ask=ask, team=endpoint.team)
            Replica.objects.create(tenant=endpoint.tenant, endpoint=endpoint, reservation=reservation, burst=burst,
                                   state_reason=reservation.state_reason[:300])
    except DomainError as refused:
        record(endpoint, Decision.HOLD, endpoint.desired_replicas, endpoint.desired_replicas,
               f"a new replica was refused: {refused.detail if isinstance(refused.detail, str) else refused}"[:300])
        return False
    return True


def burst_regions(endpoint: Endpoint) -> list[str]:
    """
    Where burst replicas go: the regions after home, in order, that are below the on-demand headroom
    (MERIDIAN_HEADROOM of a region's GPUs stays free for on-demand bursts: a burst never takes it).
    """
    now = timezone.now()
    return [r for r in endpoint.regions[1:] if region_load(r, endpoint, now) < 1 - settings.MERIDIAN_HEADROOM]


def acting_for(endpoint: Endpoint) -> Principal:
    """Replicas are the team's work, made on its behalf: as the endpoint's creator, or an owner if they left."""
    user = endpoint.created_by
    if user is None or not Membership.objects.filter(tenant=endpoint.tenant, user=user).exists():
        owner = Membership.objects.filter(tenant=endpoint.tenant, role=TenantRole.OWNER).select_related("user").first()
        user = owner.user if owner else user
    return Principal(user=user, tenant=endpoint.tenant, role=TenantRole.ADMIN)


def release_drained(endpoint_id) -> int:
    """Release the drained replicas: drained long enough, and out of a balancer configuration applied since."""
    applied = BalancerState.objects.filter(pk=1).values_list("checked_at", flat=True).first()
    if applied is None:
        return 0
    cutoff = timezone.now() - timedelta(seconds=settings.MERIDIAN_ENDPOINT_DRAIN_SECONDS)
    released = 0
    due = Replica.objects.filter(endpoint_id=endpoint_id, state=ReplicaState.DRAINING, draining_since__lte=cutoff,
                                 draining_since__lt=applied).select_related("reservation", "endpoint")
    for replica in due:
        try:
            with transaction.atomic():
                _give_back(replica)
                _set(replica, ReplicaState.GONE, "released after draining", gone_at=timezone.now())
            released += 1
        except DomainError:
            log.exception("replica %s could not be released; the next pass tries again", replica.pk)
    return released


def _give_back(replica: Replica) -> None:
    reservation = replica.reservation
    actor = acting_for(replica.endpoint)
    reservation.refresh_from_db()
    if reservation.state in RELEASABLE:
        reservation_release(actor=actor, reservation=reservation)
    elif reservation.state in CANCELLABLE:
        reservation_cancel(actor=actor, reservation=reservation, reason="Its endpoint needs one replica fewer.")


def _finish_delete(endpoint_id) -> None:
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().filter(pk=endpoint_id, state=EndpointState.DELETING).first()
        if endpoint and not endpoint.replicas.exclude(state=ReplicaState.GONE).exists():
            endpoint.state = EndpointState.DELETED
            endpoint.save(update_fields=["state"])


def _set(replica: Replica, state: str, reason: str, **also) -> None:
    replica.state, replica.state_reason = state, reason[:300]
    for name, value in also.items():
        setattr(replica, name, value)
    replica.save(update_fields=["state", "state_reason", *also])


def record(endpoint: Endpoint, action: str, before: int, after: int, reason: str, inputs: dict | None = None,
           at=None) -> ScalingDecision | None:
    """
    A decision on the endpoint, with the figures it was made on; the tenant's webhooks hear of it.
    A change held back again, right after a hold, is not recorded again (None): every pass would.
    """
    if action == Decision.HOLD and endpoint.decisions.order_by("-at", "-id").values_list(
            "action", flat=True).first() == Decision.HOLD:
        return None
    decision = ScalingDecision.objects.create(tenant_id=endpoint.tenant_id, endpoint=endpoint,
                                              at=at or timezone.now(), action=action, replicas_before=before,
                                              replicas_after=after, reason=reason[:300], inputs=dict(inputs or {}))
    emit(endpoint.tenant_id, f"endpoint.{action}", {
        "endpoint": str(endpoint.pk), "name": endpoint.name, "replicas_before": before, "replicas_after": after,
        "reason": decision.reason, "inputs": decision.inputs}, team_id=endpoint.team_id)
    return decision
