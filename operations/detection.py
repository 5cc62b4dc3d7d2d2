"""
Failure detection: the policy of ``cloud.health`` (``MERIDIAN_FAILURE_POLICY``) applied to what
the fleet reports, and the actions it asks for.

- ``judge_samples``: every heartbeat's GPU samples and HCA ports, right after they are ingested
  (inside the heartbeat's transaction; no query at all when nothing is wrong). Per GPU and per
  node the strongest finding acts:
  * IGNORE (application-level XIDs such as 13, 31, 43, 45, 68, 109): nothing, not even an incident.
  * RESET_GPU: the GPU is marked failed (never sold meanwhile; an idle one is held), an incident
    opens (the platform's, and one per live reservation on that GPU, whose tenant is told), and
    the node's agent gets a ``reset_gpu`` command. When the agent reports the reset worked and a
    sample after it is clean, the GPU is back in service and the incidents resolved
    (``watch_heartbeats`` looks). A failed reset, or a GPU failing again after its reset, takes
    ``reset_failed_action`` (faulty by default).
  * DRAIN_NODE: the node is no longer sold (health ``failed``; an idle node goes to the operator's
    ``maintenance`` hold at once). Its tenants' work is left to finish -- a drain is for hardware
    that still works (heat, a flapping or dead link, NVLink errors) -- and each affected tenant is
    told; once nothing runs there, the node is handed to the operator (``maintenance``). A policy
    that wants such work moved maps the cause to ``faulty``.
  * FAULTY: ``provisioning.lifecycle.replacement``: a GPU's finding fails that GPU of a shared host
    (``gpus_failed``: its instances move, the host's other tenants go on) or the whole bare-metal
    server; a port's, the node (``node_failed``). The impact starts at the sample's time.
- ``operations.heartbeats.watch_heartbeats`` (a beat task every MERIDIAN_WATCHDOG_SECONDS): nodes whose agent runs
  (shared hosts in service, idle bare metal, a tenant's server where an agent was heard since
  the hand-over) silent for ``suspect_after_misses`` periods are
  ``suspect`` (not sold; an incident, tenants told); after ``faulty_after_misses`` they fail
  (``node_failed``, the impact from the last heartbeat); an agent heard again while its node is
  suspect puts the node back where it was. Periods count from the agent's last liveness ping or
  heartbeat (a pinging agent's periods are MERIDIAN_LIVENESS_SECONDS, others' the heartbeat's),
  or from the node's entering a watched state when that is later (a server back from a tenant),
  or from the end of the control plane's own stall (``operations.stalls``).
- ``judge_bmc``: bare metal a tenant holds runs no agent; its BMC readings judge it (critical
  health, power lost under a handed-over server, ports down, GPUs too hot).

Every detection opens one incident per condition (never a second while one is open) with the
node, the GPUs, the cause, the evidence and the time detected.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from cloud.choices import GPUState, Health, NodeState
from cloud.health import (
    Action,
    FailurePolicy,
    Finding,
    counted_xids,
    evaluate_gpu,
    evaluate_port,
    strongest,
)
from cloud.models import GPU, GPUSample, GPUTelemetry, Node
from cloud.services import node_transition
from core.errors import Conflict
from provisioning.agents.commands import command_enqueue
from provisioning.choices import InstanceState
from provisioning.lifecycle.replacement import LIVE, gpus_failed, node_failed
from provisioning.models import Allocation, Instance, Reservation
from security.models import Incident
from tenants.notifications import notify

log = logging.getLogger(__name__)
N = NodeState
SUSPECT = "node_suspect"
MASS_SILENCE = "mass_silence"
GPU_RESET = "gpu_reset"
DRAIN = "node_drain"
RESET_COMMAND = "reset_gpu"
# Where an agent runs and must be heard (bare metal with a tenant is watched out of band; nodes in
# validation or cleaning reboot, and their steps wait on the agent with their own limits).
WATCHED = (N.IN_SERVICE, N.AVAILABLE)
RETURNS_TO = frozenset({N.AVAILABLE, N.IN_SERVICE, N.ALLOCATED})


def failure_policy() -> FailurePolicy:
    """The policy as configured (read at call time): MERIDIAN_FAILURE_POLICY over the defaults."""
    values = {"port_flap_window_s": settings.MERIDIAN_PORT_FLAP_WINDOW_S, **(settings.MERIDIAN_FAILURE_POLICY or {})}
    return FailurePolicy.from_mapping(values, heartbeat_interval_s=settings.MERIDIAN_AGENT_INTERVAL,
                                      liveness_interval_s=settings.MERIDIAN_LIVENESS_SECONDS)


#
# Samples (the heartbeat)
#


def judge_samples(*, node: Node, ingested, now: datetime, policy: FailurePolicy | None = None) -> list[Finding]:
    """
    Act on one heartbeat's ``ingested`` telemetry (``cloud.telemetry.Ingested``) of ``node``, inside
    the caller's transaction. Returns the findings acted on (none: nothing was read or written).
    """
    policy = policy or failure_policy()
    per_gpu = []
    for reading in ingested.gpus:
        recent = 0
        if counted_xids(reading.sample.get("xids"), policy):
            recent = _recent_xids(reading.gpu_id, now, policy)
        finding = strongest(evaluate_gpu(sample=reading.sample, previous=reading.previous, recent_xids=recent,
                                         policy=policy))
        if finding is not None and finding.action != Action.IGNORE:
            per_gpu.append((reading, finding))
    per_port = []
    for port in ingested.ports:
        finding = evaluate_port(link=port.link, changes_in_window=port.changes_in_window, policy=policy)
        if finding is not None and finding.action != Action.IGNORE:
            per_port.append((port, _with(finding, port=port.guid)))
    if not per_gpu and not per_port:
        return []
    try:
        with transaction.atomic():  # a savepoint: detection's own error never costs the node its heartbeat
            _act(node, per_gpu, per_port, now, policy)
    except Exception:
        log.exception("failure detection on %s's heartbeat failed; the heartbeat itself is kept", node.hostname)
    return [f for _, f in per_gpu + per_port]


def _act(node: Node, per_gpu: list, per_port: list, now: datetime, policy: FailurePolicy) -> None:
    """The heartbeat's findings acted on: faulty first, then a drain, then GPU resets."""
    node = Node.objects.get(pk=node.pk)
    faulty = [(r, f) for r, f in per_gpu if f.action == Action.FAULTY]
    if faulty:
        _gpus_fail(node, [r.gpu_id for r, _ in faulty], faulty[0][1], now,
                   evidence={"findings": [_describe(f, gpu=r.uuid) for r, f in faulty]})
    fatal_port = next((f for _, f in per_port if f.action == Action.FAULTY), None)
    if fatal_port is not None:
        node_fail(node, fatal_port, impact_started_at=now, now=now)
    node.refresh_from_db(fields=["state", "health"])
    if node.state == N.FAULTY:
        return
    drains = [(r, f) for r, f in per_gpu + per_port if f.action == Action.DRAIN_NODE]
    if drains:
        reading, finding = drains[0]
        gpu_ids = [str(reading.gpu_id)] if hasattr(reading, "gpu_id") else []
        node_drain(node=node, finding=finding, gpu_ids=gpu_ids, now=now)
    resets = [(r, f) for r, f in per_gpu if f.action == Action.RESET_GPU]
    # Escalations first: they may fail GPUs (locking reservations), which must come before any GPU
    # lock a fresh reset takes in this transaction (the lock order: reservations, then GPUs).
    resets.sort(key=lambda rf: _escalating(node, rf[0].gpu_id) is None)
    for reading, finding in resets:
        gpu_reset(node=node, gpu_id=reading.gpu_id, finding=finding, now=now, policy=policy)


