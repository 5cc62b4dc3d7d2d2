"""
Automatic replacement of failed hardware (DESIGN.md, Reservations: "a reservation whose hardware
failed goes back to ``provisioning`` on a replacement").

``node_failed`` is the one entry point: failure detection (missed heartbeats, fatal XIDs) calls it,
and so does the lifecycle when a step fails a node for good under other tenants' work. It
- marks the node faulty (never sold again until repaired and validated: ``node_repair_done``),
  its shared GPUs that held tenants' memory quarantined;
- opens one platform incident for the node, and one tenant incident per live reservation it hit
  (which GPUs, when the impact began, when it was detected; ``restored_at`` when the tenant has
  working hardware again -- time to detect and time to restore are read from them);
- tells each tenant in-app what failed and that a replacement is under way;
- replaces each reservation's lost units (``reservation_replace``).

Replacement of a reservation: the instances on the failed node fail, their ports leave the
tenant's network (``ports_abandon``) and their allocations end when the failure is handled
(history kept; never earlier, so no spend already counted is taken back -- the SLA credits the
outage from the impact's start, ``provisioning.sla.accounting``). New capacity is picked in the failed node's
fabric -- always, the tenant's IB-VPC lives there -- spares first (same leaf switch, then same
pod, then any leaf), then, when no spare fits and MERIDIAN_REPLACEMENT_FROM_POOL is on, ordinary
free capacity of that fabric (the platform incident says so). It is bound for the rest of the
window under the database's no-overlap rule, the reservation moves ``active`` -> ``provisioning``,
and the offering's provisioning pipeline runs for the new instances only: it joins them to the
same VPC and attests them before the hand-over. When the last of them is handed over the
reservation is ``active`` again, the tenant incidents get ``restored_at`` and the tenant is told
the new access details.

When nothing fits, the reservation waits in ``provisioning`` with its healthy instances still
serving (a reservation of several units keeps them), the tenant is told, and the lifecycle tick
tries again; after MERIDIAN_REPLACEMENT_WAIT it fails with the reason and everything is cleaned.
A replacement attempt that fails for good on its new hardware is placed again, up to
MERIDIAN_PROVISION_FAILURES attempts in all.

``gpus_failed`` is the same for GPUs of a shared host that failed while the host goes on: those
GPUs are held, and only the instances using them are cleaned (by the release pipeline, their
healthy GPUs scrubbed) and placed again; a failed GPU of a bare-metal server fails the server.

Idempotent: a second call for a failure already handled opens and starts nothing; a reservation
whose units are all live again (or being provisioned) is not replaced twice.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.urls import reverse
from django.utils import timezone

from cloud.choices import GPUState, Health, NodePool, NodeState, OfferingKind
from cloud.models import GPU, Node
from cloud.services import node_transition
from core.errors import Conflict
from provisioning import addresses, cloud_init, lock_objects
from provisioning.allocations import CapacityTaken, allocation_bind, allocation_end
from provisioning.choices import InstanceState, OperationKind, OperationState
from provisioning.choices import ReservationState as R
from provisioning.lifecycle import dispatch as dispatching
from provisioning.lifecycle import moves
from provisioning.lifecycle import release as releasing
from provisioning.lifecycle import start as starting
from provisioning.lifecycle.replacement_picks import Pick, pick
from provisioning.lifecycle.steps import PIPELINES
from provisioning.models import Allocation, Instance, Operation, Reservation
from provisioning.networks.ports import ports_abandon
from security.audit import audit_record
from security.models import Incident
from tenants.notifications import notify

log = logging.getLogger(__name__)
N = NodeState
NODE_FAILURE = "node_failure"  # the incident kind, platform (no tenant) and per affected reservation
LIVE = (R.ACTIVE, R.PROVISIONING)
LIVE_INSTANCES = (InstanceState.PROVISIONING, InstanceState.ACTIVE)
UNFINISHED = (OperationState.PENDING, OperationState.RUNNING)
# Tries to bind picked capacity that another writer takes first, before the tick takes over.
BIND_TRIES = 3


#
# The entry point
#


@transaction.atomic
def node_failed(*, node: Node, cause: str, summary: str, evidence: dict, impact_started_at: datetime | None,
                detected_at: datetime | None = None) -> Incident:
    """
    A node failed for good (``cause``: a stable code such as ``heartbeat_lost`` or ``xid_79``).
    Mark it faulty, open the platform incident and one per live reservation it hit, tell those
    tenants, and start replacing their lost units. ``impact_started_at``: when the tenants lost
    the hardware (the last heartbeat); ``detected_at``: when detection decided (default now).
    Returns the platform incident. A second call for a failure already handled (the node faulty,
    an open incident for this cause) returns that incident and starts nothing.
    """
    return _fail_node(node=node, cause=cause, summary=summary, evidence=evidence,
                      impact_started_at=impact_started_at, detected_at=detected_at)


@transaction.atomic
def gpus_failed(*, node: Node, gpu_ids: list, cause: str, summary: str, evidence: dict,
                impact_started_at: datetime | None, detected_at: datetime | None = None) -> Incident:
    """
    GPUs of a shared host failed for good while the host goes on: they are quarantined (freed
    only by the node's validation), and the instances using them -- VMs, containers, slots -- are
    cleaned and placed again on healthy GPUs, with the same incidents and messages as
    ``node_failed``. A bare-metal server is sold whole: a failed GPU fails the node.
    """
    if node.pool != NodePool.SHARED:
        return _fail_node(node=node, cause=cause, summary=summary, evidence=evidence,
                          impact_started_at=impact_started_at, detected_at=detected_at)
    return _fail_node(node=node, cause=cause, summary=summary, evidence=evidence, impact_started_at=impact_started_at,
                      detected_at=detected_at, gpu_ids=sorted(str(g) for g in gpu_ids))


def node_failed_in_lifecycle(node: Node, reason: str, *, reservation_id=None) -> None:
    """
    A lifecycle step failed ``node`` for good (it is faulty already): other tenants' live work on
    it is replaced too. ``reservation_id``, the reservation whose step failed, is left to the
    lifecycle's own handling. Incidents open now; the replacements start on the next tick, so
    this takes no reservation lock inside the step's transaction.
    """
    if not live_reservations(node.pk, timezone.now()).exclude(pk=reservation_id).exists():
        return  # nobody else's work is on it: the lifecycle's own handling is all there is
    now = timezone.now()
    _fail_node(node=node, cause="step_failed", summary=reason, evidence={}, impact_started_at=now,
               detected_at=now, replace_now=False, exclude=reservation_id)


def _fail_node(*, node, cause, summary, evidence, impact_started_at, detected_at, replace_now: bool = True,
               exclude=None, gpu_ids: list[str] | None = None) -> Incident:
    """The work of node_failed; ``gpu_ids``: only these GPUs of a shared host failed (the host goes on)."""
    now = timezone.now()
    detected_at = detected_at or now
    impact_started_at = min(impact_started_at or detected_at, detected_at)
    if replace_now:
        # Reservations first, then the node: the order the lifecycle takes them in (a failed step
        # holds its reservation, then marks the node), so the two never wait on each other.
        ids = list(live_reservations(node.pk, now, gpu_ids).values_list("pk", flat=True))
        lock_objects.reservations_lock(ids)
    node = lock_objects.node_lock(node.pk)
    platform, handled = _known(node, cause, gpu_ids)
    if handled:
        return platform  # known and handled: nothing opens or starts twice
    if platform is None:
        platform = _open(kind=NODE_FAILURE, node_id=node.pk, fabric_id=node.fabric_id, tenant_id=None,
                         summary=f"{node.hostname}: {summary}"[:500], gpu_ids=gpu_ids or [],
                         gpus_affected=len(gpu_ids or []), evidence={**evidence, "cause": cause, **_scope(gpu_ids)},
                         impact_started_at=impact_started_at, detected_at=detected_at)
    if gpu_ids is None:
        _make_faulty(node, f"{cause}: {summary}")
    else:
        GPU.objects.filter(node=node, pk__in=gpu_ids).update(state=GPUState.QUARANTINED, health=Health.FAILED)
    opened = []
    for reservation in live_reservations(node.pk, now, gpu_ids).exclude(pk=exclude).select_related(
            "tenant", "team", "offering"):
        if any(i.evidence.get("failed_gpus") == gpu_ids
               for i in Incident.objects.filter(kind=NODE_FAILURE, reservation_id=reservation.pk, node_id=node.pk,
                                                restored_at__isnull=True, resolved_at__isnull=True)):
            continue  # this failure of its hardware is being replaced already
        opened.append(_tenant_incident(reservation, node, cause=cause, platform=platform, now=now, gpu_ids=gpu_ids,
                                       impact_started_at=impact_started_at, detected_at=detected_at))
    audit_record(actor=None, action="node.failed" if gpu_ids is None else "node.gpus_failed", target=node,
                 tenant_id=None, after={"cause": cause, "summary": summary[:500], "incident": str(platform.pk),
                                        **({"gpus": gpu_ids} if gpu_ids is not None else {}),
                                        "reservations": [str(incident.reservation_id) for incident in opened]})
    if replace_now:
        for incident in opened:
            try:
                with transaction.atomic():
                    reservation_replace(incident.reservation_id, now=now)
            except Exception:
                log.exception("Replacing reservation %s after %s failed; the lifecycle tick tries again.",
                              incident.reservation_id, node.hostname)
    return platform


def live_reservations(node_id, now, gpu_ids=None):
    """Reservations in provisioning or active that hold capacity on the node (or on these GPUs of it) now."""
    holding = Allocation.objects.filter(node_id=node_id, ends_at__gt=now)
    if gpu_ids is not None:
        holding = holding.filter(gpu_id__in=gpu_ids)
    return Reservation.objects.filter(state__in=LIVE, pk__in=holding.values("reservation_id"))


def _scope(gpu_ids) -> dict:
    """What failed, kept on the incidents: the node (nothing said), or only these of its GPUs."""
    return {} if gpu_ids is None else {"failed_gpus": gpu_ids}


def _known(node, cause: str, gpu_ids) -> tuple[Incident | None, bool]:
    """The open platform incident of this very failure, and whether it is handled (the node faulty, the GPUs held)."""
    for incident in Incident.objects.filter(kind=NODE_FAILURE, node_id=node.pk, tenant_id__isnull=True,
                                            resolved_at__isnull=True, evidence__cause=cause):
        if incident.evidence.get("failed_gpus") != gpu_ids:
            continue
        if gpu_ids is None:
            return incident, node.state == N.FAULTY
        return incident, not GPU.objects.filter(pk__in=gpu_ids).exclude(state=GPUState.QUARANTINED).exists()
    return None, False


def _hit(reservation, node, gpu_ids, now) -> tuple[list[str], list[Instance]]:
    """
    The reservation's GPUs out of service and its instances lost: all it holds on a failed node;
    with only ``gpu_ids`` failed, the instances using one of them and every GPU of those.
    """
    held = Allocation.objects.filter(reservation=reservation, node=node, ends_at__gt=now)
    lost = _lost(reservation, node, gpu_ids)
    if gpu_ids is not None:
        held = held.filter(gpu_id__in=gpu_ids)
    out = {str(g) for g in held.values_list("gpu_id", flat=True)} | {d["gpu_id"] for i in lost for d in i.devices}
    return sorted(out), lost


def _make_faulty(node: Node, reason: str) -> None:
    """Faulty (where the table allows it) and unhealthy; a shared host's GPUs that held tenants' memory are held."""
    if node.state != N.FAULTY:
        try:
            node_transition(actor=None, node=node, target=N.FAULTY, reason=reason)
        except Conflict:
            log.warning("Could not mark %s faulty from %s: %s", node.hostname, node.state, reason)
    Node.objects.filter(pk=node.pk).exclude(health=Health.FAILED).update(health=Health.FAILED)
    if node.pool == NodePool.SHARED:
        # Never scrubbed: held until the repaired node passes validation (which frees them).
        for state in (GPUState.ALLOCATED, GPUState.SCRUBBING):
            moves.gpus_move(node.gpus.filter(state=state).values_list("pk", flat=True), state,
                                 GPUState.QUARANTINED)


def _open(*, detected_at, **fields) -> Incident:
    return Incident.objects.create(detected_at=detected_at or timezone.now(), **fields)


def _tenant_incident(reservation, node, *, cause, platform, now, impact_started_at, detected_at,
                     gpu_ids=None) -> Incident:
    """The tenant's incident for the reservation the node (or GPUs) failed under, and the message that tells it."""
    hit, instances = _hit(reservation, node, gpu_ids, now)
    lost = [i.name for i in instances]
    incident = _open(
        kind=NODE_FAILURE, tenant_id=reservation.tenant_id, node_id=node.pk, fabric_id=node.fabric_id,
        reservation_id=reservation.pk, gpu_ids=hit, gpus_affected=len(hit),
        impact_started_at=impact_started_at, detected_at=detected_at,
        summary=f"Hardware failure under reservation {reservation.name}: {_what(reservation, node, lost)} "
                "stopped working; a replacement is under way."[:500],
        evidence={"cause": cause, "platform_incident": str(platform.pk), "instances": lost,
                  "replacement": {"state": "pending"}, **_scope(gpu_ids)},
    )
    _tell(reservation, kind="reservation.hardware_failed", title=f"Hardware failure: {reservation.name}",
          body=f"{_what(reservation, node, lost, first=True)} stopped working ({cause}) at "
               f"{impact_started_at:%Y-%m-%d %H:%M:%S} UTC. A replacement is being provisioned in the same "
               "network (IB-VPC); its access details will follow here.")
    return incident


def _what(reservation, node, instances: list[str], *, first: bool = False) -> str:
    """The failed hardware as its tenant may read it: a server is theirs, a shared host's name is not."""
    if reservation.offering.kind == OfferingKind.BARE_METAL:
        what = f"server {node.hostname}"
    else:
        what = "the host under " + (", ".join(instances) or "your instances")
    return what[:1].upper() + what[1:] if first else what


def _tell(reservation, *, kind: str, title: str, body: str) -> None:
    notify(reservation.tenant, team=reservation.team, kind=kind, title=title, body=body,
           link=reverse("reservation-detail", args=[reservation.pk]))


#
# Replacing a reservation's lost units
#


def open_incidents(reservation) -> list[Incident]:
    """The reservation's node-failure incidents that are not restored yet, oldest first."""
    return open_incidents_of([reservation.pk]).get(reservation.pk, [])


def open_incidents_of(reservation_ids) -> dict:
    """``open_incidents`` of several reservations in one query, by reservation key (those with none left out)."""
    found: dict = {}
    for incident in Incident.objects.filter(kind=NODE_FAILURE, reservation_id__in=list(reservation_ids),
                                            restored_at__isnull=True, resolved_at__isnull=True).order_by("detected_at"):
        found.setdefault(incident.reservation_id, []).append(incident)
    return found


def reservation_replace(reservation_id, *, now: datetime | None = None) -> str:
    """
    Give up the reservation's units on its failed nodes and provision replacements for every unit
    it lacks (inside the caller's transaction). Returns ``started``, ``provisioning`` (nothing
    lacks, an attempt is under way), ``restored``, ``waiting`` (no capacity), ``failed`` (waited
    too long) or ``skipped`` (it moved on, or has no open incident).
    """
    # A tick's moment may be seconds old by the time it gets here: capacity is taken from now on
    # (nothing may be bound to start long ago: allocations._check_fresh).
    now = max(now or timezone.now(), timezone.now())
    reservation = (Reservation.objects.select_for_update(of=("self",)).select_related("offering", "tenant", "team")
                   .filter(pk=reservation_id).first())
    if reservation is None:
        return "skipped"
    if reservation.state not in LIVE:
        # Released, cancelled, reclaimed, expired while it waited: nothing is replaced, and its
        # incidents end (not restored) so they stop counting as an outage.
        Incident.objects.filter(pk__in=[i.pk for i in open_incidents(reservation)]).update(resolved_at=now)
        return "skipped"
    incidents = open_incidents(reservation)
    if not incidents:
        return "skipped"
    failed = {n.pk: n for n in Node.objects.filter(pk__in={i.node_id for i in incidents}).select_related("leaf")}
    for incident in incidents:
        _give_up(reservation, failed[incident.node_id], at=now, gpu_ids=incident.evidence.get("failed_gpus"))
    _stop_emptied(reservation)
    missing = reservation.units - reservation.instances.filter(state__in=LIVE_INSTANCES).count()
    if missing <= 0:
        if _provisioning(reservation):
            return "provisioning"
        _activate(reservation, incidents, now)
        return "restored"
    if reservation.ends_at is None or reservation.ends_at <= now:
        return "skipped"  # its window is over: the tick releases it
    where = failed[incidents[-1].node_id]  # the latest failure: its leaf is where to look first
    picks = _place(reservation, where, missing, now)
    if picks:
        _started(reservation, incidents, where, picks)
        return "started"
    if now - incidents[0].detected_at >= settings.MERIDIAN_REPLACEMENT_WAIT:
        waited = int(settings.MERIDIAN_REPLACEMENT_WAIT.total_seconds() // 60)
        _fail(reservation, incidents, f"No replacement hardware became free within {waited} min after a "
                                      "hardware failure; the reservation failed and its capacity was given back.")
        return "failed"
    _wait(reservation, incidents, now)
    return "waiting"


def _lost(reservation, node: Node, gpu_ids=None) -> list[Instance]:
    """The reservation's live instances on the node (those using one of ``gpu_ids``, when given)."""
    lost = list(reservation.instances.filter(node=node, state__in=LIVE_INSTANCES).order_by("index"))
    if gpu_ids is not None:
        lost = [i for i in lost if {d["gpu_id"] for d in i.devices} & set(gpu_ids)]
    return lost


def _give_up(reservation, node: Node, *, at: datetime, gpu_ids=None) -> None:
    """
    The units on failed hardware, their allocations ended at ``at``. A dead node's instances fail
    and their ports leave the network at once; on a host that goes on (``gpu_ids`` failed) they
    are cleaned by the release pipeline -- their healthy GPUs scrubbed -- like any release.
    """
    lost = _lost(reservation, node, gpu_ids)
    if gpu_ids is not None:
        _end_instances(reservation, lost, at=at)
        if lost:
            releasing.clean_start(reservation, lost)
        held = Allocation.objects.filter(reservation=reservation, node=node, gpu_id__in=gpu_ids, ends_at__gt=at)
    else:
        if lost:
            ports_abandon(lost)
            Instance.objects.filter(pk__in=[i.pk for i in lost]).update(state=InstanceState.FAILED)
            addresses.release(i.pk for i in lost)
            cloud_init.drives_forget(i.pk for i in lost)
            if reservation.offering.kind != OfferingKind.BARE_METAL and reservation.offering.slots_per_gpu == 1:
                moves.gpus_move({d["gpu_id"] for i in lost for d in i.devices}, GPUState.ALLOCATED,
                                     GPUState.QUARANTINED)
        held = Allocation.objects.filter(reservation=reservation, node=node, ends_at__gt=at)
    held.filter(starts_at__gte=at).delete()  # never began before the failure
    held.update(ends_at=at)


def _end_instances(reservation, instances, *, at: datetime) -> None:
    """End the allocations under these instances at ``at`` (a failed attempt's capacity goes back)."""
    addresses.release(instance.pk for instance in instances)  # lost with their hardware
    cloud_init.drives_forget(instance.pk for instance in instances)
    for instance in instances:
        for d in instance.devices:
            held = Allocation.objects.filter(reservation=reservation, gpu_id=d["gpu_id"], mem_lo=d["mem_lo"],
                                             mem_hi=d["mem_hi"], ends_at__gt=at)
            held.filter(starts_at__gte=at).delete()
            held.update(ends_at=at)


def _provisioning(reservation):
    return Operation.objects.filter(reservation=reservation, kind=OperationKind.PROVISION, state__in=UNFINISHED)


def _stop_emptied(reservation) -> None:
    """An attempt whose every instance was on failed hardware has nothing left to do: it stops."""
    own = Instance.objects.filter(provisioned_by=OuterRef("pk"), state=InstanceState.PROVISIONING)
    _provisioning(reservation).exclude(Exists(own)).update(
        state=OperationState.FAILED, error="Its hardware failed; a replacement takes over.", finished_at=timezone.now())


def _place(reservation, where: Node, missing: int, now: datetime) -> list[Pick]:
    """Pick and bind capacity for up to ``missing`` units, start their provisioning; the picks, or none."""
    exclude: set = set()
    for _ in range(BIND_TRIES):
        picks = pick(reservation, where, missing, start=now, end=reservation.ends_at, exclude=exclude)
        if not picks:
            return []
        try:
            with transaction.atomic():
                allocations = _bind(reservation, picks, now)
        except Conflict:  # CapacityTaken, or a node moved meanwhile: another writer won it
            exclude |= {p.node.pk for p in picks}
            continue
        steps = PIPELINES[(OperationKind.PROVISION, reservation.offering.kind)]
        operation = Operation.objects.create(tenant_id=reservation.tenant_id, reservation=reservation,
                                             kind=OperationKind.PROVISION, step=steps[0].name)
        starting.instances_create(reservation, allocations, operation)
        dispatching.enqueue(operation, steps[0].name)
        return picks
    return []


def _bind(reservation, picks: list[Pick], now: datetime) -> list[Allocation]:
    """Allocate the picks from now to the end of the window and take their nodes or GPUs."""
    assignments = [a for p in picks for a in p.assignments]
    # The picks were checked just now (spares included, which allocation_bind's own check refuses).
    allocation_bind(reservation=reservation, assignments=assignments, starts_at=now, ends_at=reservation.ends_at,
                    checked=True)
    offering = reservation.offering
    if offering.kind == OfferingKind.BARE_METAL:
        for p in picks:
            node_transition(actor=None, node=p.node, target=N.ALLOCATED, only_from=frozenset({N.AVAILABLE}),
                            reason=f"Replacement for reservation {reservation.pk}.")
    elif offering.slots_per_gpu == 1:
        gpu_ids = {a.gpu_id for a in assignments}
        if moves.gpus_move(gpu_ids, GPUState.AVAILABLE, GPUState.ALLOCATED) != len(gpu_ids):
            raise CapacityTaken("A picked GPU was taken meanwhile.")
    return list(Allocation.objects.filter(reservation=reservation, gpu_id__in={a.gpu_id for a in assignments},
                                          starts_at=now).select_related("gpu", "node")
                .order_by("node__hostname", "gpu__index", "mem_lo"))


def _started(reservation, incidents, where: Node, picks: list[Pick]) -> None:
    """Record where the replacement goes (the platform incident says whether a spare took it)."""
    bare_metal = reservation.offering.kind == OfferingKind.BARE_METAL
    if reservation.state == R.ACTIVE:
        moves.reservation_move(reservation, R.PROVISIONING, only_from={R.ACTIVE},
                                    reason="Hardware failed; replacement hardware is being provisioned.")
    else:
        Reservation.objects.filter(pk=reservation.pk, state=R.PROVISIONING).update(
            state_reason="Hardware failed; replacement hardware is being provisioned.")
    record = {"reservation": str(reservation.pk), "nodes": [p.node.hostname for p in picks],
              "spares": sum(p.spare for p in picks), "same_leaf": sum(p.same_leaf for p in picks)}
    if not all(p.spare for p in picks):
        log.warning("No spare fitted reservation %s after %s failed: ordinary capacity of fabric %s taken (%s).",
                    reservation.pk, where.hostname, where.fabric_id, ", ".join(record["nodes"]))
        record["note"] = "no spare fitted: ordinary free capacity of the fabric was taken"
    platform = (Incident.objects.select_for_update().filter(kind=NODE_FAILURE, node_id=where.pk,
                                                            tenant_id__isnull=True).order_by("-detected_at").first())
    if platform is not None:
        platform.evidence = {**platform.evidence, "replacements": [*platform.evidence.get("replacements", []), record]}
        platform.save(update_fields=["evidence"])
    attempt = {"state": "provisioning", "units": len(picks), **({"nodes": record["nodes"]} if bare_metal else {})}
    _mark(incidents, attempt)
    latest = incidents[-1]
    why = (f"{_what(reservation, where, latest.evidence.get('instances') or [], first=True)} failed "
           f"({latest.evidence.get('cause', 'hardware failure')}) at "
           f"{latest.impact_started_at or latest.detected_at:%Y-%m-%d %H:%M:%S} UTC; {len(picks)} unit(s) placed "
           "again on other hardware in the same network.")
    change = starting.replaced(reservation, why, timezone.now())
    Reservation.objects.filter(pk=reservation.pk).update(**change)
    for name, value in change.items():
        setattr(reservation, name, value)
    audit_record(actor=None, action="reservation.replace", target=reservation,
                 after={"state": reservation.state, "units": len(picks),
                        **({"nodes": record["nodes"]} if bare_metal else {})})


def _mark(incidents, replacement: dict) -> None:
    for incident in incidents:
        incident.evidence = {**incident.evidence, "replacement": replacement}
        Incident.objects.filter(pk=incident.pk).update(evidence=incident.evidence)


def _wait(reservation, incidents, now: datetime) -> None:
    """Nothing fits: the reservation waits in ``provisioning`` (its healthy units go on); the tenant is told once."""
    until = incidents[0].detected_at + settings.MERIDIAN_REPLACEMENT_WAIT
    reason = (f"Hardware failed and no replacement is free in its network's fabric yet; retried until "
              f"{until:%Y-%m-%d %H:%M} UTC.")
    if reservation.state == R.ACTIVE:
        moves.reservation_move(reservation, R.PROVISIONING, only_from={R.ACTIVE}, reason=reason)
    if all(i.evidence.get("replacement", {}).get("state") == "waiting" for i in incidents):
        return
    Reservation.objects.filter(pk=reservation.pk, state=R.PROVISIONING).update(state_reason=reason)
    _mark(incidents, {"state": "waiting", "since": now.isoformat()})
    audit_record(actor=None, action="reservation.replacement_waiting", target=reservation,
                 after={"until": until.isoformat()})
    _tell(reservation, kind="reservation.replacement_waiting", title=f"Replacement waiting: {reservation.name}",
          body=f"No replacement hardware is free in the same network right now. Its healthy instances keep "
               f"running; the platform keeps trying until {until:%Y-%m-%d %H:%M} UTC and tells you here.")


def _fail(reservation, incidents, reason: str) -> None:
    """Give up: every instance cleaned, capacity given back, the reservation ``failed`` with the reason."""
    now = timezone.now()
    _provisioning(reservation).update(state=OperationState.FAILED, error=reason[:2000], finished_at=now)
    live = list(reservation.instances.filter(state__in=LIVE_INSTANCES))
    allocation_end(reservation=reservation, at=now)
    if live:
        releasing.clean_start(reservation, live)
    moves.reservation_move(reservation, R.FAILED, only_from=set(LIVE), reason=reason)
    _mark(incidents, {"state": "failed"})
    Incident.objects.filter(pk__in=[i.pk for i in incidents]).update(resolved_at=now)
    audit_record(actor=None, action="reservation.replacement_failed", target=reservation, after={"reason": reason})
    _tell(reservation, kind="reservation.replacement_failed", title=f"Reservation failed: {reservation.name}",
          body=reason)


def _activate(reservation, incidents, now: datetime) -> None:
    """Every unit is live and nothing provisions: active again (a reservation waiting with nothing lost)."""
    if reservation.state == R.PROVISIONING and not moves.reservation_move(
            reservation, R.ACTIVE, only_from={R.PROVISIONING}, reason=""):
        return
    reservation_restored(reservation=reservation, incidents=incidents, now=now)


#
# Outcomes of a replacement attempt (the lifecycle calls these)
#


def settled(reservation) -> bool:
    """No attempt still provisions and every unit is live: the reservation may be active again."""
    if _provisioning(reservation).exists():
        return False
    return reservation.instances.filter(state__in=LIVE_INSTANCES).count() >= reservation.units


def reservation_restored(*, reservation, incidents, now: datetime | None = None) -> None:
    """The tenant has working hardware again: its incidents are restored and it gets the new access details."""
    now = now or timezone.now()
    Incident.objects.filter(pk__in=[i.pk for i in incidents]).update(restored_at=now, resolved_at=now)
    _mark(incidents, {**incidents[0].evidence.get("replacement", {}), "state": "restored"})
    since = min(i.detected_at for i in incidents)
    new = list(reservation.instances.filter(state=InstanceState.ACTIVE, created_at__gte=since).order_by("index"))
    audit_record(actor=None, action="reservation.restored", target=reservation,
                 after={"instances": [i.name for i in new], "incidents": [str(i.pk) for i in incidents]})
    access = "\n".join(f"{i.name}: ssh {i.ssh_user}@{i.address}" for i in new)
    _tell(reservation, kind="reservation.hardware_replaced", title=f"Replacement ready: {reservation.name}",
          body=f"Your replacement hardware passed attestation and is in the same network (IB-VPC).\n{access}")


def attempt_failed(*, reservation, instances: list, failures: int, cause: str) -> None:
    """
    A replacement attempt (or a provisioning a node failure interrupted) failed for good; the
    lifecycle has failed or is cleaning its instances. Their capacity goes back and the units are
    placed again, or, after MERIDIAN_PROVISION_FAILURES attempts, the reservation fails.
    """
    now = timezone.now()
    _end_instances(reservation, instances, at=now)
    if failures >= settings.MERIDIAN_PROVISION_FAILURES:
        _fail(reservation, open_incidents(reservation),
              f"Replacement hardware failed {failures} times; last: {cause}"[:500])
        return
    reservation_replace(reservation.pk, now=now)


def replacements_due(now: datetime, limit: int) -> list:
    """
    Reservations with open incidents and no attempt under way: waiting for capacity, or never
    started; or no longer live (reservation_replace resolves their incidents).
    """
    waiting = Incident.objects.filter(kind=NODE_FAILURE, reservation_id__isnull=False, restored_at__isnull=True,
                                      resolved_at__isnull=True).values("reservation_id")
    busy = Operation.objects.filter(reservation=OuterRef("pk"), kind=OperationKind.PROVISION, state__in=UNFINISHED)
    return list(Reservation.objects.filter(pk__in=waiting).exclude(Q(state__in=LIVE) & Exists(busy))
                .order_by("state_changed_at").values_list("pk", flat=True)[:limit])
