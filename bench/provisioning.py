"""
Provisioning throughput through real Celery workers on RabbitMQ, with zero-latency simulated
drivers: BENCH_RESERVATIONS (300) scheduled 1-GPU VMs taken from ``scheduled`` to ``active``
(a start task, then the steps define_domain, start_domain, join_network, verify, hand_over,
chained in one task for up to MERIDIAN_STEP_CHAIN_SECONDS), with 1 and with 2 worker processes
(prefork, BENCH_CONCURRENCY pool processes each, 1 by default; BENCH_WORKERS="1,2"). The starts
are sent as a scheduler cycle sends the reservations it placed: BENCH_STARTS_PER_MESSAGE (the
lifecycle's STARTS_PER_TASK, 8) a message, whose operations then go through their steps as one
batch; BENCH_STARTS_PER_MESSAGE=1 sends one a message, as a create placed at once does (the
first message to run then takes on others placed moments ago, up to STARTS_PER_TASK, and the
later ones find theirs started).
Reservations per second from the first start sent to the last one active, and each one's time
from its start to ``active`` (p50, p99). The chain includes attestation (``verify``: a nonce, the
simulated GPUs' signed evidence, its verification and receipt), which the issue's target left
out: about half of the statements per reservation. BENCH_ATTESTATION=off measures the chain
as the target was set, without ``verify`` (the workers start through
bench/worker_without_attestation.py; a deployment always attests).

Then, in-process and without a broker, the control plane's own cost per reservation: tasks
(hops), database queries and milliseconds, start to active and release to released.

Target (issue 4): at least 50 reservations per second with 2 workers.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/meridian .venv/bin/python bench/provisioning.py

It prints readable lines and one final ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from datetime import timedelta
from pathlib import Path

from common import REPO, drop_database, percentile, setup_django

DB = "meridian_bench_provisioning"
BROKER = os.environ.get("BENCH_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
RESERVATIONS = int(os.environ.get("BENCH_RESERVATIONS", "300"))
WORKERS = [int(n) for n in os.environ.get("BENCH_WORKERS", "1,2").split(",")]
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "1"))  # pool processes per worker
ATTESTATION = os.environ.get("BENCH_ATTESTATION", "on") != "off"
IN_PROCESS = int(os.environ.get("BENCH_IN_PROCESS", "48"))
STARTS_PER_MESSAGE = int(os.environ.get("BENCH_STARTS_PER_MESSAGE", "0"))  # 0: the lifecycle's STARTS_PER_TASK
TARGET_PER_S = 50.0
QUEUE = f"meridian-bench-{uuid.uuid4().hex[:8]}"

# The bench process sends to the workers' queue on RabbitMQ: set before Django reads its settings.
os.environ["CELERY_BROKER_URL"] = BROKER
os.environ["MERIDIAN_CELERY_QUEUE"] = QUEUE


def seed():
    from cloud.catalogue import load_gpu_catalogue
    from cloud.fleet import FleetSpec, build_fleet
    from cloud.models import GPUModel, Offering
    from provisioning.drivers.simulated_devices import trust_simulated_fleet
    from tenants.choices import QuotaResource, TenantRole
    from tenants.models import Membership, Quota, Tenant, User
    from tenants.scoping import Principal

    load_gpu_catalogue(GPUModel)
    build_fleet(FleetSpec(regions=1, nodes_per_fabric=256, shared_ratio=0.25))
    trust_simulated_fleet()
    tenant = Tenant.objects.create(name="Bench", slug="bench")
    user = User.objects.create_user("bench@example.com")
    Membership.objects.create(tenant=tenant, user=user, role=TenantRole.OWNER)
    Quota.objects.create(tenant=tenant, resource=QuotaResource.GPUS, limit=100_000)
    h100 = GPUModel.objects.get(slug="h100-80gb-sxm")
    offering, _ = Offering.objects.get_or_create(slug="bench-vm-h100x1", defaults={
        "name": "VM 1x H100", "kind": "vm", "gpu_model": h100, "gpus_per_unit": 1, "price_per_gpu_hour": "2.49"})
    return Principal(user=user, tenant=tenant, role=TenantRole.OWNER), offering


def reset():
    """Give everything back: no reservations, every node and GPU as the fleet builder left it."""
    from cloud.models import GPU
    from provisioning.models import VPC, Reservation, SimulatedDevice

    Reservation.objects.all().delete()
    VPC.objects.all().delete()  # and the fabric's partitions with the simulated hardware below
    # The hardware forgets what tenants did; the GPUs' device identities (and their CA) stay.
    SimulatedDevice.objects.exclude(key__startswith="pki:").exclude(key__startswith="gpu-identity:").delete()
    GPU.objects.update(state="available")


def schedule(principal, offering, n: int) -> list[str]:
    """``n`` 1-GPU VMs placed at once (the fast path); nothing is sent to the workers yet."""
    from cloud.models import Region
    from provisioning.admission import Ask
    from provisioning.lifecycle import dispatch as dispatching
    from provisioning.services import reservation_create

    region = Region.objects.get(slug="us-east-1")
    held, dispatching.provision_when_due = dispatching.provision_when_due, lambda reservations: None
    try:
        made = [reservation_create(actor=principal, ask=Ask(name=f"b{i}", offering=offering, units=1,
                                                            regions=(region,), duration=timedelta(hours=2)))
                for i in range(n)]
    finally:
        dispatching.provision_when_due = held
    assert all(r.state == "scheduled" for r in made), {r.state for r in made}
    return [str(r.pk) for r in made]


def start_workers(count: int, env: dict) -> list[subprocess.Popen]:
    """Workers logging to files (a pipe nobody reads would fill and stop them), once they say they are ready."""
    workers, logs = [], []
    for i in range(count):
        log = Path(tempfile.mkdtemp(prefix="meridian-bench-worker-")) / "worker.log"
        logs.append(log)
        celery = [sys.executable, "-m", "celery"] if ATTESTATION else [
            sys.executable, str(REPO / "bench" / "worker_without_attestation.py")]
        workers.append(subprocess.Popen(
            [*celery, "-A", "config", "worker", "--queues", QUEUE,
             "--concurrency", str(CONCURRENCY), "--pool", "prefork", "--without-mingle", "--without-gossip",
             "--without-heartbeat",
             "--loglevel", "INFO", "--hostname", f"{QUEUE}-{i}@%h", "--logfile", str(log)],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 60
    while not all(log.exists() and "ready." in log.read_text() for log in logs):
        if time.monotonic() > deadline or any(worker.poll() is not None for worker in workers):
            raise RuntimeError("a worker did not start: " + " | ".join(log.read_text()[-500:] for log in logs
                                                                        if log.exists()))
        time.sleep(0.1)
    return workers


def starts_per_message() -> int:

    from provisioning.lifecycle import dispatch as dispatching
    return STARTS_PER_MESSAGE or dispatching.STARTS_PER_TASK


def send_starts(ids: list[str]) -> None:
    """The scheduler's own publishing of what it placed (provisioning.lifecycle), at the size chosen."""
    from provisioning.lifecycle import dispatch as dispatching

    held = dispatching.STARTS_PER_TASK
    dispatching.STARTS_PER_TASK = starts_per_message()
    try:
        dispatching._publish_starts(ids)
    finally:
        dispatching.STARTS_PER_TASK = held


