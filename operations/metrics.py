"""
What ``/metrics`` shows (issue 9, part 5), in the Prometheus text format:

- **Requests** of the control plane: django-prometheus's middlewares (``django_http_*``).
- **Celery tasks**: ``meridian_celery_tasks_total{task, state}`` (succeeded, failed, retried) and
  ``meridian_celery_task_duration_seconds{task}``, recorded by Celery signals in the process that
  runs the task. A worker's figures reach the web's ``/metrics`` through prometheus_client's
  multiprocess mode: set ``PROMETHEUS_MULTIPROC_DIR`` (the environment variable, before the
  processes start) to one empty folder shared by gunicorn and the workers of a machine.
- **The fleet**, computed at scrape time by :class:`FleetCollector` from a fixed number of grouped
  queries (seven), however large the fleet: nodes by state and pool, and by region and state with
  the region's ready spares; GPUs by health and state; GPUs allocated now by model and by tenant;
  the queue (length, oldest and mean wait, overall and by tenant) and the last hour's placements;
  the scheduler's last cycle and its budget (from the cache and settings, no query); provisioning
  step durations over the last hour (a gauge histogram: ``histogram_quantile`` applies directly,
  without ``rate``); incidents open and detected in the last day, by kind, and open by node.
- **What the alerting rules need besides** (operations.fleet_metrics): stuck operations, GPUs
  waiting for attestation reference values, recent XIDs per node, each tenant's month-to-date SLA
  availability; and **the control plane** (operations.control_metrics): scheduler and beat ages,
  workers answering, broker queue depths, dependency checks.

Fleet figures are gauges of "now" (or of a trailing window), never counters, so several web
processes answering scrapes agree without sharing state.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from datetime import datetime, timedelta

from celery import signals
from django.conf import settings
from django.db.models import Count, DateTimeField, DurationField, F, Min, OuterRef, Q, Subquery, Sum, Value
from django.db.models.expressions import ExpressionWrapper
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector

from cloud.choices import GPUState, Health, NodePool, NodeState
from cloud.models import GPU, Node
from operations.control_metrics import ControlPlaneCollector
from operations.fleet_metrics import AlertingCollector
from provisioning.capacity import SELLABLE_HEALTH
from provisioning.choices import ReservationState as R
from provisioning.models import Allocation, Reservation, StepRun
from provisioning.scheduling.scheduler import last_cycle
from security.models import Incident

STEP_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
TASK_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0)
STEP_WINDOW = timedelta(hours=1)
INCIDENT_WINDOW = timedelta(days=1)
# A spare in these states, healthy or degraded, can take a failed node's work now.
READY_SPARE_STATES = frozenset({NodeState.AVAILABLE, NodeState.IN_SERVICE})

#
# Celery tasks (recorded where the task runs)
#

TASKS = Counter("meridian_celery_tasks", "Celery tasks finished, by task name and outcome.", ["task", "state"])
TASK_SECONDS = Histogram("meridian_celery_task_duration_seconds", "Run time of Celery tasks, by task name.",
                         ["task"], buckets=TASK_BUCKETS)
TASK_STATES = {"SUCCESS": "succeeded", "FAILURE": "failed", "RETRY": "retried"}
_started: dict[str, float] = {}


def _task_started(task_id=None, task=None, **_):
    _started[task_id] = time.perf_counter()


def _task_finished(task_id=None, task=None, state=None, **_):
    began = _started.pop(task_id, None)
    name = getattr(task, "name", None) or "unknown"
    TASKS.labels(task=name, state=TASK_STATES.get(state, (state or "unknown").lower())).inc()
    if began is not None:
        TASK_SECONDS.labels(task=name).observe(time.perf_counter() - began)


# Connected once, in every process that imports this module (operations.tasks does, so every worker).
signals.task_prerun.connect(_task_started, weak=False, dispatch_uid="meridian.metrics.task_prerun")
signals.task_postrun.connect(_task_finished, weak=False, dispatch_uid="meridian.metrics.task_postrun")


#
# The fleet (computed at scrape time)
#


def _seconds(value: timedelta | None) -> float:
    return value.total_seconds() if value is not None else 0.0


class FleetCollector:
    """Fleet gauges from seven grouped queries; a new one per scrape (``now`` is the scrape's)."""
    def __init__(self, now: datetime | None = None):
        self.now = now or timezone.now()

    def collect(self):
        yield from self._nodes()
        yield from self._gpus()
        yield from self._queue()
        yield from self._scheduler()
        yield from self._steps()
        yield from self._incidents()

    def _nodes(self):
        rows = (Node.objects.order_by().values_list("state", "pool", "region__slug")
                .annotate(n=Count("pk"), spare=Count("pk", filter=Q(is_spare=True, health__in=SELLABLE_HEALTH))))
        counts: dict[tuple, int] = defaultdict(int)
        regions: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(NodeState.values, 0))
        spares: dict[str, int] = defaultdict(int)
        for state, pool, region, n, spare in rows:
            counts[(state, pool)] += n
            regions[region][state] += n
            spares[region] += spare if state in READY_SPARE_STATES else 0
        family = GaugeMetricFamily("meridian_nodes", "Nodes by lifecycle state and pool.", labels=["state", "pool"])
        for state in NodeState.values:
            for pool in NodePool.values:
                family.add_metric([state, pool], counts.get((state, pool), 0))
        yield family
        by_region = GaugeMetricFamily("meridian_region_nodes", "Nodes of each region by lifecycle state (spares "
                                      "included).", labels=["region", "state"])
        ready = GaugeMetricFamily("meridian_region_spare_nodes", "Spare nodes of each region ready to replace "
                                  "failed hardware (available or in service, healthy or degraded).", labels=["region"])
        for region, states in sorted(regions.items()):
            for state, n in states.items():
                by_region.add_metric([region, state], n)
            ready.add_metric([region], spares[region])
        yield by_region
        yield ready

    def _gpus(self):
        counts = {(health, state): n for health, state, n in
                  GPU.objects.order_by().values_list("health", "state").annotate(n=Count("pk"))}
        family = GaugeMetricFamily("meridian_gpus", "GPUs by last known health and (shared hosts) state.",
                                   labels=["health", "state"])
        for health in Health.values:
            for state in GPUState.values:
                family.add_metric([health, state], counts.get((health, state), 0))
        yield family
        allocated = GaugeMetricFamily("meridian_gpus_allocated",
                                      "GPUs held by an allocation now (whole or in slots), by GPU model.",
                                      labels=["model"])
        for model, n in (Allocation.objects.holding(self.now).order_by()
                         .values_list("gpu__model__slug").annotate(n=Count("gpu", distinct=True))):
            allocated.add_metric([model], n)
        yield allocated
        # Its own query: a GPU shared by two tenants counts once in its model's figure, once in each tenant's.
        tenants = GaugeMetricFamily("meridian_tenant_gpus_allocated",
                                    "GPUs a tenant's allocations hold now (whole or in slots), by tenant.",
                                    labels=["tenant"])
        for tenant, n in (Allocation.objects.holding(self.now).order_by()
                          .values_list("reservation__tenant__slug").annotate(n=Count("gpu", distinct=True))):
            tenants.add_metric([tenant], n)
        yield tenants

    def _queue(self):
        hour_ago = self.now - STEP_WINDOW
        waited = ExpressionWrapper(Value(self.now, output_field=DateTimeField()) - F("submitted_at"),
                                   output_field=DurationField())
        placement = ExpressionWrapper(F("scheduled_at") - F("submitted_at"), output_field=DurationField())
        queued, placed = Q(state=R.QUEUED), Q(scheduled_at__gte=hour_ago)
        rows = (Reservation.objects.filter(queued | placed).order_by().values_list("tenant__slug").annotate(
            queued=Count("pk", filter=queued), oldest=Min("submitted_at", filter=queued),
            waited=Sum(waited, filter=queued), placed=Count("pk", filter=placed),
            placement=Sum(placement, filter=placed)))
        n_queued = n_placed = 0
        oldest, waited_s, placement_s = None, 0.0, 0.0
        tenant_queue = GaugeMetricFamily("meridian_tenant_queue_reservations",
                                         "Reservations waiting in the queue, by tenant (those with any).",
                                         labels=["tenant"])
        tenant_wait = GaugeMetricFamily("meridian_tenant_queue_wait_seconds",
                                        "How long a tenant's queued reservations have waited.",
                                        labels=["tenant", "stat"])
        for tenant, t_queued, t_oldest, t_waited, t_placed, t_placement in rows:
            n_queued, n_placed = n_queued + t_queued, n_placed + t_placed
            waited_s, placement_s = waited_s + _seconds(t_waited), placement_s + _seconds(t_placement)
            if t_oldest is not None:
                oldest = t_oldest if oldest is None else min(oldest, t_oldest)
            if t_queued:
                tenant_queue.add_metric([tenant], t_queued)
                tenant_wait.add_metric([tenant, "oldest"], (self.now - t_oldest).total_seconds())
                tenant_wait.add_metric([tenant, "mean"], _seconds(t_waited) / t_queued)
        yield GaugeMetricFamily("meridian_queue_reservations", "Reservations waiting in the queue.", value=n_queued)
        wait = GaugeMetricFamily("meridian_queue_wait_seconds", "How long the queued reservations have waited.",
                                 labels=["stat"])
        wait.add_metric(["oldest"], (self.now - oldest).total_seconds() if oldest else 0.0)
        wait.add_metric(["mean"], waited_s / n_queued if n_queued else 0.0)
        yield wait
        yield tenant_queue
        yield tenant_wait
        yield GaugeMetricFamily("meridian_reservations_placed_last_hour",
                                "Reservations placed (scheduled) in the last hour.", value=n_placed)
        yield GaugeMetricFamily("meridian_placement_wait_seconds_last_hour",
                                "Mean time from submission to placement of the last hour's placements.",
                                value=placement_s / n_placed if n_placed else 0.0)

    def _scheduler(self):
        cycle = last_cycle() or {}
        phases = GaugeMetricFamily("meridian_scheduler_cycle_phase_seconds",
                                   "Time of each phase of the scheduler's last cycle.", labels=["phase"])
        for phase, ms in sorted((cycle.get("timings_ms") or {}).items()):
            phases.add_metric([phase], ms / 1000)
        yield phases
        yield GaugeMetricFamily("meridian_scheduler_cycle_seconds", "Duration of the scheduler's last cycle.",
                                value=sum((cycle.get("timings_ms") or {}).values()) / 1000)
        yield GaugeMetricFamily("meridian_scheduler_cycle_budget_seconds",
                                "What one cycle should take (MERIDIAN_SCHEDULER_CYCLE_BUDGET_MS; 0: no limit).",
                                value=settings.MERIDIAN_SCHEDULER_CYCLE_BUDGET_MS / 1000)
        outcomes = GaugeMetricFamily("meridian_scheduler_cycle_reservations",
                                     "What the scheduler's last cycle did with the queue.", labels=["outcome"])
        for outcome in ("queued", "placed", "conflicts", "over_quota", "waiting"):
            outcomes.add_metric([outcome], cycle.get(outcome, 0))
        yield outcomes
        finished = parse_datetime(cycle["finished_at"]) if cycle.get("finished_at") else None
        yield GaugeMetricFamily("meridian_scheduler_last_cycle_timestamp_seconds",
                                "When the scheduler's last cycle finished (Unix time; 0 before the first).",
                                value=finished.timestamp() if finished else 0.0)

    def _steps(self):
        duration = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
        buckets = {f"le_{i}": Count("pk", filter=Q(duration__lte=timedelta(seconds=b)))
                   for i, b in enumerate(STEP_BUCKETS)}
        rows = (StepRun.objects.filter(finished_at__gte=self.now - STEP_WINDOW).annotate(duration=duration)
                .order_by().values("name", "state").annotate(n=Count("pk"), total=Sum("duration"), **buckets))
        runs = GaugeMetricFamily("meridian_provisioning_steps_last_hour",
                                 "Provisioning, cleaning and validation step runs finished in the last hour, "
                                 "by step and outcome.", labels=["step", "state"])
        by_step: dict[str, dict] = {}
        for row in rows:
            runs.add_metric([row["name"], row["state"]], row["n"])
            step = by_step.setdefault(row["name"], {"n": 0, "total": 0.0, **{key: 0 for key in buckets}})
            step["n"] += row["n"]
            step["total"] += _seconds(row["total"])
            for key in buckets:
                step[key] += row[key]
        yield runs
        histogram = GaugeHistogramMetricFamily(
            "meridian_provisioning_step_duration_seconds",
            "Durations of the step runs finished in the last hour, by step (a window, not a running total).",
            labels=["step"])
        for name, step in sorted(by_step.items()):
            edges = [(str(b), step[f"le_{i}"]) for i, b in enumerate(STEP_BUCKETS)]
            histogram.add_metric([name], [*edges, ("+Inf", step["n"])], step["total"])
        yield histogram

    def _incidents(self):
        open_, recent = Q(resolved_at__isnull=True), Q(detected_at__gte=self.now - INCIDENT_WINDOW)
        hostname = Subquery(Node.objects.filter(pk=OuterRef("node_id")).values("hostname")[:1])
        rows = (Incident.objects.filter(open_ | recent).order_by().values_list("kind", "node_id")
                .annotate(open=Count("pk", filter=open_), recent=Count("pk", filter=recent), hostname=hostname))
        by_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        per_node = GaugeMetricFamily("meridian_node_incidents_open",
                                     "Incidents not yet resolved that name a node, by kind and node (nodes with "
                                     "none are left out).", labels=["kind", "node"])
        for kind, node_id, n_open, n_recent, host in rows:
            by_kind[kind][0] += n_open
            by_kind[kind][1] += n_recent
            if node_id is not None and n_open:
                per_node.add_metric([kind, host or str(node_id)], n_open)
        opened = GaugeMetricFamily("meridian_incidents_open", "Incidents not yet resolved, by kind.", labels=["kind"])
        detected = GaugeMetricFamily("meridian_incidents_detected_last_day", "Incidents detected in the last 24 hours, "
                                     "by kind.", labels=["kind"])
        for kind, (n_open, n_recent) in sorted(by_kind.items()):
            opened.add_metric([kind], n_open)
            detected.add_metric([kind], n_recent)
        yield opened
        yield detected
        yield per_node


#
# The scrape
#


class _ProcessMetrics:
    """This process's own metrics (prometheus_client's default registry), when not in multiprocess mode."""
    def collect(self):
        return REGISTRY.collect()


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


def scrape(now: datetime | None = None, accept: str = "") -> tuple[bytes, str]:
    """
    One scrape and its content type: the request and task metrics (of every process sharing
    ``PROMETHEUS_MULTIPROC_DIR`` when it is set, else of this process) and the fleet's, in the
    Prometheus text format, or OpenMetrics when the ``Accept`` header asks for it.
    """
    registry = CollectorRegistry()
    if multiprocess_dir():
        MultiProcessCollector(registry)
    else:
        registry.register(_ProcessMetrics())
    now = now or timezone.now()
    registry.register(FleetCollector(now))
    registry.register(AlertingCollector(now))
    registry.register(ControlPlaneCollector())
    encode, content_type = choose_encoder(accept)
    return encode(registry), content_type


__all__ = ["FleetCollector", "TASKS", "TASK_SECONDS", "multiprocess_dir", "scrape"]