def _recent_xids(gpu_id, now: datetime, policy: FailurePolicy) -> int:
    """The GPU's XIDs the policy counts, in raw samples inside the repeat window before this heartbeat's."""
    since = now - timedelta(seconds=policy.repeated_xid_window_s)
    rows = GPUSample.objects.filter(gpu_id=gpu_id, sampled_at__gte=since, sampled_at__lt=now, xid_count__gt=0)
    return sum(counted_xids(xids, policy) for xids in rows.values_list("xids", flat=True))


def _with(finding: Finding, **evidence) -> Finding:
    return Finding(finding.action, finding.cause, finding.summary, {**finding.evidence, **evidence})


def _describe(finding: Finding, **more) -> dict:
    return {"cause": finding.cause, "action": finding.action.name.lower(), "summary": finding.summary,
            **finding.evidence, **more}


#
# GPU resets
#


@transaction.atomic
def gpu_reset(*, node: Node, gpu_id, finding: Finding, now: datetime, policy: FailurePolicy):
    """
    The GPU is failed and held until a reset brings it back: an incident (and one per live
    reservation on it, its tenant told) and a ``reset_gpu`` command for the node's agent. A GPU
    whose reset is under way asks nothing twice; one failing again after its reset escalates.

    Lock order: reservations, then the GPU (provisioning's). An escalation may fail the GPU, which
    locks its reservations, so it is decided and taken without the GPU's lock; only a fresh reset
    locks the GPU.
    """
    platform = open_platform(GPU_RESET, node, gpu=gpu_id)
    if platform is not None:
        if platform.evidence.get("reset", {}).get("state") == "succeeded":
            gpu = GPU.objects.get(pk=gpu_id)
            _reset_escalate(platform, node, gpu, policy, cause="failed_after_reset",
                            summary=f"GPU {gpu.index} failed again after its reset: {finding.summary}", now=now)
        return platform
    gpu = GPU.objects.select_for_update().get(pk=gpu_id)
    platform = open_platform(GPU_RESET, node, gpu=gpu.pk)
    if platform is not None:
        return platform  # opened meanwhile: its reset is under way
    held_from = gpu.state
    if gpu.state == GPUState.AVAILABLE:
        GPU.objects.filter(pk=gpu.pk, state=GPUState.AVAILABLE).update(state=GPUState.QUARANTINED,
                                                                        health=Health.FAILED)
    else:  # a tenant's (or being scrubbed): it stays theirs, never sold again until it recovers
        GPU.objects.filter(pk=gpu.pk).update(health=Health.FAILED)
    platform = open_incident(kind=GPU_RESET, node=node, gpu_ids=[gpu.pk], impact_started_at=now, detected_at=now,
                     summary=f"{node.hostname} GPU {gpu.index}: {finding.summary}; resetting it",
                     evidence={**_describe(finding), "gpu": str(gpu.pk), "index": gpu.index, "uuid": gpu.uuid,
                               "held_from": held_from})

    command = command_enqueue(node_id=node.pk, kind=RESET_COMMAND, reference=f"incident:{platform.pk}",
                              payload={"index": gpu.index, "uuid": gpu.uuid})
    _evidence(platform, reset={"state": "asked", "command": str(command.pk)})
    tell_tenants(platform, node, gpu_ids=[gpu.pk], now=now, kind="gpu.reset",
             title="A GPU of your reservation is being reset",
             body=f"A GPU under reservation {{name}} reported {finding.summary} at {now:%Y-%m-%d %H:%M:%S} UTC and "
                  "is being reset; work on it was interrupted. You are told here when it is back.")
    return platform


