"""
Failure drill on a simulated fleet: a reservation is active; the node under it dies; how long
until the failure is detected, and until the tenant has attested replacement hardware in the same
VPC.

Two scenarios (BENCH_SCENARIO):

``defaults`` (the default): recovery at DEFAULT settings -- agents ping every
MERIDIAN_LIVENESS_SECONDS (2 s), heartbeat every MERIDIAN_AGENT_INTERVAL_SECONDS (10 s), the
watchdog runs every MERIDIAN_WATCHDOG_SECONDS (1 s) under the default failure policy (suspect after
2 silent periods, failed after 3) -- with the simulated drivers set to realistic latencies
(REALISTIC_S below: VM boot 8 s, container start 2 s, attestation 1 s, ...), for a VM and a
container (BENCH_KINDS). Target: fault -> replacement handed over to the tenant within 23 s (the
seed's recovery target). Each drill also prints where the time went: detection, the hand-off to
the lifecycle, each step of the replacement.

``fast``: issue 9's drill -- heartbeats every BENCH_HEARTBEAT_S (1 s) judged by the watchdog
every BENCH_WATCHDOG_S (1 s), zero-latency drivers, a bare-metal server and a VM. Targets:
detection within 3 heartbeat periods + 1 s; replacement handed over within 5 s of detection.

Every living agent's pings (and heartbeats) are one UPDATE of AgentState for the fleet per period,
standing in for their requests (a ping is one statement: operations.node_api.liveness); the
watchdog is the real one (``operations.heartbeats.watch_heartbeats``, what the beat task runs),
called in this process on its schedule. A node is killed at a random moment of its ping period,
so the time to detect from the last ping lies in [3P, 3P + W) and from the kill in (2P, 3P + W).
The lifecycle is the real one, run by a Celery worker on RabbitMQ (BENCH_MODE=worker, the
default; 2 pool processes) or, in the fast scenario only, in this process as the tests run it
(BENCH_MODE=inline: a step's latency would stall this process's pings and watchdog too).
BENCH_DRILLS (3) drills per kind.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/meridian .venv/bin/python bench/failure_drill.py
    BENCH_SCENARIO=fast .venv/bin/python bench/failure_drill.py

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
SCENARIO = os.environ.get("BENCH_SCENARIO", "defaults")
MODE = os.environ.get("BENCH_MODE", "worker")
BROKER = os.environ.get("BENCH_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
DRILLS = int(os.environ.get("BENCH_DRILLS", "3"))
MISSES = 3
QUEUE = f"meridian-bench-{uuid.uuid4().hex[:8]}"
# Realistic latencies of the simulated drivers (seconds per call; MERIDIAN_SIMULATION's latency_s).
REALISTIC_S = {
    # VMs: the disk (a copy-on-write overlay of the cached image) and its config drive, the domain
    # defined with its GPUs and InfiniBand virtual function passed through, then started: the
    # guest boots until it answers (the "VM boot").
    "create_volume": 1.0, "define": 0.2, "start": 8.0,
    # Containers: the pod started on the host (its image cached there).
    "apply": 2.0,
    # Both: the ports joined to the tenant's partition through the fabric manager, and the GPUs
    # signing evidence for the nonce (it is then verified here).
    "ensure_partition": 0.5, "set_members": 0.5, "attest": 1.0,
    # Bare metal only (BENCH_KINDS=bare_metal; not on the VM or container path, and not in the
    # 23 s target): a BMC power cycle, the deploy media, the image written to the disks.
    "set_power": 8.0, "insert_media": 1.0, "write_image": 120.0,
}
if SCENARIO == "fast":
    HEARTBEAT_S = float(os.environ.get("BENCH_HEARTBEAT_S", "1.0"))
    os.environ["MERIDIAN_AGENT_INTERVAL_SECONDS"] = str(HEARTBEAT_S)
    os.environ["MERIDIAN_WATCHDOG_SECONDS"] = os.environ.get("BENCH_WATCHDOG_S", "1.0")
    os.environ["MERIDIAN_SIMULATION"] = json.dumps({"seed": 0})  # zero latency, no injected faults
    KINDS = os.environ.get("BENCH_KINDS", "bare_metal,vm").split(",")
elif SCENARIO == "defaults":
    if MODE != "worker":
        raise SystemExit("the defaults scenario runs its lifecycle in a worker (BENCH_MODE=worker)")
    for name in ("MERIDIAN_AGENT_INTERVAL_SECONDS", "MERIDIAN_LIVENESS_SECONDS", "MERIDIAN_WATCHDOG_SECONDS",
                 "MERIDIAN_FAILURE_POLICY", "MERIDIAN_STEP_CHAIN_SECONDS"):
        os.environ.pop(name, None)  # the defaults, whatever this shell says
    os.environ["MERIDIAN_SIMULATION"] = json.dumps({"seed": 0, "latency_s": REALISTIC_S})
    KINDS = os.environ.get("BENCH_KINDS", "vm,container").split(",")
else:
    raise SystemExit(f"BENCH_SCENARIO is defaults or fast, not {SCENARIO!r}")
TARGET_RECOVERY_S = 23.0  # the seed's: fault -> replacement handed over
TARGET_REPLACE_S = 5.0  # the fast scenario's: detection -> handed over, zero-latency drivers

os.environ["CELERY_BROKER_URL"] = BROKER
os.environ["MERIDIAN_CELERY_QUEUE"] = QUEUE


def seed(pinging: bool):
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
    AgentState.objects.bulk_create([
        AgentState(node_id=pk, last_seen_at=now, alive_at=now if pinging else None,
                   ping_run=f"run-{i}" if pinging else "", ping_seq=1 if pinging else 0)
        for i, pk in enumerate(Node.objects.values_list("pk", flat=True))])
    tenant = Tenant.objects.create(name="Drill", slug="drill")
    user = User.objects.create_user("drill@example.com")
    Membership.objects.create(tenant=tenant, user=user, role=TenantRole.OWNER)
    Quota.objects.create(tenant=tenant, resource=QuotaResource.GPUS, limit=100_000)
    h100 = GPUModel.objects.get(slug="h100-80gb-sxm")
    specs = {
        "bare_metal": ("drill-bm-h100x8", "Bare metal 8x H100", 8, "2.20"),
        "vm": ("drill-vm-h100x2", "VM 2x H100", 2, "2.49"),
        "container": ("drill-ct-h100x1", "Container 1x H100", 1, "2.39"),
    }
    offerings = {kind: Offering.objects.get_or_create(slug=slug, defaults={
        "name": name, "kind": kind, "gpu_model": h100, "gpus_per_unit": gpus, "price_per_gpu_hour": price})[0]
        for kind, (slug, name, gpus, price) in specs.items()}
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


class Fleet:
    """
    The fleet's agents and the watchdog, each on its own schedule: ``tick`` does what is due --
    every living agent's ping (``ping_s``; none in the fast scenario), its heartbeat
    (``heartbeat_s``), a watchdog round (``watchdog_s``) -- and remembers when each ping went.
    """

    def __init__(self, *, ping_s: float | None, heartbeat_s: float, watchdog_s: float, rng):
        now = time.monotonic()
        self.ping_s, self.heartbeat_s, self.watchdog_s = ping_s, heartbeat_s, watchdog_s
        self.next_ping = now if ping_s else float("inf")
        self.next_heartbeat = now
        self.next_watch = now + watchdog_s * rng.random()  # the watchdog keeps its own clock
        self.killed: set = set()
        self.last_signal_wall = time.time()  # when the living agents were last heard
        self.rounds, self.stalled = 0, 0

    @property
    def period_s(self) -> float:
        return self.ping_s or self.heartbeat_s

    def tick(self) -> None:
        from django.db.models import F
        from django.utils import timezone

        from operations.heartbeats import watch_heartbeats
        from provisioning.models import AgentState

        now = time.monotonic()
        living = AgentState.objects.exclude(node_id__in=self.killed)
        if now >= self.next_ping:
            living.update(alive_at=timezone.now(), ping_seq=F("ping_seq") + 1)
            self.last_signal_wall = time.time()
            self.next_ping += self.ping_s
        if now >= self.next_heartbeat:
            living.update(last_seen_at=timezone.now())
            if not self.ping_s:
                self.last_signal_wall = time.time()
            self.next_heartbeat += self.heartbeat_s
        if now >= self.next_watch:
            report = watch_heartbeats()
            self.rounds += 1
            self.stalled += bool(report.get("stalled"))
            self.next_watch += self.watchdog_s

    def due_in(self) -> float:
        return max(min(self.next_ping, self.next_heartbeat, self.next_watch) - time.monotonic(), 0.0)


def activate(principal, offering, runner, fleet: Fleet) -> str:
    """A reservation of ``offering`` placed at once (the fast path) and provisioned to ``active``."""
    from cloud.models import Region
    from provisioning.admission import Ask
    from provisioning.models import Reservation
    from provisioning.services import reservation_create

    region = Region.objects.get(slug="us-east-1")
    made = reservation_create(actor=principal, ask=Ask(name=f"drill-{uuid.uuid4().hex[:6]}", offering=offering,
                                                       units=1, regions=(region,), duration=timedelta(hours=2)))
    deadline = time.monotonic() + 300
    while Reservation.objects.filter(pk=made.pk).values_list("state", flat=True).get() != "active":
        runner.drain()
        fleet.tick()
        if time.monotonic() > deadline:
            raise RuntimeError(f"reservation {made.pk} did not become active")
        time.sleep(min(fleet.due_in(), 0.02))
    return str(made.pk)


def drill(kind: str, principal, offering, runner, fleet: Fleet, rng) -> dict:
    """Kill the node under a fresh active reservation at a random moment of a period; wait for the hand-over."""
    from provisioning.lifecycle.replacement import NODE_FAILURE
    from provisioning.models import Instance, Operation, Reservation
    from security.models import Incident

    pk = activate(principal, offering, runner, fleet)
    node = Instance.objects.select_related("node").get(reservation_id=pk, state="active").node
    kill_at = time.monotonic() + fleet.period_s * (1 + rng.random())  # somewhere in the second period from now
    kill_wall, last_signal = None, None
    steps: list[tuple[str, float]] = []  # the replacement's steps as they were seen to begin (wall time)
    deadline = time.monotonic() + 300
    while True:
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(f"{kind}: no hand-over within 300 s")
        if kill_wall is None and now >= kill_at:
            fleet.killed.add(node.pk)
            kill_wall, last_signal = time.time(), fleet.last_signal_wall
        fleet.tick()
        runner.drain()
        incident = Incident.objects.filter(kind=NODE_FAILURE, reservation_id=pk).first()
        if incident is not None:
            step = (Operation.objects.filter(reservation_id=pk, kind="provision", created_at__gte=incident.detected_at)
                    .order_by("-created_at").values_list("step", flat=True).first())
            if step and (not steps or steps[-1][0] != step):
                steps.append((step, time.time()))
            if incident.restored_at is not None:
                break
        time.sleep(min(fleet.due_in(), 0.01))
    new = Instance.objects.select_related("node").get(reservation_id=pk, state="active")
    platform = Incident.objects.filter(kind=NODE_FAILURE, node_id=node.pk, tenant_id__isnull=True).get()
    record = next(r for r in platform.evidence.get("replacements", []) if r["reservation"] == pk)
    assert Reservation.objects.get(pk=pk).state == "active"
    release(principal, pk, runner, fleet)
    detected, restored = incident.detected_at.timestamp(), incident.restored_at.timestamp()
    marks = [("detected", detected), *steps, ("handed_over", restored)]
    where = {"detect": round(detected - kill_wall, 3)}
    for (name, began), (_, ended) in zip(marks, marks[1:], strict=False):
        where["dispatch" if name == "detected" else name] = round(max(ended - began, 0.0), 3)
    return {"kind": kind, "failed": node.hostname, "replacement": new.node.hostname, "spare": bool(record["spares"]),
            "same_leaf": bool(record["same_leaf"]), "detect_s": round(incident.time_to_detect_s, 3),
            "detect_from_kill_s": round(detected - kill_wall, 3), "last_signal_before_kill_s":
            round(kill_wall - last_signal, 3), "replace_s": round(incident.time_to_restore_s, 3),
            "recovery_s": round(restored - kill_wall, 3), "where": where}


def ping_cost(rounds: int = 10) -> dict:
    """
    What the liveness signal costs the control plane: every node's signed pings through the
    project's WSGI application in this process (``config.wsgi``: the node API's own handler, in
    autocommit as served), ``rounds`` per node after the one that begins each run (not measured).
    CPU of this process and its PostgreSQL backend per ping (bench/telemetry_ingest.py's CPU), and
    for 1,280 nodes pinging every MERIDIAN_LIVENESS_SECONDS; the requests are signed before the
    clock starts (that is the agents' work).
    """
    import io

    from django.conf import settings
    from django.db import connection
    from telemetry_ingest import CPU

    from cloud.models import Node
    from config.wsgi import application
    from operations.node_api.agents import credential_issue
    from provisioning.agent.signing import signed_headers

    path = "/api/agent/v1/alive/"
    keys = [(node, *credential_issue(actor=None, node=node)) for node in Node.objects.order_by("hostname")]

    def signed(node, credential, secret, seq: int) -> tuple[bytes, dict]:
        body = {"run": f"cost-{node.hostname[-5:]}", "seq": seq, "sent_at": time.time(), "rtt_ms": 3, "failed": 0}
        if seq == 1:
            body["start"] = True
        raw = json.dumps(body).encode()
        return raw, signed_headers(credential.key_id, secret, "POST", path, raw)

    def send(raw: bytes, headers: dict) -> None:
        environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "",
                   "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000", "SERVER_PROTOCOL": "HTTP/1.1",
                   "REMOTE_ADDR": "127.0.0.1", "HTTP_HOST": "127.0.0.1", "CONTENT_TYPE": "application/json",
                   "CONTENT_LENGTH": str(len(raw)), "wsgi.input": io.BytesIO(raw), "wsgi.errors": sys.stderr,
                   "wsgi.url_scheme": "http", "wsgi.version": (1, 0), "wsgi.multithread": True,
                   "wsgi.multiprocess": True, "wsgi.run_once": False,
                   **{"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()}}
        status = []
        response = application(environ, lambda line, _headers: status.append(line))
        try:
            content = b"".join(response)
        finally:
            response.close()
        assert status[0].startswith("200"), content[:300]

    for node, credential, secret in keys:
        send(*signed(node, credential, secret, 1))
    node, credential, secret = keys[0]
    queries = []  # the statements one ping runs (a request clears Django's own query log as it starts)

    def counted(execute, sql, params, many, context):
        queries.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counted):
        send(*signed(node, credential, secret, 2))
    requests = [signed(node, credential, secret, seq) for seq in range(3, 3 + rounds)
                for node, credential, secret in keys]
    cpu = CPU()
    before = cpu.now()
    for raw, headers in requests:
        send(raw, headers)
    measured = CPU.since(before, cpu.now())
    per_ping_s = measured["cpu_s"] / len(requests)
    return {"pings": len(requests), "statements_per_ping": len(queries),
            "cpu_ms_per_ping": round(per_ping_s * 1000, 3),
            "db_cpu_ms_per_ping": round(measured["db_cpu_s"] / len(requests) * 1000, 3),
            "core_fraction_1280_nodes": round(per_ping_s * 1280 / settings.MERIDIAN_LIVENESS_SECONDS, 3),
            "others_cpu_s": measured["others_cpu_s"]}


def release(principal, pk: str, runner, fleet: Fleet) -> None:
    """
    The drill's reservation released, and its release waited for: the next drill's host then
    carries only the next drill's work (placement packs: it would otherwise be the host the
    earlier replacements landed on, and every earlier reservation would be moved again with it).
    """
    from provisioning.models import Reservation
    from provisioning.services import reservation_release

    reservation_release(actor=principal, reservation=Reservation.objects.get(pk=pk))
    deadline = time.monotonic() + 120
    while Reservation.objects.filter(pk=pk).values_list("state", flat=True).get() != "released":
        runner.drain()
        fleet.tick()
        if time.monotonic() > deadline:
            raise RuntimeError(f"reservation {pk} was not released")
        time.sleep(min(fleet.due_in(), 0.02))


def summary(runs: list[dict]) -> dict:
    detect, kill = [r["detect_s"] for r in runs], [r["detect_from_kill_s"] for r in runs]
    replace, recovery = [r["replace_s"] for r in runs], [r["recovery_s"] for r in runs]
    return {"drills": len(runs), "detect_s_p50": round(percentile(detect, 50), 3), "detect_s_max": max(detect),
            "detect_from_kill_s_max": max(kill), "replace_s_p50": round(percentile(replace, 50), 3),
            "replace_s_max": max(replace), "recovery_s_p50": round(percentile(recovery, 50), 3),
            "recovery_s_max": max(recovery), "spares": sum(r["spare"] for r in runs),
            "same_leaf": sum(r["same_leaf"] for r in runs)}


def main() -> None:
    setup_django(DB)
    from django.conf import settings

    from operations.detection import failure_policy

    defaults = SCENARIO == "defaults"
    principal, offerings = seed(pinging=defaults)
    rng = random.Random(7)  # noqa: S311 -- the moment of each kill, reproducible
    policy = failure_policy()
    ping_s = settings.MERIDIAN_LIVENESS_SECONDS if defaults else None
    heartbeat_s, watchdog_s = settings.MERIDIAN_AGENT_INTERVAL, settings.MERIDIAN_WATCHDOG_SECONDS
    period_s = ping_s or heartbeat_s
    print(f"scenario {SCENARIO}: fleet seeded (128 nodes, 9 spares); pings every {ping_s or '-'} s, heartbeats every "
          f"{heartbeat_s:g} s, watchdog every {watchdog_s:g} s (suspect after {policy.suspect_after_misses}, "
          f"failed after {policy.faulty_after_misses} silent periods); lifecycle {MODE}")
    if defaults:
        print("  simulated driver latencies (s): " + ", ".join(f"{k} {v:g}" for k, v in REALISTIC_S.items()))
    cost = ping_cost() if defaults else None
    if cost:
        print(f"  a liveness ping: {cost['statements_per_ping']} statements (the key check and one UPDATE), "
              f"{cost['cpu_ms_per_ping']:.3f} ms of CPU ({cost['db_cpu_ms_per_ping']:.3f} ms of it PostgreSQL's) over "
              f"{cost['pings']} signed pings through the node API in process: 1,280 nodes pinging every "
              f"{ping_s:g} s cost {cost['core_fraction_1280_nodes']:.0%} of a core")
    runner = Worker() if MODE == "worker" else Inline()
    fleet = Fleet(ping_s=ping_s, heartbeat_s=heartbeat_s, watchdog_s=watchdog_s, rng=rng)
    runs = []
    try:
        for _ in range(DRILLS):
            for kind in KINDS:
                run = drill(kind, principal, offerings[kind], runner, fleet, rng)
                runs.append(run)
                print(f"  {kind:10s} {run['failed']} -> {run['replacement']} (spare {run['spare']}, same leaf "
                      f"{run['same_leaf']}): detected {run['detect_s']:.2f} s after the last "
                      f"{'ping' if defaults else 'heartbeat'} ({run['detect_from_kill_s']:.2f} s after the kill), "
                      f"handed over {run['replace_s']:.2f} s later: {run['recovery_s']:.2f} s from the fault")
                print("             where: " + ", ".join(f"{k} {v:.2f}" for k, v in run["where"].items()))
    finally:
        runner.stop()
        if MODE == "worker":
            from kombu import Connection

            with Connection(BROKER) as conn:
                conn.default_channel.queue_delete(QUEUE)
        drop_database(DB)
    by_kind = {kind: summary([r for r in runs if r["kind"] == kind]) for kind in KINDS}
    target_detect_s = MISSES * period_s + watchdog_s
    detect_ok = all(r["detect_s"] <= target_detect_s for r in runs)
    if defaults:
        target = {"target_detect_s": target_detect_s, "target_recovery_s": TARGET_RECOVERY_S}
        done = detect_ok and all(r["recovery_s"] <= TARGET_RECOVERY_S for r in runs if r["kind"] != "bare_metal")
    else:
        target = {"target_detect_s": target_detect_s, "target_replace_s": TARGET_REPLACE_S}
        done = detect_ok and all(r["replace_s"] <= TARGET_REPLACE_S for r in runs)
    for kind, figures in by_kind.items():
        print(f"  {kind}: {figures}")
    print(f"  watchdog rounds {fleet.rounds}, of which held as the control plane's stall: {fleet.stalled}")
    result = {"bench": "failure_drill", "scenario": SCENARIO, "mode": MODE, "liveness_s": ping_s,
              "heartbeat_s": heartbeat_s, "watchdog_s": watchdog_s, "misses": MISSES,
              "latencies_s": REALISTIC_S if defaults else {}, "runs": runs, **by_kind, **target,
              "watchdog_rounds": fleet.rounds, "watchdog_rounds_stalled": fleet.stalled, "ping_cost": cost,
              "target_ok": done}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
