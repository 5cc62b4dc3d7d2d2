"""
Failure drill on a simulated fleet (issue 9): a bare-metal server and a GPU VM are active; the
node under each stops heartbeating; how long until the failure is detected, and how long from
detection until the tenant has attested replacement hardware in the same VPC.

Detection is the real heartbeat watchdog (``operations.heartbeats.watch_heartbeats``, the beat task
``cloud.heartbeats_watch``) ticking every BENCH_WATCHDOG_S (1.0 s), under the default policy
(cloud.health.FailurePolicy: suspect -- no longer sold -- after 2 silent periods, failed after 3): a
node three whole periods silent fails (``provisioning.lifecycle.replacement.node_failed``, the impact from
its last heartbeat) -- the issue's "detected in 3 periods and replaced". Every node's agent
heartbeats every BENCH_HEARTBEAT_S (1.0 s; MERIDIAN_AGENT_INTERVAL_SECONDS; one UPDATE of
AgentState for the living nodes stands in for their heartbeat requests). A node is killed at a
random moment of its heartbeat period, so the time to detect, as the incident stores it (from
the last heartbeat), lies in [3P, 3P + W); the time from the kill is also shown.

The lifecycle is the real one with zero-latency simulated drivers, run by a Celery worker on
RabbitMQ (BENCH_MODE=worker, the default) or in this process as the tests run it
(BENCH_MODE=inline). BENCH_DRILLS (3) drills per kind.

Targets: detection within 3 heartbeat periods + 1 s; replacement handed over within 5 s of detection.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/meridian .venv/bin/python bench/failure_drill.py

It prints readable lines and one final ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

from common import REPO, Inline, drop_database, percentile, setup_django

DB = "meridian_bench_failure_drill"
MODE = os.environ.get("BENCH_MODE", "worker")
BROKER = os.environ.get("BENCH_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
PERIOD_S = float(os.environ.get("BENCH_HEARTBEAT_S", "1.0"))
WATCHDOG_S = float(os.environ.get("BENCH_WATCHDOG_S", "1.0"))
DRILLS = int(os.environ.get("BENCH_DRILLS", "3"))
MISSES = 3
TARGET_DETECT_S = MISSES * PERIOD_S + 1.0
TARGET_REPLACE_S = 5.0
QUEUE = f"meridian-bench-{uuid.uuid4().hex[:8]}"

os.environ["CELERY_BROKER_URL"] = BROKER
os.environ["MERIDIAN_CELERY_QUEUE"] = QUEUE
os.environ["MERIDIAN_SIMULATION"] = json.dumps({"seed": 0})  # zero latency, no injected faults
os.environ["MERIDIAN_AGENT_INTERVAL_SECONDS"] = str(PERIOD_S)


def seed():
    from django.utils import timezone

    from cloud.catalogue import load_gpu_catalogue
    from cloud.fleet import FleetSpec, build_fleet
    from cloud.models import GPUModel, Node, Offering
    from provisioning.drivers.simulated_devices import trust_simulated_fleet
    from provisioning.models import AgentState
    from tenants.choices import QuotaResource, TenantRole
    from tenants.models import Membership, Quota, Tenant, User
    from tenants.scoping import Principal

    load_gpu_catalogue(GPUModel)
    # Four leaves of 32 nodes: 96 bare-metal nodes (one in ten a spare), 32 shared hosts.
    build_fleet(FleetSpec(regions=1, nodes_per_fabric=128, spare_ratio=0.1, shared_ratio=0.25))
    trust_simulated_fleet()
    now = timezone.now()
    AgentState.objects.bulk_create([AgentState(node_id=pk, last_seen_at=now) for pk in
                                    Node.objects.values_list("pk", flat=True)])
    tenant = Tenant.objects.create(name="Drill", slug="drill")
    user = User.objects.create_user("drill@example.com")
    Membership.objects.create(tenant=tenant, user=user, role=TenantRole.OWNER)
    Quota.objects.create(tenant=tenant, resource=QuotaResource.GPUS, limit=100_000)
    h100 = GPUModel.objects.get(slug="h100-80gb-sxm")
    offerings = {
        "bare_metal": Offering.objects.get_or_create(slug="drill-bm-h100x8", defaults={
            "name": "Bare metal 8x H100", "kind": "bare_metal", "gpu_model": h100, "gpus_per_unit": 8,
            "price_per_gpu_hour": "2.20"})[0],
        "vm": Offering.objects.get_or_create(slug="drill-vm-h100x2", defaults={
            "name": "VM 2x H100", "kind": "vm", "gpu_model": h100, "gpus_per_unit": 2,
            "price_per_gpu_hour": "2.49"})[0],
    }
    return Principal(user=user, tenant=tenant, role=TenantRole.OWNER), offerings


class Worker:
    """One Celery worker process (prefork, 2 pool processes) on this run's own queue."""

    def __init__(self):
        log = Path(tempfile.mkdtemp(prefix="meridian-drill-worker-")) / "worker.log"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "worker", "--queues", QUEUE, "--concurrency", "2",
             "--pool", "prefork", "--without-mingle", "--without-gossip", "--without-heartbeat", "--loglevel", "INFO",
             "--hostname", f"{QUEUE}@%h", "--logfile", str(log)],
            cwd=REPO, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not (log.exists() and "ready." in log.read_text()):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the worker did not start: " + (log.read_text()[-800:] if log.exists() else ""))
            time.sleep(0.1)

    def drain(self) -> None:
        pass  # the worker runs what the lifecycle sends

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def activate(principal, offering, runner) -> str:
    """A reservation of ``offering`` placed at once (the fast path) and provisioned to ``active``."""
    from cloud.models import Region
    from provisioning.admission import Ask
    from provisioning.models import Reservation
    from provisioning.services import reservation_create

    region = Region.objects.get(slug="us-east-1")
    made = reservation_create(actor=principal, ask=Ask(name=f"drill-{uuid.uuid4().hex[:6]}", offering=offering,
                                                       units=1, regions=(region,), duration=timedelta(hours=2)))
    deadline = time.monotonic() + 60
    while Reservation.objects.filter(pk=made.pk).values_list("state", flat=True).get() != "active":
        runner.drain()
        if time.monotonic() > deadline:
            raise RuntimeError(f"reservation {made.pk} did not become active")
        time.sleep(0.02)
    return str(made.pk)


