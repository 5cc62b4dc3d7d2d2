"""
A team's record, read from what the database holds, as the inputs of the priority score.

Read-only queries. Per DESIGN.md: fulfilment over 30 days (reservations used as booked rather
than cancelled late or never used), current load (GPUs in use / the team's quota for that GPU
model; without a team quota the tenant's), and recent usage decayed by a half-life against the
team's fair share. A team (or a tenant's team-less work) with no history gets the neutral
fulfilment from the weights. No-show detection from telemetry comes with the stability work.
"""

from __future__ import annotations

import operator
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import reduce

from django.core.cache import cache
from django.db import connection
from django.db.models import Count, F, FloatField, Q, Sum
from django.db.models.functions import Cast

from provisioning.choices import ReservationState as R
from provisioning.models import Allocation, Reservation
from provisioning.scheduling.priority import Weights, decayed_usage, fulfilment_rate
from provisioning.transitions import QUOTA_STATES
from tenants.choices import QuotaResource
from tenants.models import Team
from tenants.quotas import quota_limits_many

RECORD_WINDOW = timedelta(days=30)
# Outcomes that count as "used as booked", and those that count against the team.
USED = {R.RELEASED, R.ACTIVE, R.RELEASING}
NOT_USED = {R.NO_SHOW}


@dataclass(frozen=True)
class TeamInputs:
    fulfilment_rate: float | None
    current_load: float
    usage_share: float
    high_priority: bool = False


def team_inputs(*, tenant, team, gpu_model_id, now: datetime, weights: Weights) -> TeamInputs:
    """The record of ``team`` (or of the tenant's team-less work) for one GPU model; ids or objects."""
    key = (getattr(tenant, "pk", tenant), getattr(team, "pk", team), gpu_model_id)
    return team_inputs_many([key], now=now, weights=weights)[key]


def team_inputs_recent(*, tenant, team, gpu_model_id, now: datetime, weights: Weights,
                       max_age_s: float) -> TeamInputs:
    """
    ``team_inputs`` as read at most ``max_age_s`` ago by any process (the shared cache): a create
    scores with it, as the scheduler loop does, instead of reading the team's history each time.
    """
    key = f"meridian:team-record:{tenant}:{team}:{gpu_model_id}"
    record = cache.get(key) if max_age_s > 0 else None
    if record is None:
        record = team_inputs(tenant=tenant, team=team, gpu_model_id=gpu_model_id, now=now, weights=weights)
        if max_age_s > 0:
            cache.set(key, record, max_age_s)
    return record


def team_inputs_many(keys, *, now: datetime, weights: Weights, usage: dict | None = None) -> dict[tuple, TeamInputs]:
    """
    The records of many owners at once, keyed ``(tenant_id, team_id or None, gpu_model_id)``:
    four grouped queries, and one for the teams' high-priority status, however many owners (the
    scheduler ranks every queued owner each cycle). ``high_priority``: the team's approved status
    lasts past ``now``. ``usage``: decayed usage per ``(tenant_id, team_id)`` as
    ``decayed_usage_many`` gave it a while ago (the scheduler loop rereads it less often than the
    rest); an owner it lacks is read.
    """
    keys = set(keys)
    tenant_ids = {tenant for tenant, _, _ in keys}
    owners = _owners_filter({(tenant, team) for tenant, team, _ in keys})
    mine = Reservation.objects.filter(owners)
    since = now - RECORD_WINDOW
    # One query, so a reservation that moves meanwhile cannot count as used but not in the total.
    outcomes = {
        (row["tenant_id"], row["team_id"]): (row["total"], row["used"])
        for row in mine.filter(submitted_at__gte=since, scheduled_at__isnull=False).values("tenant_id", "team_id")
        .annotate(total=Count("pk", filter=Q(state__in=USED | NOT_USED | {R.CANCELLED, R.PREEMPTED})),
                  used=Count("pk", filter=Q(state__in=USED)))
    }
    held = {
        (row["tenant_id"], row["team_id"], row["gpu_model_id"]): row["gpus"]
        for row in mine.filter(state__in=QUOTA_STATES).values("tenant_id", "team_id", "gpu_model_id")
        .annotate(gpus=Sum("gpus"))
    }
    limits_of = quota_limits_many(tenant_ids=tenant_ids, resource=QuotaResource.GPUS)
    pairs = {(tenant, team) for tenant, team, _ in keys}
    usage = dict(usage or {})
    if unread := pairs - usage.keys():
        usage.update(decayed_usage_many(unread, now=now, weights=weights))

    # Approved high-priority status, read live (not from the applications) so expiry needs no task.
    team_ids = {team for _, team, _ in keys if team}
    high_priority = set(Team.objects.filter(pk__in=team_ids, high_priority_until__gt=now)
                        .values_list("pk", flat=True)) if team_ids else set()

    records = {}
    for tenant, team, gpu_model_id in keys:
        total, used = outcomes.get((tenant, team), (0, 0))
        rate = fulfilment_rate(used, total, weights.neutral_fulfilment) if total else None
        limit = min((q.limit for q in limits_of(tenant, team, gpu_model_id)), default=0)
        in_use = held.get((tenant, team, gpu_model_id)) or 0
        # Fair share: what the team would accrue using its whole quota for one half-life.
        fair = max(limit, 1) * weights.usage_half_life_s / 3600
        records[(tenant, team, gpu_model_id)] = TeamInputs(
            fulfilment_rate=rate, current_load=in_use / limit if limit else 1.0,
            usage_share=usage[(tenant, team)] / fair, high_priority=team in high_priority)
    return records