def _escalating(node: Node, gpu_id):
    """The GPU's open reset incident when its reset seemed to work (a new finding escalates it), else None."""
    platform = open_platform(GPU_RESET, node, gpu=gpu_id)
    if platform is not None and platform.evidence.get("reset", {}).get("state") == "succeeded":
        return platform
    return None


@transaction.atomic
def gpu_reset_answered(*, command) -> None:
    """The agent's answer to a ``reset_gpu`` command: success awaits a clean sample; failure escalates."""
    platform = (Incident.objects.select_for_update()
                .filter(kind=GPU_RESET, tenant_id__isnull=True, resolved_at__isnull=True,
                        evidence__reset__command=str(command.pk)).first())
    if platform is None:
        return
    node = Node.objects.get(pk=command.node_id)
    gpu = GPU.objects.get(pk=platform.evidence["gpu"])
    if command.state == command.State.DONE:
        _evidence(platform, reset={"state": "succeeded", "command": str(command.pk),
                                   "at": (command.done_at or timezone.now()).isoformat()})
        return
    detail = str((command.result or {}).get("detail") or "no detail")[:300]
    _reset_escalate(platform, node, gpu, failure_policy(), cause="reset_failed",
                    summary=f"GPU {gpu.index}: the reset failed ({detail})", now=timezone.now())


def _reset_escalate(platform, node: Node, gpu: GPU, policy: FailurePolicy, *, cause: str, summary: str,
                    now: datetime) -> None:
    """The reset did not bring the GPU back: ``reset_failed_action`` (the GPU stays failed meanwhile)."""
    action = policy.reset_failed_action
    _evidence(platform, reset={**platform.evidence.get("reset", {}), "state": "failed"}, escalated=action.name.lower())
    finding = Finding(action, cause, summary, {"gpu": str(gpu.pk), "reset_incident": str(platform.pk)})
    if action == Action.FAULTY:
        resolve(platform, now=now, restored=False)
        _gpus_fail(node, [gpu.pk], finding, now, impact_started_at=platform.impact_started_at)
    elif action == Action.DRAIN_NODE:
        resolve(platform, now=now, restored=False)
        node_drain(node=node, finding=finding, gpu_ids=[str(gpu.pk)], now=now)
    # RESET_GPU or IGNORE: the GPU stays held with its incident open, for an operator.


