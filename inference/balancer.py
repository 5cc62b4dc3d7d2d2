"""
The load balancer: HAProxy, configured from the serving replicas of every endpoint.

Each endpoint is one stable host name (``MERIDIAN_ENDPOINT_URL``) routed by the ``Host`` header to a
backend of its serving replicas, each checked by HAProxy on the endpoint's health path. The file is
rendered from the database, validated with ``haproxy -c`` when HAProxy is installed, written
atomically to ``MERIDIAN_BALANCER_CONFIG`` and applied with ``MERIDIAN_BALANCER_RELOAD`` (e.g.
``systemctl reload haproxy``) when set. A replica leaves the file before its reservation is released:
``replicas.release_drained`` waits for a configuration checked in force after the drain began.

Any change to reservations (a node found failed, a replica replaced) asks for a new write at once
(``register``): the balancer stops pointing at a replica as soon as its failure is detected.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from inference.choices import EndpointState, ReplicaState
from inference.models import BalancerState, Endpoint, Replica
from inference.probes import reachable
from provisioning.models import Instance
from provisioning.transitions import on_reservations_changed

HEADER = """# Written by Meridian (inference.balancer): edits are overwritten.
global
    log stdout format raw local0
    maxconn 20000

defaults
    mode http
    log global
    option httplog
    option redispatch
    retries 2
    timeout connect 3s
    timeout client 60s
    timeout server 60s
    default-server inter 2s fall 2 rise 2

frontend endpoints
    bind {bind}
    http-request return status 404 content-type text/plain string "no such endpoint" if !{{ req.hdr(host) -m found }}
"""


class BalancerError(RuntimeError):
    pass


def endpoint_url(endpoint: Endpoint) -> str:
    return settings.MERIDIAN_ENDPOINT_URL.format(endpoint=endpoint.name, tenant=endpoint.tenant.slug)


def backend_name(endpoint: Endpoint) -> str:
    return f"ep_{endpoint.pk.hex}"


def serving_targets() -> dict[Endpoint, list[tuple[str, str]]]:
    """Each active endpoint's serving replicas as (server name, ip:port), read from what is live now."""
    endpoints = {e.pk: e for e in Endpoint.objects.filter(state=EndpointState.ACTIVE).select_related("tenant")}
    targets: dict[Endpoint, list[tuple[str, str]]] = {e: [] for e in endpoints.values()}
    replicas = Replica.objects.filter(endpoint_id__in=list(endpoints), state=ReplicaState.SERVING)
    instances = (Instance.objects.filter(reservation_id__in=replicas.values("reservation_id"))
                 .select_related("node").order_by("reservation_id", "index"))
    by_reservation = {r.reservation_id: r for r in replicas}
    for instance in instances:
        replica = by_reservation[instance.reservation_id]
        if reachable(instance):
            endpoint = endpoints[replica.endpoint_id]
            targets[endpoint].append((f"r{replica.pk.hex[:12]}", f"{instance.private_ip}:{endpoint.port}"))
    return targets


def render(targets: dict[Endpoint, list[tuple[str, str]]]) -> str:
    """The whole configuration, in a stable order (the same fleet renders the same bytes)."""
    ordered = sorted(targets, key=lambda e: (e.tenant.slug, e.name))
    lines = [HEADER.format(bind=settings.MERIDIAN_BALANCER_BIND)]
    for endpoint in ordered:
        host = urlsplit(endpoint_url(endpoint)).hostname
        lines.append(f"    use_backend {backend_name(endpoint)} if {{ req.hdr(host),field(1,:) -i {host} }}")
    lines.append("    default_backend no_endpoint\n")
    lines.append("backend no_endpoint\n    http-request return status 404 content-type text/plain "
                 "string \"no such endpoint\"\n")
    for endpoint in ordered:
        lines.append(f"backend {backend_name(endpoint)}")
        lines.append(f"    # {endpoint.tenant.slug}/{endpoint.name}")
        lines.append("    balance leastconn")
        lines.append(f"    option httpchk GET {endpoint.health_path}")
        lines.append("    http-check expect status 200-299")
        if not targets[endpoint]:
            lines.append("    http-request return status 503 content-type text/plain string \"no replica serving\"")
        for name, address in targets[endpoint]:
            lines.append(f"    server {name} {address} check")
        lines.append("")
    return "\n".join(lines)


def validate(text: str) -> str:
    """HAProxy's own check of ``text``: "" when valid (or HAProxy is not installed here), else its complaint."""
    haproxy = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
    if haproxy is None:
        return ""
    with tempfile.NamedTemporaryFile("w", suffix=".cfg", delete=False) as handle:
        handle.write(text)
    try:
        done = subprocess.run([haproxy, "-c", "-f", handle.name], capture_output=True, text=True,  # noqa: S603
                              timeout=30, check=False)
    finally:
        os.unlink(handle.name)
    if done.returncode == 0:
        return ""
    alerts = [line for line in (done.stderr + done.stdout).splitlines() if "[ALERT]" in line]
    return ("; ".join(alerts) or f"haproxy -c exited {done.returncode}").replace(handle.name, "haproxy.cfg")[-500:]


def sync() -> BalancerState:
    """Render, check, write and apply the configuration when it changed; record what is in force."""
    text = render(serving_targets())
    digest = hashlib.sha256(text.encode()).hexdigest()
    checked = timezone.now()  # before the read: what is drained by now is not in ``text``
    state, _ = BalancerState.objects.get_or_create(pk=1)
    if digest == state.digest and not state.error:
        BalancerState.objects.filter(pk=1).update(checked_at=checked)
        state.checked_at = checked
        return state
    problem = validate(text)
    if not problem:
        problem = _write_and_reload(text)
    with transaction.atomic():
        state = BalancerState.objects.select_for_update().get(pk=1)
        if problem:
            state.error = problem
            state.save(update_fields=["error"])
            return state
        state.generation += 1
        state.digest, state.applied_at, state.checked_at, state.error = digest, timezone.now(), checked, ""
        state.save()
    return state


def _write_and_reload(text: str) -> str:
    path = Path(settings.MERIDIAN_BALANCER_CONFIG)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".haproxy-")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)
    if settings.MERIDIAN_BALANCER_RELOAD:
        done = subprocess.run(shlex.split(settings.MERIDIAN_BALANCER_RELOAD), capture_output=True,  # noqa: S603
                              text=True, timeout=60, check=False)
        if done.returncode:
            return f"reload failed ({done.returncode}): {done.stderr.strip()[:300]}"
    return ""


def register(*, on_change) -> None:
    """Ask ``on_change`` (after commit) whenever a replica's reservation changes state."""
    on_reservations_changed(lambda reservations: transaction.on_commit(on_change)
                            if any_replica(reservations) else None)


def any_replica(reservations) -> bool:
    """
    Whether any of ``reservations`` is an endpoint's replica: read off ``managed_by`` where it is
    loaded, one query for those loaded without it (the scheduler's rows carry few columns).
    """
    unread = []
    for r in reservations:
        if "managed_by" in r.get_deferred_fields():
            unread.append(r.pk)
        elif r.managed_by.startswith("endpoint:"):
            return True
    return bool(unread) and Replica.objects.filter(reservation_id__in=unread).exists()
