"""
Fleet alerts from the operator's rules of thumb (issue 9, part 5), over the 1-minute telemetry
rollups (``GPUSampleRollup``), evaluated every minute by the ``cloud.alerts_evaluate`` task:

- **Utilization fluctuation.** A busy GPU (mean utilization of at least
  ``MERIDIAN_ALERT_MIN_UTILIZATION`` %) whose utilization over the last ``MERIDIAN_ALERT_WINDOW_MIN``
  minutes has a coefficient of variation (std / mean) above ``MERIDIAN_ALERT_FLUCTUATION`` (0.15) is
  fluctuating: a straggler, throttling or a stalling interconnect. Each GPU is judged over time on
  its own (sums and sums of squares combine across buckets), so idle GPUs beside busy ones on a
  shared host do not count as fluctuation; a node with any such GPU gets one platform incident,
  kind ``utilization_fluctuation``, naming them.
- **Repeated XIDs.** ``MERIDIAN_ALERT_XIDS`` or more XID errors on one node's GPUs together within
  the window: a platform incident, kind ``repeated_xids_node`` (the failure policy of cloud.health
  acts on single GPUs; this is the node-level view).
- **Idle reserved GPUs.** GPUs of an active reservation that showed 0 % utilization and no process
  in every sample for ``MERIDIAN_IDLE_GPU_MINUTES`` (30): the tenant is told, with the evidence, in
  an in-app notification (kind ``reservation.gpus_idle``), at most once per reservation in that many
  minutes. A GPU with telemetry for less than ``MIN_COVERAGE`` of the period is never called idle.

Idempotent: an alert incident stays one open incident per node and kind while its condition holds
(a run finds it and adds nothing), and is resolved by the first run that sees the node's telemetry
without the condition; runs are serialised by a leader lock, so two workers never both open one.
The judging is pure (:func:`judge_gpu`, :func:`node_findings`, :func:`idle_gpus`); the rest reads
a few grouped queries and writes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Sum
from django.utils import timezone

from cloud.leader import LeaderLock
from cloud.models import GPUSampleRollup, RollupPeriod
from provisioning.choices import ReservationState as R
from provisioning.models import Allocation, Reservation
from security.models import Incident
from tenants.models import Notification
from tenants.notifications import notify

FLUCTUATION = "utilization_fluctuation"
REPEATED_XIDS = "repeated_xids_node"
ALERT_KINDS = (FLUCTUATION, REPEATED_XIDS)
IDLE_NOTICE = "reservation.gpus_idle"
MIN_COVERAGE = 0.8  # share of a period's minutes a GPU must have telemetry for to be judged idle


@dataclass(frozen=True)
class AlertPolicy:
    window_min: int = 10
    fluctuation: float = 0.15
    min_utilization: float = 5.0
    xids: int = 3
    idle_min: int = 30

    @classmethod
    def from_settings(cls) -> AlertPolicy:
        return cls(window_min=settings.MERIDIAN_ALERT_WINDOW_MIN, fluctuation=settings.MERIDIAN_ALERT_FLUCTUATION,
                   min_utilization=settings.MERIDIAN_ALERT_MIN_UTILIZATION, xids=settings.MERIDIAN_ALERT_XIDS,
                   idle_min=settings.MERIDIAN_IDLE_GPU_MINUTES)


#
# Judging (pure)
#


@dataclass(frozen=True)
class GPUWindow:
    """One GPU's rollups over a window, summed: samples with a utilization reading, their sum and squares, XIDs."""
    gpu_id: UUID
    index: int
    node_id: UUID
    hostname: str
    samples: int
    utilization_sum: float
    utilization_sumsq: float
    xids: int = 0

    @property
    def mean(self) -> float:
        return self.utilization_sum / self.samples if self.samples else 0.0

    @property
    def std(self) -> float:
        if not self.samples:
            return 0.0
        return math.sqrt(max(self.utilization_sumsq / self.samples - self.mean ** 2, 0.0))  # rounding: never < 0