def gpus_recover(*, now: datetime) -> int:
    """GPUs whose reset worked and whose first sample after it is clean: back in service, incidents resolved."""
    policy = failure_policy()
    back = 0
    waiting = Incident.objects.filter(kind=GPU_RESET, tenant_id__isnull=True, resolved_at__isnull=True,
                                                  evidence__reset__state="succeeded")
    for platform in waiting:
        reset_at = datetime.fromisoformat(platform.evidence["reset"]["at"])
        latest = GPUTelemetry.objects.filter(gpu_id=platform.evidence["gpu"], sampled_at__gt=reset_at).values(
            "temperature_c", "xids").first()
        if latest is None:
            continue
        if any(f.action != Action.IGNORE for f in evaluate_gpu(sample=latest, previous=None, recent_xids=0,
                                                               policy=policy)):
            continue  # judge_samples escalates it
        with transaction.atomic():
            back += gpu_return(incident_id=platform.pk, now=now)
    return back


@transaction.atomic
def gpu_return(*, incident_id, now: datetime) -> int:
    """The GPU of a reset incident is sound again: healthy, sellable (held ones freed), its incidents resolved."""
    platform = (Incident.objects.select_for_update()
                .filter(pk=incident_id, resolved_at__isnull=True).first())
    if platform is None:
        return 0
    gpu = GPU.objects.select_for_update().get(pk=platform.evidence["gpu"])
    if platform.evidence.get("held_from") == GPUState.AVAILABLE:
        GPU.objects.filter(pk=gpu.pk, state=GPUState.QUARANTINED).update(state=GPUState.AVAILABLE)
    GPU.objects.filter(pk=gpu.pk).update(health=Health.HEALTHY)
    resolve(platform, now=now, restored=True, kind="gpu.back", title="A GPU of your reservation is back",
             body="The GPU under reservation {name} that was reset is healthy again and back in service.")
    return 1


#
# Drains and failures
#


@transaction.atomic
def node_drain(*, node: Node, finding: Finding, gpu_ids: list, now: datetime):
    """
    Stop selling ``node`` (health failed); idle, it goes to the operator's maintenance hold now,
    else when its tenants' work ends (``watch_heartbeats``). One incident while it is open; the
    tenants with live work there are told (their work runs on).
    """
    node = Node.objects.select_for_update().get(pk=node.pk)
    platform = open_platform(DRAIN, node)
    if platform is not None or node.state in HANDED_ON:
        # Already drained, or already out of sale in an operator's (or repair's) hands: a condition
        # that persists there opens nothing again and leaves the node's health as it is.
        return platform
    Node.objects.filter(pk=node.pk).update(health=Health.FAILED)
    platform = open_incident(kind=DRAIN, node=node, gpu_ids=gpu_ids, impact_started_at=now, detected_at=now,
                     summary=f"{node.hostname}: {finding.summary}; drained (no longer sold)",
                     evidence=_describe(finding))
    # The tenants' work runs on: they are told, but their incidents count no GPU as lost (no outage).
    tell_tenants(platform, node, gpu_ids=None, now=now, kind="node.drained", outage=False,
             title="Hardware under your reservation is being drained",
             body=f"A problem was found under reservation {{name}} ({finding.summary}) at "
                  f"{now:%Y-%m-%d %H:%M:%S} UTC. Your work keeps running; no new work is placed there. "
                  "Consider moving work that must not be interrupted.")
    hold_if_idle(node, platform, now)
    return platform


# A drained node that went on to one of these is in other hands: its drain is over.
HANDED_ON = frozenset({N.FAULTY, N.REPAIR, N.QUARANTINED, N.MAINTENANCE, N.VALIDATING})


