"""
GPU telemetry ingestion at fleet scale: 10,240 GPUs (the benchmark fleet, 1,280 nodes x 8) whose
agents heartbeat every 10 s, i.e. 128 heartbeats and 1,024 GPU samples a second. Target: the
control plane spends under 30 % of one core on it (on the 2-core machine).

What runs, on a scratch PostgreSQL database:

  - service: BENCH_SIM_SECONDS (60) of simulated time, every node's heartbeat each period through
    ``operations.node_api.agents.heartbeat`` -- the inventory check, ``cloud.telemetry.ingest``
    (8 raw samples, the latest per GPU and the port states that are due, in one statement) and
    the AgentState row: what the node API does for a heartbeat but the request, its signature
    and the policy answer;
  - http: the same heartbeats as agents send them, signed, through the node API in this process
    as a WSGI server hands them to the project's WSGI application (``config.wsgi``: the node API's
    own handler and its short middleware chain, the key read with what is stored of its node and
    the node's desired state in one statement, the signature check, the nonce spent with the
    liveness and the telemetry in another, the policy answer): the path the fleet really
    takes. First one heartbeat per node with no policy version (agents starting: the whole
    policy comes back; not measured), then BENCH_HTTP_ROUNDS (3) rounds of BENCH_HTTP_REQUESTS
    (1280) more (the median round is reported), each carrying the version of the policy its
    agent holds (the steady state: the policy comes back only when it changed), then as many
    with no version (older agents: the whole policy every time). The steady state is what is
    held against the target. The WSGI server's own HTTP parsing
    (gunicorn) is not in it; the steady state is also sent through Django's test client, as this
    benchmark measured it before (the test client's own work on top);
  - rollup: the minute just ingested (61,440 samples -> 10,240 one-minute buckets), and one hour
    of one-minute buckets (614,400 rows, made in SQL) -> 10,240 one-hour buckets.

CPU is measured, not wall time: this process's ``time.process_time`` plus the CPU of its
PostgreSQL backend (utime + stime from /proc/<backend pid>/stat; PostgreSQL runs on this machine).
PostgreSQL's background processes (WAL writer, checkpointer) are not counted. The fraction of
one core is CPU seconds per simulated second; for the node API, CPU per request times the
fleet's 128 heartbeats a second. The verdict (``met``) is the node API's steady state plus the
rollups against the target. Other work on the machine (another benchmark) inflates CPU time
too: run it on a quiet machine.

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
HTTP_REQUESTS = int(os.environ.get("BENCH_HTTP_REQUESTS", "1280"))
# The steady state is measured this many times and the median round reported: on a shared
# machine one round's CPU figure can be off by half.
HTTP_ROUNDS = int(os.environ.get("BENCH_HTTP_ROUNDS", "3"))
TARGET_CORE_FRACTION = 0.30


class CPU:
    """
    CPU seconds of this process and of its PostgreSQL backend, read before and after a piece of
    work, and the whole machine's (/proc/stat): what the rest of the machine ran meanwhile
    (``others_cpu_s``) says whether the figures are to be trusted -- on this small virtual
    machine, another process busy at the same time inflates this one's CPU time too.
    """

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

    def _machine(self) -> float:
        try:
            with open("/proc/stat") as handle:
                user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, handle.readline().split()[1:9])
            return (user + nice + system + irq + softirq + steal) / self.ticks
        except (OSError, ValueError):
            return 0.0

    def now(self) -> tuple[float, float, float, float]:
        return time.perf_counter(), time.process_time(), self._backend() or 0.0, self._machine()

    @staticmethod
    def since(start: tuple, end: tuple) -> dict:
        wall, process, backend, machine = (b - a for a, b in zip(start, end, strict=True))
        return {
            "wall_s": round(wall, 3),
            "process_cpu_s": round(process, 3),
            "db_cpu_s": round(backend, 3),
            "cpu_s": round(process + backend, 3),
            "others_cpu_s": round(max(machine - process - backend, 0), 3),
        }


def busy(*measured: dict) -> str:
    """A warning when the rest of the machine was busy during the measurements ('' when quiet)."""
    others = sum(m["others_cpu_s"] for m in measured)
    wall = sum(m["wall_s"] for m in measured)
    if others <= max(0.1 * wall, 0.2):
        return ""
    return (
        f"warning: the rest of the machine used {others:.1f} s of CPU during {wall:.1f} s of measurement "
        "(another program, or PostgreSQL's autovacuum and WAL writer); if another program, these figures "
        "are inflated: run it again on a quiet machine"
    )


def payloads(nodes) -> dict:
    """Each node's heartbeat: inventory, 8 samples and 8 port states, as an agent sends them."""
    from cloud.models import GPU, HCAPort

    gpus: dict = {}
    for node_id, index, uuid, memory in GPU.objects.order_by("index").values_list(
        "node_id", "index", "uuid", "memory_mib"
    ):
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
            "samples": [
                {
                    "uuid": u,
                    "utilization_pct": rng.randint(0, 100),
                    "memory_used_mib": rng.randint(0, m),
                    "memory_total_mib": m,
                    "temperature_c": rng.randint(30, 80),
                    "power_w": round(rng.uniform(70, 700), 1),
                    "ecc_corrected": 0,
                    "ecc_uncorrected": 0,
                    "processes": rng.randint(0, 4),
                    "xids": [],
                }
                for _, u, m in mine
            ],
            "ports": [{"guid": g, "link": "up"} for g in ports.get(node.pk, [])],
        }
    return bodies


