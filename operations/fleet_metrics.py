"""
The gauges the alerting rules (deploy/prometheus/meridian-rules.yml) need beyond the fleet's
counts, computed at scrape time by :class:`AlertingCollector`:

- ``meridian_operations_unfinished{kind}`` and ``meridian_operations_stuck{kind}``: operations
  pending or running, and those of them untouched for ``MERIDIAN_STUCK_AFTER`` (the lifecycle
  tick's reaper resumes or fails such work, so one that stays is work nobody is moving). One
  grouped query, on the ``(state, updated_at)`` index.
- ``meridian_attestation_references_missing{model, vbios, driver}``: GPUs of the nodes held in
  ``reference_unavailable`` whose latest such verdict says ``reference_missing`` for that
  firmware -- what staff register (or whose RIM they import) to let them back. One query, over
  the few held nodes.
- ``meridian_node_xids_recent{node, region}``: XIDs on each node's GPUs over the last
  ``MERIDIAN_ALERT_WINDOW_MIN`` minutes of the minute rollups; nodes with none are left out. The
  rollups close once a minute, so the figure is read at most once a minute (the cache) rather
  than on every scrape.
- ``meridian_tenant_sla_availability_percent{tenant}`` and ``meridian_sla_target_percent``: the
  month-to-date availability of each tenant that held anything this month, as
  ``provisioning.sla.accounting`` counts it (four queries), cached for ``SLA_CACHE_S``: it moves
  by the minute, and an alert on it waits longer than that.

A scrape costs two queries here, and at most five more when a cached figure expired.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, Q, Sum
from prometheus_client.core import GaugeMetricFamily

from cloud.choices import NodeState
from cloud.models import GPUSampleRollup, Node, RollupPeriod
from provisioning.choices import OperationKind, OperationState
from provisioning.models import Operation, Reservation
from provisioning.sla.accounting import sla_for_tenants, sla_target
from security.models import AttestationReport
from tenants.models import Tenant

XIDS_CACHE_KEY = "meridian:metrics:node-xids"
XIDS_CACHE_S = 60
SLA_CACHE_KEY = "meridian:metrics:sla"
SLA_CACHE_S = 300
UNFINISHED = (OperationState.PENDING, OperationState.RUNNING)
MISSING = "reference_missing"


def _operations(now: datetime):
    stuck_before = now - settings.MERIDIAN_STUCK_AFTER
    rows = {kind: (n, stuck) for kind, n, stuck in (
        Operation.objects.filter(state__in=UNFINISHED).order_by().values_list("kind")
        .annotate(n=Count("pk"), stuck=Count("pk", filter=Q(updated_at__lt=stuck_before))))}
    unfinished = GaugeMetricFamily("meridian_operations_unfinished", "Operations pending or running, by kind.",
                                   labels=["kind"])
    stuck = GaugeMetricFamily("meridian_operations_stuck",
                              "Unfinished operations that made no progress for MERIDIAN_STUCK_AFTER, by kind.",
                              labels=["kind"])
    for kind in OperationKind.values:
        n, n_stuck = rows.get(kind, (0, 0))
        unfinished.add_metric([kind], n)
        stuck.add_metric([kind], n_stuck)
    yield unfinished
    yield stuck


def references_missing(reports) -> dict[tuple[str, str, str], int]:
    """GPUs per (model, VBIOS, driver) that ``reports`` (``(gpus, reasons)`` pairs) say lack reference values."""
    found: dict[tuple[str, str, str], int] = defaultdict(int)
    for gpus, reasons in reports:
        by_uuid = {g.get("uuid"): g for g in gpus or () if isinstance(g, dict)}
        missing = {r.get("gpu") for r in reasons or () if isinstance(r, dict) and r.get("check") == MISSING}
        for uuid in missing:
            gpu = by_uuid.get(uuid) or {}
            found[(str(gpu.get("model") or ""), str(gpu.get("vbios") or ""), str(gpu.get("driver") or ""))] += 1
    return found


def _attestation():
    held = Node.objects.filter(state=NodeState.REFERENCE_UNAVAILABLE).values("pk")
    latest = (AttestationReport.objects.filter(node_id__in=held, status=AttestationReport.Status.REFERENCE_UNAVAILABLE)
              .order_by("node_id", "-verified_at").distinct("node_id").values_list("gpus", "reasons"))
    family = GaugeMetricFamily("meridian_attestation_references_missing",
                               "GPUs of nodes held in reference_unavailable whose firmware has no reference values, "
                               "by GPU model, VBIOS and driver.", labels=["model", "vbios", "driver"])
    for (model, vbios, driver), n in sorted(references_missing(latest).items()):
        family.add_metric([model, vbios, driver], n)
    yield family


def node_xids(now: datetime) -> list[tuple[str, str, int]]:
    """(hostname, region, XIDs) of the nodes with XIDs in the alert window; read at most once a minute."""
    found = cache.get(XIDS_CACHE_KEY)
    if found is None:
        since = now - timedelta(minutes=settings.MERIDIAN_ALERT_WINDOW_MIN)
        found = [list(row) for row in (
            GPUSampleRollup.objects.filter(period=RollupPeriod.MINUTE, bucket__gte=since, bucket__lt=now,
                                           xid_count__gt=0)
            .order_by().values_list("gpu__node__hostname", "gpu__node__region__slug").annotate(n=Sum("xid_count")))]
        cache.set(XIDS_CACHE_KEY, found, XIDS_CACHE_S)
    return [tuple(row) for row in found]


def _xids(now: datetime):
    family = GaugeMetricFamily("meridian_node_xids_recent",
                               "XID errors on the node's GPUs in the last MERIDIAN_ALERT_WINDOW_MIN minutes (minute "
                               "rollups; nodes with none are left out).", labels=["node", "region"])
    for hostname, region, n in sorted(node_xids(now)):
        family.add_metric([hostname, region], n)
    yield family


def tenant_availability(now: datetime) -> dict[str, float]:
    """Month-to-date availability (%) by tenant slug, of the tenants that held anything; cached SLA_CACHE_S."""
    found = cache.get(SLA_CACHE_KEY)
    if found is None:
        figures = sla_for_tenants(Reservation.objects.all(), tenant_ids=None, month=now.date().replace(day=1),
                                  now=now)
        slugs = dict(Tenant.objects.filter(pk__in=list(figures)).values_list("pk", "slug")) if figures else {}
        found = {slugs[t]: float(f.availability) for t, f in figures.items() if t in slugs}
        cache.set(SLA_CACHE_KEY, found, SLA_CACHE_S)
    return found


def _sla(now: datetime):
    yield GaugeMetricFamily("meridian_sla_target_percent", "The monthly availability target (MERIDIAN_SLA_TARGET).",
                            value=float(sla_target()))
    family = GaugeMetricFamily("meridian_tenant_sla_availability_percent",
                               "Month-to-date availability of what the tenant reserved (provisioning.sla), by "
                               "tenant; refreshed every few minutes.", labels=["tenant"])
    for tenant, availability in sorted(tenant_availability(now).items()):
        family.add_metric([tenant], availability)
    yield family


class AlertingCollector:
    """The gauges above; a new one per scrape (``now`` is the scrape's)."""
    def __init__(self, now: datetime):
        self.now = now

    def collect(self):
        yield from _operations(self.now)
        yield from _attestation()
        yield from _xids(self.now)
        yield from _sla(self.now)


__all__ = ["AlertingCollector", "node_xids", "references_missing", "tenant_availability"]