def hold_if_idle(node: Node, platform, now: datetime) -> bool:
    """
    A drained node nobody's work runs on goes to the operator's hold (sold again when the operator
    ends it), and the drain's incidents end: the operator has it now. Also ends a drain whose node
    went on elsewhere (faulty, repair...).
    """
    node.refresh_from_db(fields=["state"])
    if node.state in HANDED_ON:
        resolve(platform, now=now, restored=False)
        return False
    if node.state not in WATCHED or Allocation.objects.filter(node=node, ends_at__gt=now).exists():
        return False
    try:
        node_transition(actor=None, node=node, target=N.MAINTENANCE, reason=f"Drained: {platform.summary}"[:500])
    except Conflict:
        return False
    # The hold keeps it out of sale now; ending it sells the node again, so its health is as before.
    Node.objects.filter(pk=node.pk).update(health=Health.HEALTHY)
    _evidence(platform, held_at=now.isoformat())
    resolve(platform, now=now, restored=False)
    return True


def _gpus_fail(node: Node, gpu_ids: list, finding: Finding, now: datetime, *, evidence: dict | None = None,
               impact_started_at: datetime | None = None) -> None:
    """A GPU finding that is faulty: replacement.gpus_failed (on bare metal that fails the server)."""
    # A GPU being reset is failed now: its reset incident ends here.
    for platform in Incident.objects.filter(kind=GPU_RESET, node_id=node.pk, tenant_id__isnull=True,
                                                         resolved_at__isnull=True):
        if platform.evidence.get("gpu") in {str(g) for g in gpu_ids}:
            _evidence(platform, escalated="faulty")
            resolve(platform, now=now, restored=False)
    gpus_failed(node=node, gpu_ids=list(gpu_ids), cause=finding.cause, summary=finding.summary,
                evidence=evidence or finding.evidence, impact_started_at=impact_started_at or now, detected_at=now)


def node_fail(node: Node, finding: Finding, *, impact_started_at: datetime, now: datetime):
    incident = node_failed(node=node, cause=finding.cause, summary=finding.summary, evidence=finding.evidence,
                           impact_started_at=impact_started_at, detected_at=now)
    # What was suspected is now a failure: the suspicion's incidents end (the failure's carry on).
    for platform in Incident.objects.filter(kind=SUSPECT, node_id=node.pk, tenant_id__isnull=True,
                                                         resolved_at__isnull=True):
        _evidence(platform, escalated=str(incident.pk))
        resolve(platform, now=now, restored=False)
    return incident


#
# BMC readings (bare metal a tenant holds)
#


def judge_bmc(*, node: Node, reading: dict, power: str | None, ports: list, now: datetime) -> Finding | None:
    """
    A held bare-metal node's BMC reading, its power state and its ports (``PortReading``s) from
    the fabric: a critical BMC (``bmc_critical_action``), power off under a handed-over server
    (``power_lost_action``, a drain by default), ports down on two polls in a row or flapping, GPUs
    over the temperature limit. Returns the finding acted on.
    """
    policy = failure_policy()
    findings = []
    if str(reading.get("health", "")).lower() == "critical":
        findings.append(Finding(policy.bmc_critical_action, "bmc_critical", "the BMC reports the system critical",
                                {"bmc_health": "critical"}))
    if power == "off" and Instance.objects.filter(node=node, state=InstanceState.ACTIVE).exists():
        findings.append(Finding(policy.power_lost_action, "power_lost", "the server is off", {"power": power}))
    for port in ports:
        # A held server's link read down once may be the tenant's own reboot: it must read down
        # on two polls in a row (a flapping link is still found by its changes).
        link = port.link if port.link != "down" or port.previous == "down" else None
        finding = evaluate_port(link=link, changes_in_window=port.changes_in_window, policy=policy)
        if finding is not None:
            findings.append(_with(finding, port=port.guid))
    for sensor in reading.get("temperatures") or []:
        if str(sensor.get("context", "")).lower() == "gpu" and isinstance(sensor.get("celsius"), int | float):
            findings += [_with(f, sensor=sensor.get("name")) for f in evaluate_gpu(
                sample={"temperature_c": sensor["celsius"]}, previous=None, recent_xids=0, policy=policy)]
    finding = strongest(findings)
    if finding is None or finding.action in (Action.IGNORE, Action.RESET_GPU):
        return None  # no agent runs there to reset a GPU: the tenant's server is theirs
    with transaction.atomic():
        if finding.action == Action.FAULTY:
            node_fail(node, finding, impact_started_at=now, now=now)
        else:
            node_drain(node=node, finding=finding, gpu_ids=[], now=now)
    return finding


#
# Incidents
#