def judge_gpu(window: GPUWindow, policy: AlertPolicy) -> float | None:
    """The GPU's coefficient of variation when it is busy enough to judge and fluctuates too much, else None."""
    if window.samples < 2 or window.mean < policy.min_utilization:
        return None
    cv = window.std / window.mean
    return cv if cv > policy.fluctuation else None


@dataclass(frozen=True)
class Finding:
    kind: str
    node_id: UUID
    hostname: str
    summary: str
    evidence: dict = field(default_factory=dict)


def node_findings(windows: list[GPUWindow], policy: AlertPolicy) -> tuple[list[Finding], set[UUID]]:
    """The findings of every node, and the nodes judged (those with telemetry in the window)."""
    by_node = defaultdict(list)
    for w in windows:
        if w.samples:
            by_node[w.node_id].append(w)
    findings = []
    for node_id, gpus in by_node.items():
        hostname = gpus[0].hostname
        fluctuating = [(w, cv) for w in gpus if (cv := judge_gpu(w, policy)) is not None]
        if fluctuating:
            worst = max(cv for _, cv in fluctuating)
            findings.append(Finding(
                FLUCTUATION, node_id, hostname,
                f"{hostname}: utilization fluctuates on {len(fluctuating)} GPU(s), std/mean up to {worst:.2f} "
                f"(> {policy.fluctuation:g}) over {policy.window_min} min",
                {"window_min": policy.window_min, "threshold": policy.fluctuation,
                 "gpus": [{"index": w.index, "mean": round(w.mean, 2), "std": round(w.std, 2), "cv": round(cv, 3),
                           "samples": w.samples} for w, cv in sorted(fluctuating, key=lambda p: p[0].index)]}))
        xids = sum(w.xids for w in gpus)
        if xids >= policy.xids:
            findings.append(Finding(
                REPEATED_XIDS, node_id, hostname,
                f"{hostname}: {xids} XIDs on its GPUs within {policy.window_min} min (alert at {policy.xids})",
                {"window_min": policy.window_min, "threshold": policy.xids, "xids": xids,
                 "gpus": {str(w.index): w.xids for w in sorted(gpus, key=lambda w: w.index) if w.xids}}))
    return findings, set(by_node)


def idle_gpus(rows: dict[UUID, tuple[int, int, int]], policy: AlertPolicy) -> set[UUID]:
    """GPUs idle for the whole period: ``rows`` maps a GPU to (minute buckets, samples, idle samples)."""
    needed = max(1, math.ceil(policy.idle_min * MIN_COVERAGE))
    return {gpu for gpu, (buckets, samples, idle) in rows.items() if buckets >= needed and samples and idle == samples}


#
# Reading and acting
#


def _gpu_windows(since: datetime, now: datetime) -> list[GPUWindow]:
    rows = (GPUSampleRollup.objects.filter(period=RollupPeriod.MINUTE, bucket__gte=since, bucket__lt=now)
            .order_by().values_list("gpu_id", "gpu__index", "gpu__node_id", "gpu__node__hostname")
            .annotate(samples=Sum("utilization_samples"), s=Sum("utilization_sum"), ss=Sum("utilization_sumsq"),
                      xids=Sum("xid_count")))
    return [GPUWindow(gpu, index, node, hostname, samples or 0, s or 0.0, ss or 0.0, xids or 0)
            for gpu, index, node, hostname, samples, s, ss, xids in rows]


