"""
The heartbeat watchdog (the beat task, every MERIDIAN_WATCHDOG_SECONDS): a node whose agent
misses its liveness pings -- or its heartbeats, when it sends no pings (operations.silence) -- is
suspect, then failed (operations.detection acts: incidents, tenants told, replacement); a node
heard again is back. Silence of many nodes at once is the control plane's or the network's, not
theirs: a mass silence holds judgement instead of failing a fleet, and a stall of the control
plane itself (its watchdog late, its database slow, pings late everywhere) holds it altogether
until it ends, silence then counted from its end.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count, Max, Min, Q
from django.utils import timezone

from cloud.choices import NodeState
from cloud.health import (
    Action,
    FailurePolicy,
    Finding,
    mass_silence,
)
from cloud.models import Node, Region
from cloud.services import node_transition
from core.batches import FAILED, each_atomic
from core.errors import Conflict
from operations.detection import (
    DRAIN,
    MASS_SILENCE,
    RETURNS_TO,
    SUSPECT,
    WATCHED,
    failure_policy,
    gpus_recover,
    hold_if_idle,
    node_fail,
    open_incident,
    open_platform,
    resolve,
    tell_tenants,
)
from operations.silence import HEARD, Stall, allocated_heard, heard_of, period_of, pings, silent_q, stall_judge
from provisioning.lifecycle.replacement import live_reservations
from security.models import Incident

log = logging.getLogger(__name__)
N = NodeState


def watch_heartbeats(*, now: datetime | None = None) -> dict:
    """
    One round of the watchdog: silent agents make their nodes suspect, then failed; an agent heard
    again brings its suspect node back; reset GPUs that recovered return; drained nodes whose work
    ended go to the operator's hold. Each node in its own transaction (one bad node stops nothing).
    """
    now = now or timezone.now()
    policy = failure_policy()
    report = {"suspect": 0, "failed": 0, "back": 0, "gpus_back": 0, "held": 0, "errors": 0}
    # A server a tenant holds is watched only where an agent has been heard since the hand-over
    # (an operator's monitoring agent in the tenant's image); otherwise its BMC is (judge_bmc).
    heard = allocated_heard()
    try:
        stall = stall_judge(now=now, policy=policy, watched=Q(state__in=WATCHED) | heard)
    except Exception:  # the guard failing must not stop the round: judge as if no stall
        log.exception("heartbeat watchdog: the control plane's stall check failed")
        report["errors"] += 1
        stall = Stall()
    report["stalled"] = stall.reason or ""
    silent = [] if stall.held else (
        Node.objects.annotate(heard=HEARD).filter(Q(state__in=WATCHED) | heard)
        .filter(silent_q(now, policy, since=stall.resumed_at)).values_list("pk", "region_id"))
    suspects = Node.objects.filter(state=N.SUSPECT, agent_state__isnull=False).values_list("pk", "region_id")
    try:
        # A stalled round leaves the regions' holds as they are: it cannot tell who is silent.
        held_regions, released = (set(), {}) if stall.held else _mass_silence(heard, policy, now, stall.resumed_at)
    except Exception:  # the guard failing must not stop the round: judge every node on its own
        log.exception("heartbeat watchdog: the mass-silence check failed")
        report["errors"] += 1
        held_regions, released = set(), {}
    report["regions_held"] = len(held_regions)

    def since(region):
        """Silence counts from the later of the region's release and the stall's end."""
        return max((at for at in (released.get(region), stall.resumed_at) if at is not None), default=None)

    watched = each_atomic([*silent, *suspects], lambda node: _watch(
        node[0], now, policy, hold=stall.held or node[1] in held_regions, released=since(node[1])),
        what="heartbeat watchdog")
    for _node, outcome in watched:
        if outcome is FAILED:
            report["errors"] += 1
        elif outcome:
            report[outcome] += 1
    report["gpus_back"] = gpus_recover(now=now)
    for platform in Incident.objects.filter(kind=DRAIN, tenant_id__isnull=True, resolved_at__isnull=True,
                                                        node_id__isnull=False):
        with transaction.atomic():
            node = Node.objects.select_for_update().filter(pk=platform.node_id).first()
            if node is not None and hold_if_idle(node, platform, now):
                report["held"] += 1
    return report


def _mass_silence(heard: Q, policy: FailurePolicy, now: datetime, resumed_at: datetime | None) -> tuple[set, dict]:
    """
    The regions where so many watched nodes are silent at once that the watchdog holds back
    (cloud.health.mass_silence), with one open platform incident each; and the regions released
    lately, with when (their nodes' silence is counted from then). Silent is what ``_watch`` counts
    as silent: a node just back from a tenant or a cleaning has not missed anything yet, and none
    has until its periods passed after the control plane's last stall (``resumed_at``).
    """
    silent = silent_q(now, policy, since=resumed_at, suspect=True)
    cutoff = now - policy.suspect_after_misses * timedelta(seconds=policy.heartbeat_interval_s)
    counts = (Node.objects.annotate(heard=HEARD)
              .filter(Q(state__in=WATCHED) | heard | Q(state=N.SUSPECT), agent_state__isnull=False)
              .values("region_id").order_by()
              .annotate(watched=Count("pk"), silent=Count("pk", filter=silent), since=Min("heard", filter=silent)))
    counts = {str(row["region_id"]): row for row in counts}
    with transaction.atomic():
        # Two overlapping rounds must not open the same region's incident twice.
        regions = {str(r.pk): r for r in Region.objects.select_for_update().filter(pk__in=list(counts)).order_by("pk")}
        open_ = {incident.evidence.get("region_id"): incident.pk
                 for incident in Incident.objects.filter(kind=MASS_SILENCE, resolved_at__isnull=True)}
        held = {key for key, row in counts.items()
                if mass_silence(row["silent"], row["watched"], policy, held=key in open_)}
        for key in held - open_.keys():
            row, region = counts[key], regions[key]
            log.warning("Region %s: %s of %s watched nodes are silent; failing none of them until they are fewer.",
                        region.slug, row["silent"], row["watched"])
            Incident.objects.create(
                kind=MASS_SILENCE, tenant_id=None, impact_started_at=row["since"] or cutoff, detected_at=now,
                summary=f"{region.slug}: {row['silent']} of {row['watched']} watched nodes stopped reporting at "
                        "once; the control plane's network is the likelier cause -- they are held suspect, none "
                        "is failed or has its running work moved until fewer are silent",
                evidence={"region_id": key, "region": region.slug, "silent": row["silent"],
                          "watched": row["watched"], "share": policy.mass_silence_share,
                          "min_nodes": policy.mass_silence_min_nodes})
        Incident.objects.filter(pk__in=[pk for key, pk in open_.items() if key not in held]).update(
            resolved_at=now, restored_at=now)
    recent = now - policy.faulty_after_misses * timedelta(seconds=policy.heartbeat_interval_s)
    released = {row["evidence__region_id"]: row["at"] for row in Incident.objects.filter(
        kind=MASS_SILENCE, resolved_at__gte=recent).values("evidence__region_id").order_by().annotate(
        at=Max("resolved_at"))}
    return ({counts[key]["region_id"] for key in held},
            {counts[key]["region_id"]: at for key, at in released.items() if key in counts and key not in held})


def _watch(node_id, now: datetime, policy: FailurePolicy, *, hold: bool = False,
           released: datetime | None = None) -> str | None:
    """
    Lock order: a node's live reservations (by pk), then the node -- the lifecycle's order (a failed
    step holds its reservation, then marks the node), and ``node_failed``'s. So the decision is
    read unlocked first; a failure locks the node's live reservations before the node, decides
    again and goes to ``node_failed`` (which does nothing when a racing caller handled it already).
    ``hold``: the node's region is silent en masse -- a node is made suspect but never failed;
    ``released``: when such a hold ended (silence is counted from then).
    """
    node = Node.objects.select_related("agent_state").get(pk=node_id)
    decided = _watch_decide(node, now, policy, hold=hold, released=released)
    if decided is None:
        return None
    failing = decided[0] == "failed"
    if failing:
        list(live_reservations(node.pk, now).select_for_update(of=("self",)).order_by("pk").values_list("pk"))
    node = Node.objects.select_for_update(of=("self",)).select_related("agent_state").get(pk=node_id)
    decided = _watch_decide(node, now, policy, hold=hold, released=released)
    if decided is None or (decided[0] == "failed") != failing:
        return None  # it changed meanwhile: the next round decides again, taking the locks in order
    if failing:
        _, since, finding = decided
        node_fail(node, finding, impact_started_at=since, now=now)
        return "failed"
    if decided[0] == "back":
        return _back(node, decided[2], now)
    _, since, missed = decided
    return _suspect(node, since, missed, now)


def _watch_decide(node: Node, now: datetime, policy: FailurePolicy, *, hold: bool = False,
                  released: datetime | None = None):
    """
    What the watchdog does with ``node``: None, ("failed", since, finding), ("back", None,
    suspicion) or ("suspect", since, (missed periods, the period, the signal missed)). ``hold``:
    never "failed" (a silent region, a stalled control plane);
    ``released``: periods are missed only from then on.
    """
    last_seen = heard_of(node.agent_state)
    period_s = period_of(node.agent_state, policy)
    signal = "liveness ping" if pings(node.agent_state, policy) else "heartbeat"
    if node.state == N.SUSPECT:
        suspicion = open_platform(SUSPECT, node)
        if node.state_changed_at is None or last_seen > node.state_changed_at:
            return "back", None, suspicion
        since = suspicion.impact_started_at if suspicion is not None else last_seen
    elif node.state in WATCHED or node.state == N.ALLOCATED:
        since = max(last_seen, node.state_changed_at or last_seen)
        suspicion = None
    else:
        return None
    missed = int((now - max(since, released or since)).total_seconds() // period_s)
    if missed >= policy.faulty_after_misses and not hold:
        return "failed", since, Finding(
            Action.FAULTY, "heartbeat_lost", f"no {signal} for {missed} periods ({period_s:g} s each)",
            {"last_seen": last_seen.isoformat(), "missed": missed, "interval_s": period_s, "signal": signal})
    if missed >= policy.suspect_after_misses and suspicion is None and node.state != N.SUSPECT:
        return "suspect", since, (missed, period_s, signal)
    return None


def _suspect(node: Node, since: datetime, missed: tuple, now: datetime) -> str | None:
    """``missed``: (periods, the period in seconds, which signal was missed)."""
    missed, period_s, signal = missed
    try:
        node_transition(actor=None, node=node, target=N.SUSPECT, reason=f"No {signal} for {missed} periods.")
    except Conflict:
        return None
    platform = open_incident(kind=SUSPECT, node=node, gpu_ids=[], impact_started_at=since, detected_at=now,
                     summary=f"{node.hostname}: no {signal} for {missed} periods ({period_s:g} s each); suspect",
                     evidence={"cause": "heartbeat_missed", "last_seen": since.isoformat(), "missed": missed,
                               "interval_s": period_s, "signal": signal})
    tell_tenants(platform, node, gpu_ids=None, now=now, kind="node.suspect",
             title="Hardware under your reservation stopped reporting",
             body=f"The host under reservation {{name}} stopped reporting at {since:%Y-%m-%d %H:%M:%S} UTC. It is "
                  "being watched; if it does not come back, your work is replaced automatically.")
    return "suspect"


def _back(node: Node, suspicion, now: datetime) -> str | None:
    """The agent is heard again: the node returns to where it was, the suspicion's incidents end."""
    target = node.previous_state if node.previous_state in RETURNS_TO else N.VALIDATING
    if target == N.VALIDATING:
        target = N.MAINTENANCE  # SUSPECT cannot go to validation: the operator decides
    try:
        node_transition(actor=None, node=node, target=target, reason="Heartbeats resumed.",
                        only_from=frozenset({N.SUSPECT}))
    except Conflict:
        return None
    if suspicion is not None:
        resolve(suspicion, now=now, restored=True, kind="node.back",
                 title="Hardware under your reservation is reporting again",
                 body="The host under reservation {name} is reporting again; nothing was replaced.")
    return "back"