def open_platform(kind: str, node: Node, *, gpu=None):
    """The open platform incident of this condition on ``node`` (of ``gpu``, when given), or None."""
    found = Incident.objects.filter(kind=kind, node_id=node.pk, tenant_id__isnull=True,
                                             resolved_at__isnull=True)
    if gpu is not None:
        found = found.filter(evidence__gpu=str(gpu))
    return found.order_by("detected_at").first()


def open_incident(*, kind: str, node: Node, gpu_ids: list, impact_started_at, detected_at, summary: str,
                  evidence: dict):
    incident = Incident.objects.create(kind=kind, node_id=node.pk, fabric_id=node.fabric_id, tenant_id=None,
                                    gpu_ids=[str(g) for g in gpu_ids], gpus_affected=len(gpu_ids),
                                    summary=summary[:500], evidence=evidence, impact_started_at=impact_started_at,
                                    detected_at=detected_at or timezone.now())
    return incident


def _evidence(incident, **changes) -> None:
    incident.evidence = {**incident.evidence, **changes}
    Incident.objects.filter(pk=incident.pk).update(evidence=incident.evidence)


def _live(node: Node, now: datetime, gpu_ids=None):
    """Reservations with live work on the node (on these GPUs of it), with their GPUs there."""
    held = Allocation.objects.holding(now).filter(node=node, reservation__state__in=LIVE)
    if gpu_ids is not None:
        held = held.filter(gpu_id__in=gpu_ids)
    gpus: dict = {}
    for reservation_id, gpu_id in held.values_list("reservation_id", "gpu_id"):
        gpus.setdefault(reservation_id, set()).add(str(gpu_id))
    reservations = Reservation.objects.filter(pk__in=gpus).select_related("tenant", "team", "offering")
    return [(r, sorted(gpus[r.pk])) for r in reservations.order_by("pk")]


def tell_tenants(platform, node: Node, *, gpu_ids, now: datetime, kind: str, title: str, body: str,
             outage: bool = True) -> list:
    """
    One incident per reservation with live work hit (its tenant may read it) and a message to its
    team. ``outage=False``: the work runs on (a drain), so the incident names no GPU (the SLA counts
    a tenant incident's GPUs as unavailable until it is resolved).
    """
    opened = []
    for reservation, hit in _live(node, now, gpu_ids):
        incident = open_incident(kind=platform.kind, node=node, gpu_ids=hit if outage else [],
                         impact_started_at=platform.impact_started_at,
                         detected_at=platform.detected_at,
                         summary=f"{title} (reservation {reservation.name})",
                         evidence={"cause": platform.evidence.get("cause"), "platform_incident": str(platform.pk)})
        Incident.objects.filter(pk=incident.pk).update(tenant_id=reservation.tenant_id,
                                                                reservation_id=reservation.pk)
        notify(reservation.tenant, team=reservation.team, kind=kind, title=f"{title}: {reservation.name}"[:120],
               body=body.format(name=reservation.name), link=reverse("reservation-detail", args=[reservation.pk]))
        opened.append(incident)
    return opened


def resolve(platform, *, now: datetime, restored: bool, kind: str = "", title: str = "", body: str = "") -> None:
    """Resolve the platform incident and its tenants' (restored: working again; the tenants told given a title)."""
    Incident.objects.filter(pk=platform.pk).update(resolved_at=now, **({"restored_at": now} if restored else {}))
    tenant_ones = list(Incident.objects.filter(kind=platform.kind, evidence__platform_incident=str(platform.pk),
                                            resolved_at__isnull=True))
    Incident.objects.filter(pk__in=[i.pk for i in tenant_ones]).update(
        resolved_at=now, **({"restored_at": now} if restored else {}))
    if not title:
        return

    for reservation in Reservation.objects.filter(pk__in=[i.reservation_id for i in tenant_ones]).select_related(
            "tenant", "team"):
        notify(reservation.tenant, team=reservation.team, kind=kind,
               title=f"{title}: {reservation.name}"[:120], body=body.format(name=reservation.name),
               link=reverse("reservation-detail", args=[reservation.pk]))


__all__ = ["DRAIN", "GPU_RESET", "RESET_COMMAND", "SUSPECT", "WATCHED", "failure_policy", "gpu_reset",
           "gpu_reset_answered", "gpu_return", "gpus_recover", "hold_if_idle", "judge_bmc", "judge_samples",
           "node_drain", "node_fail", "open_incident", "open_platform", "resolve", "tell_tenants"]
