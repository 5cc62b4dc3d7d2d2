"""
A synthetic load for the demo and the benchmarks: an endpoint's ``synthetic_load`` says how much work
it is offered, in replicas' worth at 100 % (``base`` most of the time, ``peak`` for ``peak_s`` of every
``period_s``). The simulated node agents (manage.py run_agents) set each serving replica's GPUs to its
share of it, so the autoscaler sees utilization rise and fall as it would under real traffic.
"""

from __future__ import annotations

import time

from inference.choices import EndpointState, ReplicaState
from inference.models import Endpoint, Replica
from provisioning.models import Instance


def offered(profile: dict, at: float) -> float:
    """Replicas' worth of work offered at ``at`` (unix seconds)."""
    period = max(1.0, float(profile.get("period_s", 600)))
    peak_s = float(profile.get("peak_s", period / 2))
    return float(profile.get("peak", 2.0)) if (at % period) < peak_s else float(profile.get("base", 0.5))


def gpu_targets(at: float | None = None) -> dict[tuple[str, int], int]:
    """(hostname, GPU index) -> the utilization (percent) the load puts on it now."""
    at = time.time() if at is None else at
    profiles = dict(Endpoint.objects.filter(state=EndpointState.ACTIVE, synthetic_load__isnull=False)
                    .values_list("pk", "synthetic_load"))
    if not profiles:
        return {}
    serving = dict(Replica.objects.filter(endpoint_id__in=list(profiles), state=ReplicaState.SERVING)
                   .values_list("reservation_id", "endpoint_id"))
    count: dict = {}
    for endpoint_id in serving.values():
        count[endpoint_id] = count.get(endpoint_id, 0) + 1
    targets = {}
    for reservation_id, hostname, devices in (Instance.objects.filter(reservation_id__in=list(serving))
                                              .values_list("reservation_id", "node__hostname", "devices")):
        endpoint_id = serving[reservation_id]
        share = offered(profiles[endpoint_id], at) / count[endpoint_id]
        for device in devices:
            targets[(hostname, int(device["index"]))] = max(0, min(100, round(share * 100)))
    return targets
