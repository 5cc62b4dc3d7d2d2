"""
What the heartbeat watchdog (operations.heartbeats) counts as silence, and the control plane's own
stalls, which are not.

A node is heard when its agent's liveness ping or its heartbeat comes in, whichever is later
(``heard``). An agent that pings (provisioning.models.AgentState.ping_run) is judged by the pings'
period, MERIDIAN_LIVENESS_SECONDS; one that does not (an older agent, one between runs) by its
heartbeats', MERIDIAN_AGENT_INTERVAL_SECONDS.

Pings made late by the control plane's own load -- a busy web tier or database -- look, from the
database, like nodes gone quiet. Each round therefore notes when it began (in the cache, as the
scheduler notes its last cycle), times its first statement (a count of the watched agents'
pings) and asks ``cloud.health.control_plane_stall`` whether the control plane itself stalled:
its rounds late, its database slow, or agents everywhere late at once. While it stalls the round
makes no node suspect or failed for silence, and one platform incident (``control_plane_stall``)
says so; once it ends, every node's silence is counted from then, so a node gets its whole
grace again -- and one that is truly silent is still suspect ``suspect_after_misses`` periods later.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, F, Max, Q
from django.db.models.functions import Coalesce, Greatest

from cloud.choices import NodeState
from cloud.health import FailurePolicy, Round, control_plane_stall
from cloud.models import Node
from security.models import Incident

log = logging.getLogger(__name__)
STALL = "control_plane_stall"
ROUND_KEY = "meridian:heartbeats-watch:began"
# The clock the first statement is timed with (a test moves it to stand for a stalled database).
monotonic = time.monotonic
# When a node was last heard: its latest ping or heartbeat (a Node queryset's annotation).
HEARD = Greatest("agent_state__last_seen_at", Coalesce("agent_state__alive_at", "agent_state__last_seen_at"))
_NOTHING = Q(pk__isnull=True)


def heard_of(state) -> datetime:
    """When the agent of ``state`` (an AgentState) was last heard: its latest ping or heartbeat."""
    return max(state.last_seen_at, state.alive_at or state.last_seen_at)


def pings(state, policy: FailurePolicy) -> bool:
    """Whether the agent of ``state`` is judged by its liveness pings (else by its heartbeats)."""
    return bool(policy.liveness_interval_s and state.ping_run)


def period_of(state, policy: FailurePolicy) -> float:
    return policy.liveness_interval_s if pings(state, policy) else policy.heartbeat_interval_s


def silent_q(now: datetime, policy: FailurePolicy, *, since: datetime | None = None, suspect: bool = False) -> Q:
    """
    Nodes (annotated with ``heard``) silent for ``suspect_after_misses`` of their agent's periods,
    counted from their entering their state when that is later (``suspect``: a suspect node's own
    change does not count) and never from before ``since`` (a stall's end: nobody is silent
    until that many periods after it).
    """
    classes = ((~Q(agent_state__ping_run=""), policy.liveness_interval_s), (Q(agent_state__ping_run=""), None)) \
        if policy.liveness_interval_s else ((Q(), None),)
    found = _NOTHING
    for which, period in classes:
        cutoff = now - policy.suspect_after_misses * timedelta(seconds=period or policy.heartbeat_interval_s)
        if since is not None and since > cutoff:
            continue
        changed = Q(state_changed_at__isnull=True) | Q(state_changed_at__lte=cutoff)
        found |= which & Q(heard__lte=cutoff) & (changed | Q(state=NodeState.SUSPECT) if suspect else changed)
    return found


#
# The control plane's own stalls
#


@dataclass(frozen=True)
class Stall:
    """A round's view of the control plane: ``held`` -- judge no silence now; silence counts from ``resumed_at``."""

    held: bool = False
    resumed_at: datetime | None = None
    reason: str | None = None