def through_workers(principal, offering, workers: int) -> dict:
    from django.db.models import F

    from provisioning.models import Operation, Reservation

    reset()
    ids = schedule(principal, offering, RESERVATIONS)
    env = {**os.environ, "MERIDIAN_SIMULATION": json.dumps({"seed": 0})}
    started = start_workers(workers, env)
    try:
        sent = time.time()
        began = time.perf_counter()
        send_starts(ids)
        deadline = time.monotonic() + 600
        while (active := Reservation.objects.filter(state="active").count()) < len(ids):
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {active} of {len(ids)} active after 600 s")
            time.sleep(0.05)
        elapsed = time.perf_counter() - began
    finally:
        for worker in started:
            worker.terminate()
        for worker in started:
            worker.wait(timeout=30)
    done = Operation.objects.filter(kind="provision", state="succeeded").annotate(
        took=F("finished_at") - F("created_at")).values_list("finished_at", flat=True)
    to_active = [(finished.timestamp() - sent) * 1000 for finished in done]
    return {"workers": workers, "pool_per_worker": CONCURRENCY, "reservations": len(ids),
            "starts_per_message": starts_per_message(), "seconds": round(elapsed, 2),
            "per_s": round(len(ids) / elapsed, 1), "to_active_ms_p50": round(percentile(to_active, 50), 1),
            "to_active_ms_p99": round(percentile(to_active, 99), 1)}


