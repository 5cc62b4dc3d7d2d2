"""
One autoscaler pass over an endpoint: measure, decide (inference.autoscaler), move the burst flag,
record the decision with its inputs, then converge the replicas (inference.replicas).
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from inference.autoscaler import Rule, decide
from inference.choices import Decision, EndpointState
from inference.loads import region_load, replica_utilization
from inference.models import Endpoint, ScalingDecision
from inference.replicas import burst_regions, converge, record


def rule_of(endpoint: Endpoint) -> Rule:
    return Rule(min_replicas=endpoint.min_replicas, max_replicas=endpoint.max_replicas,
                target=endpoint.target_utilization, scale_in_below=endpoint.scale_in_below,
                scale_out_stabilization_s=endpoint.scale_out_stabilization_seconds,
                scale_in_stabilization_s=endpoint.scale_in_stabilization_seconds,
                scale_out_cooldown_s=endpoint.scale_out_cooldown_seconds,
                scale_in_cooldown_s=endpoint.scale_in_cooldown_seconds,
                spare_pct=endpoint.spare_pct, spare_above=endpoint.spare_above)


def autoscale(endpoint_id, *, now: datetime | None = None) -> ScalingDecision | None:
    """Decide for one endpoint and converge it; the decision recorded (None when nothing was to decide)."""
    now = now or timezone.now()
    recorded = None
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update(of=("self",)).select_related("offering").filter(
            pk=endpoint_id, state=EndpointState.ACTIVE).first()
        if endpoint is None:
            return None
        inputs = replica_utilization(endpoint, now)
        home_load = region_load(endpoint.home, endpoint, now)
        inputs["home_region"], inputs["home_load_pct"] = endpoint.home, round(home_load * 100, 1)
        recorded = _burst(endpoint, home_load, now, inputs)
        verdict = decide(rule=rule_of(endpoint), current=endpoint.desired_replicas, serving=inputs["serving"],
                         utilization=inputs["utilization"], now=now.timestamp(), history=endpoint.recommendations,
                         last_change=endpoint.last_scaled_at.timestamp() if endpoint.last_scaled_at else None)
        endpoint.recommendations = verdict.history
        inputs["recommendation"] = verdict.recommendation
        if verdict.action in (Decision.SCALE_OUT, Decision.SCALE_IN):
            recorded = record(endpoint, verdict.action, endpoint.desired_replicas, verdict.replicas, verdict.reason,
                              inputs, now)
            endpoint.desired_replicas, endpoint.last_scaled_at = verdict.replicas, now
        elif verdict.action == Decision.HOLD:
            recorded = record(endpoint, Decision.HOLD, endpoint.desired_replicas, endpoint.desired_replicas,
                              verdict.reason, inputs, now)
        endpoint.save(update_fields=["recommendations", "desired_replicas", "last_scaled_at", "home_hot_since",
                                     "bursting"])
    converge(endpoint_id)
    return recorded


def _burst(endpoint: Endpoint, home_load: float, now: datetime, inputs: dict) -> ScalingDecision | None:
    """Hot home for ``burst_after_seconds``: new replicas go to the next region with room; back when home cools."""
    hot = home_load * 100 > endpoint.burst_utilization
    if not hot:
        endpoint.home_hot_since = None
        if endpoint.bursting:
            endpoint.bursting = False
            return record(endpoint, Decision.RETURN, endpoint.desired_replicas, endpoint.desired_replicas,
                          f"{endpoint.home} has room again ({home_load:.0%} busy): new replicas start there and "
                          "burst ones drain as they serve", inputs, now)
        return None
    endpoint.home_hot_since = endpoint.home_hot_since or now
    hot_for = (now - endpoint.home_hot_since).total_seconds()
    inputs["home_hot_for_s"] = round(hot_for)
    if endpoint.bursting or hot_for < endpoint.burst_after_seconds or len(endpoint.regions) < 2:
        return None
    room = burst_regions(endpoint)
    if not room:
        return None
    endpoint.bursting = True
    return record(endpoint, Decision.BURST, endpoint.desired_replicas, endpoint.desired_replicas,
                  f"{endpoint.home} above {endpoint.burst_utilization}% for {hot_for:.0f} s: new replicas go to "
                  f"{room[0]}", {**inputs, "burst_to": room[0], "headroom": settings.MERIDIAN_HEADROOM}, now)


def autoscale_all(*, now: datetime | None = None) -> int:
    """Every active endpoint, each in its own transaction; returns how many decisions were recorded."""
    ids = list(Endpoint.objects.filter(state__in=[EndpointState.ACTIVE, EndpointState.DELETING])
               .values_list("pk", "state"))
    recorded = 0
    for pk, state in ids:
        if state == EndpointState.DELETING:
            converge(pk)
        elif autoscale(pk, now=now) is not None:
            recorded += 1
    return recorded