def service(nodes, bodies, start) -> tuple[dict, int]:
    """Every node's heartbeat each period of SIM_SECONDS, through the service the node API calls."""
    from operations.node_api.agents import heartbeat

    cpu = CPU()
    before = cpu.now()
    beats = 0
    for step in range(SIM_SECONDS // PERIOD_S):
        now = start + timedelta(seconds=PERIOD_S * step)
        for node in nodes:
            body = bodies[node.pk]
            heartbeat(
                node=node, agent_version="1", gpus=body["gpus"], samples=body["samples"], ports=body["ports"], now=now
            )
            beats += 1
    return CPU.since(before, cpu.now()), beats


def http(nodes, bodies) -> dict:
    """
    Signed heartbeats through the node API in this process, as a WSGI server hands them to the
    project's WSGI application (``config.wsgi.application``: the node API's handler, its middleware,
    the view, the response closed): one per node with no policy
    version (agents starting: the whole policy comes back; not measured), then HTTP_REQUESTS with
    the version each agent holds (the steady state: the policy only when it changed), then as
    many with none (older agents: the whole policy every time). The requests are signed
    and encoded before the clock starts (that is the agents' work) and the answers read after it.
    The steady state is also sent through Django's test client, as this benchmark did before: the
    full middleware chain of every other request, and the test client's own work on top.
    """
    import io
    import sys

    from django.test import Client

    from operations.node_api.agents import credential_issue
    from provisioning.agent.signing import signed_headers

    API = "/api/agent/v1/heartbeat/"
    keys = [(node, *credential_issue(actor=None, node=node)) for node in nodes]
    from config.wsgi import application as handler
    held: dict = {}

    def signed(count: int, versions: bool) -> list[tuple]:
        """(node, body, headers) for ``count`` heartbeats, node after node, each carrying its held version or not."""
        made = []
        for position in range(count):
            node, credential, secret = keys[position % len(keys)]
            payload = {**bodies[node.pk], "policy_version": held[node.pk]} if versions else bodies[node.pk]
            body = json.dumps(payload).encode()
            made.append((node, body, signed_headers(credential.key_id, secret, "POST", API, body)))
        return made

    def wsgi(body: bytes, headers: dict) -> tuple[str, bytes]:
        environ = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": API,
            "SCRIPT_NAME": "",
            "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "HTTP_HOST": "127.0.0.1",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)),
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.url_scheme": "http",
            "wsgi.version": (1, 0),
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
            **{"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()},
        }
        status = []
        response = handler(environ, lambda line, _headers: status.append(line))
        try:
            return status[0], b"".join(response)
        finally:
            response.close()  # what the server does: request_finished, the connection kept or closed

    def run(requests: list[tuple], send) -> tuple[dict, list]:
        cpu = CPU()
        before = cpu.now()
        answers = [send(body, headers) for _, body, headers in requests]
        return {**CPU.since(before, cpu.now()), "requests": len(requests)}, answers

    def check(requests: list[tuple], answers: list, versions: bool) -> None:
        for (node, _, _), (status, content) in zip(requests, answers, strict=True):
            assert status.startswith("200"), content[:300]
            answer = json.loads(content)
            if versions:  # the policy comes back only when it is not the one held
                assert ("policy" in answer) == (answer["policy_version"] != held[node.pk]), answer
            held[node.pk] = answer["policy_version"]

    requests = signed(len(keys), versions=False)  # every agent's first heartbeat: the whole policy back
    check(requests, run(requests, wsgi)[1], versions=False)
    rounds = []
    for _ in range(max(1, HTTP_ROUNDS)):
        requests = signed(HTTP_REQUESTS, versions=True)
        measured, answers = run(requests, wsgi)
        check(requests, answers, versions=True)
        rounds.append(measured)
    rounds.sort(key=lambda measured: measured["cpu_s"])
    steady = {**rounds[len(rounds) // 2],
              "rounds_ms_per_request": [round(r["cpu_s"] / r["requests"] * 1000, 3) for r in rounds]}
    requests = signed(HTTP_REQUESTS, versions=False)  # older agents: the whole policy every time
    whole, answers = run(requests, wsgi)
    check(requests, answers, versions=False)

    client = Client(HTTP_HOST="127.0.0.1")

    def through_client(body: bytes, headers: dict) -> tuple[str, bytes]:
        response = client.generic("POST", API, body, content_type="application/json", headers=headers)
        return str(response.status_code), response.content

    requests = signed(min(HTTP_REQUESTS, 512), versions=True)
    via_client, answers = run(requests, through_client)
    check(requests, answers, versions=True)
    return {"steady": steady, "whole_policy": whole, "steady_test_client": via_client}


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
            " 300, 15000, 60, 6, 300, 55, 6, 2400, 420, 0, 0 FROM cloud_gpu g, generate_series(0, 59) m",
            [hour],
        )
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

    from cloud.models import GPU, Node
    from config.demo import seed_demo

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
    print(
        f"service: {beats} heartbeats ({samples} samples) for {SIM_SECONDS} s of a {PERIOD_S} s period: "
        f"{ingest['process_cpu_s']:.2f} s CPU here + {ingest['db_cpu_s']:.2f} s in PostgreSQL "
        f"= {fraction:.1%} of one core without the HTTP request; wall {ingest['wall_s']:.1f} s, "
        f"{ingest['cpu_s'] / beats * 1000:.2f} ms CPU per heartbeat"
    )

    api = http(nodes, bodies)
    rate = len(nodes) / PERIOD_S
    per_request = {case: api[case]["cpu_s"] / api[case]["requests"] for case in api}
    api_fraction = per_request["steady"] * rate
    whole = api["whole_policy"]
    print(
        f"http, agents that send no policy version (older ones; the whole policy back every time): "
        f"{whole['requests']} signed heartbeats, {per_request['whole_policy'] * 1000:.2f} ms CPU each "
        f"({whole['process_cpu_s']:.2f} s here + {whole['db_cpu_s']:.2f} s in PostgreSQL); a fleet of them: "
        f"{per_request['whole_policy'] * rate:.1%} of one core"
    )
    steady = api["steady"]
    spread = steady["rounds_ms_per_request"]
    print(
        f"http, steady state (each agent sends the version it holds): {steady['requests']} signed heartbeats, "
        f"the median of {len(spread)} rounds {per_request['steady'] * 1000:.2f} ms CPU each (rounds "
        f"{min(spread):.2f}-{max(spread):.2f} ms; {steady['process_cpu_s']:.2f} s here + "
        f"{steady['db_cpu_s']:.2f} s in PostgreSQL); at {rate:.0f}/s that is {api_fraction:.1%} of one core "
        f"(target < {TARGET_CORE_FRACTION:.0%})"
    )
    print(
        f"http, the steady state through Django's test client instead (as measured before, its own work "
        f"included): {per_request['steady_test_client'] * 1000:.2f} ms CPU each, "
        f"{per_request['steady_test_client'] * rate:.1%} of one core"
    )

    rolled = rollups(start)
    minute_per_s = rolled["minute"]["cpu_s"] / 60
    hour_per_s = rolled["hour"]["cpu_s"] / 3600
    print(
        f"rollup: one minute -> {rolled['minute']['buckets']} buckets in {rolled['minute']['cpu_s']:.2f} s CPU "
        f"({minute_per_s:.2%} of a core averaged); one hour -> {rolled['hour']['buckets']} buckets in "
        f"{rolled['hour']['cpu_s']:.2f} s CPU ({hour_per_s:.3%} averaged)"
    )
    cpu = CPU()
    if not cpu.readable:
        print("note: the PostgreSQL backend's /proc entry could not be read; only this process's CPU is counted")
    noise = busy(ingest, *api.values(), rolled["minute"], rolled["hour"])
    if noise:
        print(noise)
    total = api_fraction + minute_per_s + hour_per_s
    result = {
        "bench": "telemetry_ingest",
        "gpus": gpus,
        "nodes": len(nodes),
        "period_s": PERIOD_S,
        "samples_per_s": round(gpus / PERIOD_S),
        "simulated_s": SIM_SECONDS,
        "heartbeats": beats,
        "service": ingest,
        "service_core_fraction": round(fraction, 4),
        "service_ms_per_heartbeat": round(ingest["cpu_s"] / beats * 1000, 3),
        "http": api,
        "http_ms_per_request": round(per_request["steady"] * 1000, 3),
        "http_core_fraction": round(api_fraction, 4),
        "http_whole_policy_ms_per_request": round(per_request["whole_policy"] * 1000, 3),
        "http_whole_policy_core_fraction": round(per_request["whole_policy"] * rate, 4),
        "http_test_client_ms_per_request": round(per_request["steady_test_client"] * 1000, 3),
        "http_test_client_core_fraction": round(per_request["steady_test_client"] * rate, 4),
        "rollup": rolled,
        "rollup_core_fraction": round(minute_per_s + hour_per_s, 5),
        "http_and_rollup_core_fraction": round(total, 4),
        "db_cpu_counted": cpu.readable,
        "quiet": not noise,
        "target_core_fraction": TARGET_CORE_FRACTION,
        "met": total < TARGET_CORE_FRACTION,
    }
    verdict = "met" if total < TARGET_CORE_FRACTION else "NOT met"
    print(
        f"target: node API (steady) + rollups = {total:.1%} of one core, target < {TARGET_CORE_FRACTION:.0%}: {verdict}"
    )
    print("RESULT " + json.dumps(result))
    drop_database(DB)


if __name__ == "__main__":
    main()
