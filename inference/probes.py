"""
Whether a replica can serve: its health check, asked of the replica itself.

``MERIDIAN_ENDPOINT_PROBE`` picks how: ``http`` sends ``GET http://<private address>:<port><path>``
(2 s, a 2xx answer is healthy), as the load balancer's own check does; ``simulated`` (the demo and the
embedded default, whose replicas run no process) takes an active instance on a sellable node as healthy.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from django.conf import settings

from cloud.choices import NodeState
from provisioning.choices import InstanceState

SELLABLE = (NodeState.AVAILABLE, NodeState.ALLOCATED, NodeState.IN_SERVICE)
PROBE_TIMEOUT_S = 2.0


def reachable(instance) -> bool:
    """Active, on a node that is not failed, suspect or held: what the balancer may point at."""
    return instance.state == InstanceState.ACTIVE and instance.node.state in SELLABLE and bool(instance.private_ip)


def healthy(instance, *, port: int, path: str) -> bool:
    if not reachable(instance):
        return False
    if settings.MERIDIAN_ENDPOINT_PROBE != "http":
        return True
    url = f"http://{instance.private_ip}:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as answer:  # noqa: S310 -- http only, by design
            return 200 <= answer.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False
