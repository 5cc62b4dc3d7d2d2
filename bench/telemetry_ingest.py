"""
GPU telemetry ingestion at fleet scale: 10,240 GPUs (the benchmark fleet, 1,280 nodes x 8) whose
agents heartbeat every 10 s, i.e. 128 heartbeats and 1,024 GPU samples a second. Target: the
control plane spends under 30 % of one core on it (on the 2-core machine).

What runs, on a scratch PostgreSQL database:

  - service: BENCH_SIM_SECONDS (60) of simulated time, every node's heartbeat each period through
    ``provisioning.node_agents.heartbeat`` -- the inventory check, ``cloud.telemetry.ingest``
    (8 samples by COPY, the latest per GPU and 8 port states by upsert) and the AgentState row:
    everything the node API does for a heartbeat except the HTTP request and its signature;
  - http: BENCH_HTTP_REQUESTS (512) signed heartbeats through the node API in this process
    (Django's test client: request parsing, HMAC check, nonce insert, the above, the policy
    answer), for the per-request overhead on top;
  - rollup: the minute just ingested (61,440 samples -> 10,240 one-minute buckets), and one hour
    of one-minute buckets (614,400 rows, made in SQL) -> 10,240 one-hour buckets.

CPU is measured, not wall time: this process's ``time.process_time`` plus the CPU of its
PostgreSQL backend (utime + stime from /proc/<backend pid>/stat; PostgreSQL runs on this machine).
PostgreSQL's background processes (WAL writer, checkpointer) are not counted. The fraction of
one core is CPU seconds per simulated second.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/meridian .venv/bin/python bench/telemetry_ingest.py

It prints readable lines and one final ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import os
import random
import time
from datetime import timedelta

from common import drop_database, setup_django

DB = "meridian_bench_telemetry"
PERIOD_S = 10
SIM_SECONDS = int(os.environ.get("BENCH_SIM_SECONDS", "60"))
HTTP_REQUESTS = int(os.environ.get("BENCH_HTTP_REQUESTS", "512"))
TARGET_CORE_FRACTION = 0.30


class CPU:
    """CPU seconds of this process and of its PostgreSQL backend, read before and after a piece of work."""

    def __init__(self):
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            self.backend = cursor.fetchone()[0]
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.readable = self._backend() is not None

    def _backend(self) -> float | None:
        try:
            with open(f"/proc/{self.backend}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / self.ticks  # utime, stime
        except (OSError, IndexError, ValueError):
            return None

    def now(self) -> tuple[float, float, float]:
        return time.perf_counter(), time.process_time(), self._backend() or 0.0

    @staticmethod
    def since(start: tuple[float, float, float], end: tuple[float, float, float]) -> dict:
        wall, process, backend = (b - a for a, b in zip(start, end, strict=True))
        return {"wall_s": round(wall, 3), "process_cpu_s": round(process, 3), "db_cpu_s": round(backend, 3),
                "cpu_s": round(process + backend, 3)}


def payloads(nodes) -> dict:
    """Each node's heartbeat: inventory, 8 samples and 8 port states, as an agent sends them."""
    from cloud.models import GPU, HCAPort

    gpus: dict = {}
    for node_id, index, uuid, memory in GPU.objects.order_by("index").values_list("node_id", "index", "uuid",
                                                                                  "memory_mib"):
        gpus.setdefault(node_id, []).append((index, uuid, memory))
    ports: dict = {}
    for node_id, guid in HCAPort.objects.order_by("index").values_list("node_id", "guid"):
        ports.setdefault(node_id, []).append(guid)
    rng = random.Random(9)  # noqa: S311 -- load, not secrets
    bodies = {}
    for node in nodes:
        mine = gpus[node.pk]
        bodies[node.pk] = {
            "agent_version": "1",
            "gpus": [{"index": i, "uuid": u, "memory_mib": m, "healthy": True} for i, u, m in mine],
            "samples": [{"uuid": u, "utilization_pct": rng.randint(0, 100), "memory_used_mib": rng.randint(0, m),
                         "memory_total_mib": m, "temperature_c": rng.randint(30, 80),
                         "power_w": round(rng.uniform(70, 700), 1), "ecc_corrected": 0, "ecc_uncorrected": 0,
                         "processes": rng.randint(0, 4), "xids": []} for _, u, m in mine],
            "ports": [{"guid": g, "link": "up"} for g in ports.get(node.pk, [])],
        }
    return bodies