def stall_judge(*, now: datetime, policy: FailurePolicy, watched: Q) -> Stall:
    """
    Whether the control plane stalled, from this round's own lateness, the time of its first
    statement and the pings of the ``watched`` nodes; the episode kept as one platform incident,
    resolved by the first round that finds no stall.
    """
    gap = _round_gap(now)
    started = monotonic()
    counts = _ping_counts(now, policy, watched)
    seen = Round(gap_s=gap, schedule_s=settings.MERIDIAN_WATCHDOG_SECONDS, database_s=monotonic() - started,
                 **counts)
    reason = control_plane_stall(seen, policy)
    open_ = Incident.objects.filter(kind=STALL, resolved_at__isnull=True).order_by("detected_at").first()
    if reason is not None:
        if open_ is None:
            open_ = _open(reason, seen, now, policy)
        held_for = (now - open_.impact_started_at).total_seconds()
        if held_for <= policy.stall_max_s:
            return Stall(held=True, reason=reason)
        # Stalled for longer than judgement may wait: nodes are judged again (the mass-silence
        # rule still keeps a region from being failed whole), their silence counted from then.
        return Stall(resumed_at=open_.impact_started_at + timedelta(seconds=policy.stall_max_s), reason=reason)
    if open_ is not None:
        log.warning("The control plane's stall (%s) is over; silence is counted from %s.",
                    open_.evidence.get("reason"), now.isoformat())
        Incident.objects.filter(kind=STALL, resolved_at__isnull=True).update(resolved_at=now, restored_at=now)
    recent = now - policy.faulty_after_misses * timedelta(seconds=policy.heartbeat_interval_s)
    ended = Incident.objects.filter(kind=STALL, resolved_at__gte=recent).aggregate(at=Max("resolved_at"))["at"]
    return Stall(resumed_at=ended)


def _round_gap(now: datetime) -> float | None:
    """Seconds since the round before this one began (None: none known, or a later one ran already)."""
    try:
        before = cache.get(ROUND_KEY)
        if before is None or before < now.timestamp():
            cache.set(ROUND_KEY, now.timestamp(), timeout=86400)
    except Exception:  # a cache that fails must not stop the watchdog: lateness is then not judged
        log.exception("heartbeat watchdog: the round's time could not be kept")
        return None
    return None if before is None or before >= now.timestamp() else now.timestamp() - before


def _ping_counts(now: datetime, policy: FailurePolicy, watched: Q) -> dict:
    """Of the watched nodes whose agents ping: how many, how many are late, how many say their pings struggle."""
    period = policy.liveness_interval_s
    if not period:
        Node.objects.filter(pk__isnull=True).exists()  # still the round's first statement, timed
        return {}
    late = now - timedelta(seconds=period + policy.stall_slack_s)
    changed = Q(state_changed_at__isnull=True) | Q(state_changed_at__lte=late) | Q(state=NodeState.SUSPECT)
    struggling = Q(agent_state__ping_failed__gt=0) | Q(agent_state__ping_rtt_ms__gt=period * 500)
    return (Node.objects.annotate(heard=HEARD)
            .filter(watched | Q(state=NodeState.SUSPECT), agent_state__isnull=False)
            .exclude(agent_state__ping_run="")
            .aggregate(pinging=Count("pk"), late=Count("pk", filter=Q(heard__lte=late) & changed),
                       distressed=Count("pk", filter=Q(agent_state__alive_at__gte=now - timedelta(seconds=2 * period))
                                        & struggling)))


_WHY = {
    "watchdog_late": "the heartbeat watchdog ran {gap:.1f} s after its round before (every {schedule:g} s)",
    "database_slow": "the database took {database:.1f} s to answer the watchdog's first statement",
    "pings_late": "{distressed} of {pinging} agents say their last liveness pings went unanswered or slow",
    "pings_stopped": "{late} of {pinging} agents' liveness pings stopped at once",
}


def _open(reason: str, seen: Round, now: datetime, policy: FailurePolicy) -> Incident:
    facts = {"gap": seen.gap_s or 0.0, "schedule": seen.schedule_s, "database": seen.database_s,
             "pinging": seen.pinging, "late": seen.late, "distressed": seen.distressed}
    why = _WHY[reason].format(**facts)
    log.warning("The control plane stalled: %s; no node is judged for silence until it ends.", why)
    began = now - timedelta(seconds=seen.gap_s) if reason == "watchdog_late" and seen.gap_s else now
    return Incident.objects.create(
        kind=STALL, tenant_id=None, impact_started_at=began, detected_at=now,
        summary=(f"The control plane stalled: {why}. The control plane's load, not the nodes, is the likelier "
                 f"cause of late pings: no node is made suspect or failed for silence while it lasts (at most "
                 f"{policy.stall_max_s:g} s), and silence is counted from its end")[:500],
        evidence={"reason": reason, "gap_s": seen.gap_s, "schedule_s": seen.schedule_s,
                  "database_s": round(seen.database_s, 3), "pinging": seen.pinging, "late": seen.late,
                  "distressed": seen.distressed})


def allocated_heard() -> Q:
    """A server a tenant holds, where an agent has been heard since the hand-over (nodes annotated with ``heard``)."""
    return Q(state=NodeState.ALLOCATED, heard__gte=F("state_changed_at"))