def beat(killed: set) -> None:
    """Every living agent's heartbeat of this period (one UPDATE for the fleet)."""
    from django.utils import timezone

    from provisioning.models import AgentState

    AgentState.objects.exclude(node_id__in=killed).update(last_seen_at=timezone.now())


def watchdog() -> dict:
    """One round of the real heartbeat watchdog (what the beat task runs)."""
    from operations.heartbeats import watch_heartbeats

    return watch_heartbeats()


def drill(kind: str, principal, offering, runner, rng) -> dict:
    """Kill the node under a fresh active reservation at a random moment of a period; wait for the hand-over."""
    from provisioning.lifecycle.replacement import NODE_FAILURE
    from provisioning.models import Instance, Reservation
    from security.models import Incident

    pk = activate(principal, offering, runner)
    node = Instance.objects.select_related("node").get(reservation_id=pk, state="active").node
    beat(set())
    next_beat = time.monotonic() + PERIOD_S
    next_watch = time.monotonic() + WATCHDOG_S * rng.random()  # the watchdog keeps its own clock
    kill_at = time.monotonic() + PERIOD_S * (1 + rng.random())  # somewhere in the second period from now
    killed, kill_wall = set(), None
    deadline = time.monotonic() + MISSES * PERIOD_S + 60
    while True:
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(f"{kind}: no hand-over within {deadline - kill_at:.0f} s of the kill")
        if not killed and now >= kill_at:
            killed, kill_wall = {node.pk}, time.time()
        if now >= next_beat:
            beat(killed)
            next_beat += PERIOD_S
        if now >= next_watch:
            watchdog()
            next_watch += WATCHDOG_S
        runner.drain()
        incident = Incident.objects.filter(kind=NODE_FAILURE, reservation_id=pk).first()
        if incident is not None and incident.restored_at is not None:
            break
        time.sleep(min(max(min(next_beat, next_watch) - time.monotonic(), 0.0), 0.01))
    new = Instance.objects.select_related("node").get(reservation_id=pk, state="active")
    platform = Incident.objects.filter(kind=NODE_FAILURE, node_id=node.pk, tenant_id__isnull=True).get()
    record = next(r for r in platform.evidence.get("replacements", []) if r["reservation"] == pk)
    assert Reservation.objects.get(pk=pk).state == "active"
    return {"kind": kind, "failed": node.hostname, "replacement": new.node.hostname, "spare": bool(record["spares"]),
            "same_leaf": bool(record["same_leaf"]), "detect_s": round(incident.time_to_detect_s, 3),
            "detect_from_kill_s": round(incident.detected_at.timestamp() - kill_wall, 3),
            "replace_s": round(incident.time_to_restore_s, 3)}


def summary(runs: list[dict]) -> dict:
    detect, replace = [r["detect_s"] for r in runs], [r["replace_s"] for r in runs]
    return {"drills": len(runs), "detect_s_p50": round(percentile(detect, 50), 3), "detect_s_max": max(detect),
            "replace_s_p50": round(percentile(replace, 50), 3), "replace_s_max": max(replace),
            "spares": sum(r["spare"] for r in runs), "same_leaf": sum(r["same_leaf"] for r in runs)}


def main() -> None:
    setup_django(DB)
    principal, offerings = seed()
    rng = random.Random(7)  # noqa: S311 -- the moment of each kill, reproducible
    print(f"fleet seeded (128 nodes, 9 spares); heartbeat every {PERIOD_S} s, watchdog every {WATCHDOG_S} s, "
          f"lifecycle {MODE}")
    runner = Worker() if MODE == "worker" else Inline()
    runs = []
    try:
        for _ in range(DRILLS):
            for kind in ("bare_metal", "vm"):
                run = drill(kind, principal, offerings[kind], runner, rng)
                runs.append(run)
                print(f"  {kind:10s} {run['failed']} -> {run['replacement']} (spare {run['spare']}, same leaf "
                      f"{run['same_leaf']}): detected {run['detect_s']:.2f} s after the last heartbeat "
                      f"({run['detect_from_kill_s']:.2f} s after the kill), handed over {run['replace_s']:.2f} s later")
    finally:
        runner.stop()
        if MODE == "worker":
            from kombu import Connection

            with Connection(BROKER) as conn:
                conn.default_channel.queue_delete(QUEUE)
        drop_database(DB)
    by_kind = {kind: summary([r for r in runs if r["kind"] == kind]) for kind in ("bare_metal", "vm")}
    detect_ok = all(r["detect_s"] <= TARGET_DETECT_S for r in runs)
    replace_ok = all(r["replace_s"] <= TARGET_REPLACE_S for r in runs)
    for kind, figures in by_kind.items():
        print(f"  {kind}: {figures}")
    result = {"bench": "failure_drill", "mode": MODE, "heartbeat_s": PERIOD_S,
              "watchdog_s": WATCHDOG_S, "misses": MISSES, "runs": runs, **by_kind,
              "target_detect_s": TARGET_DETECT_S, "target_replace_s": TARGET_REPLACE_S,
              "target_ok": detect_ok and replace_ok}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