def service(nodes, bodies, start) -> tuple[dict, int]:
    """Every node's heartbeat each period of SIM_SECONDS, through the service the node API calls."""
    from provisioning.node_agents import heartbeat

    cpu = CPU()
    before = cpu.now()
    beats = 0
    for step in range(SIM_SECONDS // PERIOD_S):
        now = start + timedelta(seconds=PERIOD_S * step)
        for node in nodes:
            body = bodies[node.pk]
            heartbeat(node=node, agent_version="1", gpus=body["gpus"], samples=body["samples"],
                      ports=body["ports"], now=now)
            beats += 1
    return CPU.since(before, cpu.now()), beats


def http(nodes, bodies) -> dict:
    """Signed heartbeats through the node API in this process: the per-request cost on top of the service."""
    from django.test import Client

    from provisioning.agent.signing import signed_headers
    from provisioning.node_agents import credential_issue

    API = "/api/agent/v1/heartbeat/"
    chosen = nodes[: max(1, min(len(nodes), HTTP_REQUESTS // 2))]
    keys = [(node, *credential_issue(actor=None, node=node)) for node in chosen]
    client = Client()
    encoded = {node.pk: json.dumps(bodies[node.pk]).encode() for node in chosen}
    cpu = CPU()
    before = cpu.now()
    done = 0
    while done < HTTP_REQUESTS:
        for node, credential, secret in keys:
            if done >= HTTP_REQUESTS:
                break
            body = encoded[node.pk]
            response = client.generic("POST", API, body, content_type="application/json",
                                      headers=signed_headers(credential.key_id, secret, "POST", API, body))
            assert response.status_code == 200, response.content[:300]
            done += 1
    return {**CPU.since(before, cpu.now()), "requests": done}


def rollups(start) -> dict:
    """The minute just ingested -> 1-minute buckets; an hour of 1-minute buckets -> 1-hour buckets."""
    from django.db import connection

    from cloud import telemetry
    from cloud.models import GPUSampleRollup

    cpu = CPU()
    before = cpu.now()
    minutes = telemetry.rollup(now=start + timedelta(minutes=1, seconds=15))["1m"]
    minute = CPU.since(before, cpu.now())
    # An earlier hour of 1-minute buckets for every GPU, written in SQL, then rolled into hours.
    hour = start.replace(minute=0) - timedelta(hours=2)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO cloud_gpusamplerollup (gpu_id, period, bucket, samples, utilization_samples, utilization_sum,"
            " utilization_sumsq, utilization_max, temperature_samples, temperature_sum, temperature_max, power_samples,"
            " power_sum, power_max, xid_count, idle_samples) SELECT g.id, '1m', %s + m * interval '1 minute', 6, 6,"
            " 300, 15000, 60, 6, 300, 55, 6, 2400, 420, 0, 0 FROM cloud_gpu g, generate_series(0, 59) m", [hour])
    GPUSampleRollup.objects.filter(period="1m", bucket__gte=start).delete()  # the hour pass starts at the early hour
    GPUSampleRollup.objects.filter(period="1h").delete()
    before = cpu.now()
    hours = telemetry.rollup(now=hour + timedelta(hours=1, minutes=1))["1h"]
    hourly = CPU.since(before, cpu.now())
    return {"minute": {**minute, "buckets": minutes}, "hour": {**hourly, "buckets": hours}}


def main() -> None:
    os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "testserver,127.0.0.1,localhost")  # the in-process client's host
    setup_django(DB)
    from django.utils import timezone

    from cloud.demo import seed_demo
    from cloud.models import GPU, Node

    started = time.perf_counter()
    seed_demo(regions=1, nodes=1280)
    nodes = list(Node.objects.order_by("hostname"))
    gpus = GPU.objects.count()
    print(f"fleet: {len(nodes)} nodes, {gpus} GPUs, seeded in {time.perf_counter() - started:.1f} s")
    bodies = payloads(nodes)
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=5)

    ingest, beats = service(nodes, bodies, start)
    fraction = ingest["cpu_s"] / SIM_SECONDS
    samples = sum(len(bodies[n.pk]["samples"]) for n in nodes) * (SIM_SECONDS // PERIOD_S)
    print(f"service: {beats} heartbeats ({samples} samples) for {SIM_SECONDS} s of a {PERIOD_S} s period: "
          f"{ingest['process_cpu_s']:.2f} s CPU here + {ingest['db_cpu_s']:.2f} s in PostgreSQL "
          f"= {fraction:.1%} of one core (target < {TARGET_CORE_FRACTION:.0%}); wall {ingest['wall_s']:.1f} s, "
          f"{ingest['cpu_s'] / beats * 1000:.2f} ms CPU per heartbeat")

    api = http(nodes, bodies)
    per_request = api["cpu_s"] / api["requests"]
    rate = len(nodes) / PERIOD_S
    api_fraction = per_request * rate
    print(f"http: {api['requests']} signed heartbeats through the node API: {per_request * 1000:.2f} ms CPU each "
          f"({api['process_cpu_s']:.2f} s here + {api['db_cpu_s']:.2f} s in PostgreSQL); at {rate:.0f}/s that "
          f"is {api_fraction:.1%} of one core")

    rolled = rollups(start)
    minute_per_s = rolled["minute"]["cpu_s"] / 60
    hour_per_s = rolled["hour"]["cpu_s"] / 3600
    print(f"rollup: one minute -> {rolled['minute']['buckets']} buckets in {rolled['minute']['cpu_s']:.2f} s CPU "
          f"({minute_per_s:.2%} of a core averaged); one hour -> {rolled['hour']['buckets']} buckets in "
          f"{rolled['hour']['cpu_s']:.2f} s CPU ({hour_per_s:.3%} averaged)")
    cpu = CPU()
    if not cpu.readable:
        print("note: the PostgreSQL backend's /proc entry could not be read; only this process's CPU is counted")
    total = fraction + minute_per_s + hour_per_s
    result = {
        "bench": "telemetry_ingest", "gpus": gpus, "nodes": len(nodes), "period_s": PERIOD_S,
        "samples_per_s": round(gpus / PERIOD_S), "simulated_s": SIM_SECONDS, "heartbeats": beats,
        "service": ingest, "service_core_fraction": round(fraction, 4),
        "service_ms_per_heartbeat": round(ingest["cpu_s"] / beats * 1000, 3),
        "http": api, "http_ms_per_request": round(per_request * 1000, 3), "http_core_fraction": round(api_fraction, 4),
        "rollup": rolled, "rollup_core_fraction": round(minute_per_s + hour_per_s, 5),
        "ingest_and_rollup_core_fraction": round(total, 4), "db_cpu_counted": cpu.readable,
        "target_core_fraction": TARGET_CORE_FRACTION, "met": total < TARGET_CORE_FRACTION,
    }
    print("RESULT " + json.dumps(result))
    drop_database(DB)


if __name__ == "__main__":
    main()