def decayed_usage_many(owners, *, now: datetime, weights: Weights) -> dict[tuple, float]:
    """
    Recent usage of each ``(tenant_id, team_id or None)`` in GPU-hours, each allocation's
    decayed by its age (``priority.decayed_usage``; a slot counts as its share of the GPU's
    memory). PostgreSQL sums it in one grouped query; elsewhere one row per reservation and
    time range is summed here. Allocations that ended four half-lives ago count no more.
    """
    owners = set(owners)
    usage = dict.fromkeys(owners, 0.0)
    if not owners:
        return usage
    horizon = now - timedelta(seconds=4 * weights.usage_half_life_s)
    held = Allocation.objects.filter(reservation__in=Reservation.objects.filter(_owners_filter(owners)),
                                     ends_at__gt=horizon, starts_at__lt=now)
    summed = _decayed_usage_postgresql if connection.vendor == "postgresql" else _decayed_usage_python
    for owner, total in summed(held, now, weights.usage_half_life_s):
        if owner in usage:  # a tenant-wide read also finds the tenant's other teams
            usage[owner] = total
    return usage


def _usage_rows(held):
    """One row per reservation and time range (its GPUs' shares summed in SQL), not per GPU."""
    return held.values(
        "reservation__tenant_id", "reservation__team_id", "reservation_id", "starts_at", "ends_at",
    ).annotate(gpus=Sum(Cast(F("mem_hi") - F("mem_lo"), FloatField()) / F("gpu__memory_mib"))).values_list(
        "reservation__tenant_id", "reservation__team_id", "starts_at", "ends_at", "gpus",
    ).order_by()


def _decayed_usage_python(held, now: datetime, half_life_s: float) -> list[tuple[tuple, float]]:
    samples = defaultdict(list)
    for tenant, team, start, end, gpus in _usage_rows(held):
        age_s = (now - min(end, now)).total_seconds()
        samples[(tenant, team)].append((gpu_hours(start, end, 0, 1, 1, now) * gpus, age_s))
    return [(owner, decayed_usage(values, half_life_s)) for owner, values in samples.items()]


def _decayed_usage_postgresql(held, now: datetime, half_life_s: float) -> list[tuple[tuple, float]]:
    """The same sums over the same rows, decayed and added up per owner in the database."""
    rows, params = _usage_rows(held).query.sql_with_params()
    # Only the ORM's own SQL is formatted in; every value is a parameter.
    sql = ("SELECT tenant, team, SUM(GREATEST(0, EXTRACT(EPOCH FROM LEAST(ends, %s) - starts)) / 3600.0 * gpus"  # noqa: S608
           " * POWER(0.5, EXTRACT(EPOCH FROM %s - LEAST(ends, %s)) / %s)) "
           f"FROM ({rows}) AS used (tenant, team, starts, ends, gpus) GROUP BY tenant, team")
    with connection.cursor() as cursor:
        cursor.execute(sql, [now, now, now, float(half_life_s), *params])
        return [((tenant, team), float(total)) for tenant, team, total in cursor.fetchall()]


def _owners_filter(owners: set[tuple]) -> Q:
    """Exactly these owners when they are few (a create scores one); their tenants when many (a cycle)."""
    if len(owners) > 8:
        return Q(tenant_id__in={tenant for tenant, _ in owners})
    return reduce(operator.or_, (Q(tenant_id=tenant, team_id=team) if team else Q(tenant_id=tenant, team__isnull=True)
                                 for tenant, team in owners))


def gpu_hours(start, end, mem_lo: int, mem_hi: int, memory: int, now: datetime) -> float:
    """GPU-hours an allocation has used so far (a slot counts as its share of the GPU's memory)."""
    hours = max(0.0, (min(end, now) - start).total_seconds() / 3600)
    return hours * (mem_hi - mem_lo) / memory


class TeamRecords:
    """
    The scheduler loop's teams' records, reread every ``refresh_s`` (they move slowly: 30-day
    rates, load); owners new to the queue are read at once. Decayed usage, the costliest part
    (every allocation of the last weeks), is reread every ``usage_refresh_s``: with a half-life
    of days it moves by a fraction of a percent in minutes (Slurm's PriorityCalcPeriod, 5 min).
    """

    def __init__(self, refresh_s: float, usage_refresh_s: float | None = None):
        self.refresh_s = refresh_s
        self.usage_refresh_s = refresh_s if usage_refresh_s is None else usage_refresh_s
        self.records: dict[tuple, object] = {}
        self.usage: dict[tuple, float] = {}
        self.read_at = self.usage_read_at = float("-inf")

    def get(self, owners: set[tuple], now: datetime, w: Weights) -> dict:
        if time.monotonic() - self.usage_read_at >= self.usage_refresh_s:
            self.usage, self.usage_read_at, self.read_at = {}, time.monotonic(), float("-inf")
        if time.monotonic() - self.read_at >= self.refresh_s:
            self.records, self.read_at = {}, time.monotonic()
        missing = owners - self.records.keys()
        if missing:
            if unread := {(tenant, team) for tenant, team, _ in missing} - self.usage.keys():
                self.usage.update(decayed_usage_many(unread, now=now, weights=w))
            self.records.update(team_inputs_many(missing, now=now, weights=w, usage=self.usage))
        return self.records