def in_process(principal, offering) -> dict:
    """Start to active and release to released without a broker: tasks, queries and time per reservation."""
    from contextlib import contextmanager

    from django.db import connection

    from provisioning import task_names
    from provisioning.lifecycle import dispatch as dispatching
    from provisioning.lifecycle import runner
    from provisioning.lifecycle import start as starting
    from provisioning.models import Reservation
    from provisioning.services import reservation_release

    reset()
    ids = schedule(principal, offering, IN_PROCESS)
    tasks: deque = deque()
    # The messages the lifecycle sends (after its commits, with their dispatch tokens) are kept here.
    publish = task_names.send
    task_names.send = lambda name, args, **options: (tasks.append(args) if name == task_names.OPERATION_STEP
                                                     else publish(name, args, **options))
    dispatching.provision_when_due = lambda reservations: None

    def drain() -> int:
        hops = 0
        while tasks:
            hops += 1
            runner.operation_run_step(*tasks.popleft())
        return hops

    @contextmanager
    def counted():
        """Every statement sent (Django's query log keeps the last 9,000 only: a count from it falls short)."""
        sent = []

        def count(execute, sql, params, many, context):
            sent.append(1)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(count):
            yield sent

    figures = {"starts_per_message": starts_per_message()}
    with counted() as queries:
        began = time.perf_counter()
        hops = 0
        per_message = starts_per_message()
        for first in range(0, len(ids), per_message):
            hops += 1
            starting.reservations_start(ids[first:first + per_message])
            hops += drain()
        elapsed = time.perf_counter() - began
    assert Reservation.objects.filter(pk__in=ids, state="active").count() == len(ids)
    figures["provision"] = {"tasks": round(hops / len(ids), 1), "queries": round(len(queries) / len(ids), 1),
                            "ms": round(elapsed * 1000 / len(ids), 2)}
    with counted() as queries:
        began = time.perf_counter()
        hops = 0
        for reservation in Reservation.objects.filter(pk__in=ids).select_related("offering"):
            reservation_release(actor=principal, reservation=reservation)
            hops += 1 + drain()
        elapsed = time.perf_counter() - began
    assert Reservation.objects.filter(pk__in=ids, state="released").count() == len(ids)
    figures["release"] = {"tasks": round(hops / len(ids), 1), "queries": round(len(queries) / len(ids), 1),
                          "ms": round(elapsed * 1000 / len(ids), 2)}
    return figures


def main() -> None:
    setup_django(DB)
    from kombu import Connection

    if not ATTESTATION:
        from worker_without_attestation import leave_out_attestation

        leave_out_attestation()
    principal, offering = seed()
    print(f"fleet seeded; {RESERVATIONS} 1-GPU VMs per run, queue {QUEUE} on RabbitMQ; attestation "
          f"{'in the chain' if ATTESTATION else 'left out (BENCH_ATTESTATION=off)'}")
    runs = []
    try:
        for workers in WORKERS:
            run = through_workers(principal, offering, workers)
            runs.append(run)
            print(f"  {workers} worker(s): {run}")
        overhead = in_process(principal, offering)
        print(f"  control plane per reservation (in-process, no broker): {overhead}")
    finally:
        with Connection(BROKER) as conn:
            conn.default_channel.queue_delete(QUEUE)
        drop_database(DB)
    best = max((r["per_s"] for r in runs if r["workers"] == 2), default=0.0)
    result = {"bench": "provisioning", "commit": commit(), "cpus": os.cpu_count(), "attestation_in_chain": ATTESTATION,
              "runs": runs,
              "per_reservation": overhead, "target_per_s_with_2_workers": TARGET_PER_S,
              "per_s_with_2_workers": best, "target_ok": best >= TARGET_PER_S}
    print("RESULT " + json.dumps(result))


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return out.stdout.strip()


if __name__ == "__main__":
    main()