def _open_or_resolve(findings: list[Finding], judged: set[UUID], since: datetime, now: datetime) -> tuple[int, int]:
    """
    Open an incident per new finding (its impact from the window's start); resolve the open alert
    incidents of judged nodes whose condition cleared.
    """
    open_incidents = {(kind, node): pk for kind, node, pk in Incident.objects.filter(
        kind__in=ALERT_KINDS, resolved_at__isnull=True).values_list("kind", "node_id", "id")}
    found = {(f.kind, f.node_id) for f in findings}
    new = [Incident(kind=f.kind, node_id=f.node_id, summary=f.summary[:500], evidence=f.evidence,
                    impact_started_at=since) for f in findings if (f.kind, f.node_id) not in open_incidents]
    Incident.objects.bulk_create(new)
    cleared = [pk for (kind, node), pk in open_incidents.items() if node in judged and (kind, node) not in found]
    if cleared:
        Incident.objects.filter(pk__in=cleared, resolved_at__isnull=True).update(resolved_at=now)
    return len(new), len(cleared)


def _notify_idle(policy: AlertPolicy, now: datetime) -> int:
    """Tell the tenants of active reservations whose GPUs sat idle for the whole idle period; returns how many."""
    since = now - timedelta(minutes=policy.idle_min)
    # GPUs an active reservation has held since before the period began, and still holds.
    held = Allocation.objects.filter(starts_at__lte=since, ends_at__gt=now, reservation__state=R.ACTIVE)
    gpus_of = defaultdict(set)
    for reservation_id, gpu_id in held.order_by().values_list("reservation_id", "gpu_id"):
        gpus_of[reservation_id].add(gpu_id)
    if not gpus_of:
        return 0
    rows = {gpu: (buckets, samples or 0, idle or 0) for gpu, buckets, samples, idle in (
        GPUSampleRollup.objects.filter(period=RollupPeriod.MINUTE, bucket__gte=since, bucket__lt=now,
                                       gpu_id__in=held.values("gpu_id"))
        .order_by().values_list("gpu_id").annotate(n=Count("pk"), s=Sum("samples"), i=Sum("idle_samples")))}
    idle = idle_gpus(rows, policy)
    flagged = {r: gpus & idle for r, gpus in gpus_of.items() if gpus & idle}
    if not flagged:
        return 0
    links = {r: f"/reservations/{r}/" for r in flagged}
    told = set(Notification.objects.filter(kind=IDLE_NOTICE, created_at__gte=since, link__in=links.values())
               .values_list("link", flat=True))
    due = [r for r in flagged if links[r] not in told]
    reservations = Reservation.objects.select_related("tenant", "team").in_bulk(due)
    for reservation_id in due:
        reservation = reservations[reservation_id]
        out, of = len(flagged[reservation_id]), len(gpus_of[reservation_id])
        samples = sum(rows[g][1] for g in flagged[reservation_id])
        notify(reservation.tenant, team=reservation.team, kind=IDLE_NOTICE, link=links[reservation_id],
               title=f"{out} of {of} GPUs of {reservation.name} idle for {policy.idle_min} minutes",
               body=(f"From {since:%Y-%m-%d %H:%M} to {now:%H:%M} UTC, {out} of the {of} GPUs held by "
                     f"{reservation.name} showed 0 % utilization and no process in every one of their {samples} "
                     f"samples. They are still reserved (and billed); release the reservation if the work is "
                     f"done, or check that your job is running on them."))
    return len(due)


def alerts_evaluate(*, now: datetime | None = None, policy: AlertPolicy | None = None) -> dict:
    """
    One evaluation of every alert (the minute task): opens and resolves alert incidents, tells
    tenants about idle GPUs. Skipped when another run holds the lock; safe to run again at once.
    """
    now = now or timezone.now()
    policy = policy or AlertPolicy.from_settings()
    lock = LeaderLock("alerts", lease=timedelta(minutes=2))
    if not lock.acquire():
        return {"skipped": True}
    try:
        with transaction.atomic():
            since = now - timedelta(minutes=policy.window_min)
            findings, judged = node_findings(_gpu_windows(since, now), policy)
            opened, resolved = _open_or_resolve(findings, judged, since, now)
            told = _notify_idle(policy, now)
    finally:
        lock.release()
    return {"opened": opened, "resolved": resolved, "idle_notified": told, "nodes_judged": len(judged)}
