"""
The API path "select and claim": POST a reservation that the fast path places at once (the
response says ``scheduled``), through gunicorn (2 workers x 4 threads) on 127.0.0.1, on the
benchmark fleet (1,280 nodes x 8 GPUs, seeded like bench/api_latency.py). From 1 and from 4
client threads it measures claims per second and p50/p99 latency (each series runs
BENCH_SERIES_SECONDS, 20, or BENCH_CLAIMS requests) of:

  - a 1-GPU VM, an 8-GPU VM (one shared host's 8 GPUs) and a whole 8-GPU bare-metal node;
  - the capacity queries ``GET /api/v1/offerings/`` (every offering with its availability) and,
    from one client, ``GET /api/v1/offerings/{id}/`` for the 1-GPU and the 8-GPU VM offering
    (one offering: how many units could start now in each region, counted over the whole fleet).

The server runs on the embedded defaults for the broker and the cache (files in its data
folder): a placed create's start message leaves from the process's start sender after the
answer (provisioning/start_sender.py), and the API throttle counts in the file cache. Set
CELERY_BROKER_URL (RabbitMQ, publisher confirms) and REDIS_URL to measure those instead. A thread
in the bench releases what was placed more than a second ago (directly in the database, as a
finished reservation would), so capacity never runs out, and archives and vacuums as a deployment's
lifecycle tick and autovacuum would (``Releaser``). Exceptions in the
server's log are counted (a 5xx is a bug). Then, in-process, BENCH_BREAKDOWN (40) creates per
kind with a timer around each step of ``services.reservation_create``: where the time goes.

OpenStack Placement beside it (shared/peers/openstack-placement.sh): BENCH_PLACEMENT=1 runs
the peer after Meridian's figures (about 4 minutes: flat, 1,280 nodes x 8 GPUs, on its own
PostgreSQL like Meridian's, the same database kind; BENCH_PLACEMENT_DB=sqlite for its default); or
BENCH_PLACEMENT_RESULT=path/to/result-sqlite-flat.json reads a result it wrote. Either way the
RESULT line then carries the ratios (goal: 10x): claims per second against Placement's
select+claim; a placed create's latency against one select+claim (like for like: both the mean
of one client's back-to-back requests) and, stricter, against Placement's ``GET
/allocation_candidates`` alone, for 1 and 8 GPUs; and one offering's availability against
``allocation_candidates`` for as many GPUs, with limit=10 and without a limit (every candidate,
as an exact count needs). Both benches drive their server with python-requests Sessions.

The peer's own run comes minutes after Meridian's series, and this machine's speed drifts by a
third within minutes, which moves the ratios as much as any change does. So with BENCH_PLACEMENT=1
the peer's server is kept running and the two are then measured interleaved: BENCH_ROUNDS (5)
rounds, each of short blocks (BENCH_BLOCK_SECONDS, 4) that alternate Meridian and Placement --
a 1-GPU create, then Placement's select+claim of 1 GPU; the 8-GPU VM and bare-metal creates, then
its select+claim of 8 GPUs; one offering's availability, then ``allocation_candidates`` for as
many GPUs -- from one client each. What a block claims on Placement is deleted after it (not
timed), as the releaser frees Meridian's, so both fleets stay nearly empty. The ``interleaved``
ratios (pooled over the rounds, with the lowest round's beside them) are the verdict; the
sequential ones stay for comparison with earlier runs.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/meridian .venv/bin/python bench/claims.py

It prints readable lines and one final ``RESULT {json}`` line.
"""

import json
import os
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from itertools import count
from pathlib import Path

import requests
from common import REPO, Upkeep, drop_database, free_port, percentile, serve, setup_django

DB = "meridian_bench_claims"
CLAIMS = int(os.environ.get("BENCH_CLAIMS", "2000"))  # at most, per series
QUERIES = int(os.environ.get("BENCH_QUERIES", "2000"))
SERIES_S = float(os.environ.get("BENCH_SERIES_SECONDS", "20"))  # each series stops after this long
CLIENTS = [1, 4]
HOLD_S = float(os.environ.get("BENCH_HOLD_SECONDS", "1"))
VACUUM_S = float(os.environ.get("BENCH_VACUUM_SECONDS", "10"))  # 0: never (see Releaser)
BREAKDOWN = int(os.environ.get("BENCH_BREAKDOWN", "40"))  # in-process creates per kind, timed by function
PEERS = REPO.parent / "shared" / "peers"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))  # interleaved rounds against Placement
BLOCK_S = float(os.environ.get("BENCH_BLOCK_SECONDS", "4"))  # each block of a round
GOAL_RATIO = 10.0
_names = count()


def prepare() -> tuple[str, dict]:
    from cloud.models import Offering
    from config.demo import seed_demo
    from tenants.models import Membership, Quota, User
    from tests.world import issue_token

    started = time.perf_counter()
    seed_demo(regions=1, nodes=1280)
    alice = User.objects.get(email="alice@acme.example")
    tenant = Membership.objects.get(user=alice).tenant
    Quota.objects.filter(tenant=tenant).update(limit=10_000_000)  # quotas are not what is measured
    short = Offering.objects.get(slug__startswith="vm-", slug__endswith="x1").slug.removeprefix("vm-")[:-2]
    print(f"seeded the fleet and the demo tenants in {time.perf_counter() - started:.1f} s")
    region = "us-east-1"
    bodies = {
        "1 GPU VM": {"offering": f"vm-{short}x1", "gpus": 1, "regions": [region], "duration_hours": 1},
        "8 GPU VM": {"offering": f"vm-{short}x8", "gpus": 8, "regions": [region], "duration_hours": 1},
        "8 GPU bare-metal node": {"offering": f"bm-{short}x8", "nodes": 1, "regions": [region], "duration_hours": 1},
    }
    return issue_token(alice, tenant), bodies


class Releaser(threading.Thread):
    """
    Ends, every 0.2 s, what the fast path placed more than HOLD_S ago: its capacity is free again.
    And does what a deployment's database and lifecycle tick do meanwhile: archives the ended
    allocations every 5 s (the tick's ``allocations_archive``, with the deployment's horizon), and
    vacuums the tables the releases rewrite every VACUUM_S, as autovacuum would. This machine's
    PostgreSQL runs with autovacuum off (the peer's own PostgreSQL, a fresh initdb, has it on):
    without this, the thousands of rows a minute that the releases rewrite stay in the indexes as
    dead entries, and a create gets dearer all run long (9.8 -> 14.3 ms in 100 s, seen here).
    """

    def __init__(self):
        super().__init__(daemon=True)
        self.stopping = threading.Event()
        self.released = 0

    def run(self):
        from django.db import connection

        upkeep = Upkeep(VACUUM_S)
        try:
            while not self.stopping.wait(0.2):
                self.released += release(HOLD_S)
                upkeep.tick()
        finally:
            connection.close()


def release(hold_s: float) -> int:
    from django.db import transaction
    from django.utils import timezone

    from provisioning.models import Allocation, Reservation

    now = timezone.now()
    with transaction.atomic():
        done = list(Reservation.objects.filter(state="scheduled", scheduled_at__lte=now - timedelta(seconds=hold_s))
                    .values_list("pk", flat=True))
        Allocation.objects.filter(reservation_id__in=done, starts_at__gte=now).delete()
        Allocation.objects.filter(reservation_id__in=done, ends_at__gt=now).update(ends_at=now)
        Reservation.objects.filter(pk__in=done).update(state="released", released_at=now, state_changed_at=now)
    return len(done)


class Client(threading.local):
    """
    One python-requests Session per client thread: the peer's bench (shared/peers) drives Placement
    with the same library, so both sides pay the same client. A Session keeps its connection open
    where the server allows it (gunicorn's threaded workers here; Placement's sync worker closes it).
    """

    def __init__(self, token: str):
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"


def claim_series(base: str, token: str, body: dict, clients: int, n: int) -> dict:
    client = Client(token)
    states: dict[str, int] = {}
    lock = threading.Lock()

    def one(_):
        if time.perf_counter() > deadline:
            return None
        started = time.perf_counter()
        response = client.session.post(f"{base}/reservations/", json={**body, "name": f"claim-{next(_names)}"})
        state = response.json()["state"] if response.status_code == 201 else f"http {response.status_code}"
        elapsed = time.perf_counter() - started
        with lock:
            states[state] = states.get(state, 0) + 1
        return elapsed, state

    with ThreadPoolExecutor(clients) as pool:
        deadline = time.perf_counter() + SERIES_S
        list(pool.map(one, range(5 * clients)))  # warm-up (connections, caches)
        states.clear()
        started = time.perf_counter()
        deadline = started + SERIES_S
        results = [r for r in pool.map(one, range(n)) if r is not None]
        wall = time.perf_counter() - started
    placed = [elapsed for elapsed, state in results if state == "scheduled"]
    latencies = [elapsed for elapsed, _ in results]
    return {"requests": len(results), "seconds": round(wall, 1), "states": states,
            "claims_per_s": round(len(placed) / wall, 1), "mean_ms": round(sum(latencies) * 1000 / len(latencies), 1),
            "p50_ms": round(percentile(latencies, 50) * 1000, 1), "p99_ms": round(percentile(latencies, 99) * 1000, 1)}


def query_series(url: str, token: str, clients: int, n: int) -> dict:
    client = Client(token)

    def one(_):
        if time.perf_counter() > deadline:
            return None
        started = time.perf_counter()
        client.session.get(url).raise_for_status()
        return time.perf_counter() - started

    with ThreadPoolExecutor(clients) as pool:
        deadline = time.perf_counter() + SERIES_S
        list(pool.map(one, range(10 * clients)))
        started = time.perf_counter()
        deadline = started + SERIES_S / 2
        latencies = [r for r in pool.map(one, range(n)) if r is not None]
        wall = time.perf_counter() - started
    return {"requests": len(latencies), "req_per_s": round(len(latencies) / wall, 1),
            "p50_ms": round(percentile(latencies, 50) * 1000, 1),
            "p99_ms": round(percentile(latencies, 99) * 1000, 1)}


class PlacementClient:
    """
    The peer's running Placement server, asked as the peer's own bench asks it (no Keystone: the
    noauth2 admin token; the same resources per request, a new project per claim).
    """

    RESOURCES = "resources=CUSTOM_GPU_H100:{gpus},VCPU:8,MEMORY_MB:65536"

    def __init__(self, base: str):
        self.base = base
        self.session = requests.Session()
        self.session.headers.update({"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39",
                                     "Content-Type": "application/json", "Accept": "application/json"})
        self.claimed: list[str] = []

    def candidates(self, gpus: int, limit: int | None) -> list:
        query = self.RESOURCES.format(gpus=gpus) + (f"&limit={limit}" if limit else "")
        response = self.session.get(f"{self.base}/allocation_candidates?{query}")
        response.raise_for_status()
        return response.json()["allocation_requests"]

    def select_and_claim(self, gpus: int) -> str:
        """GET one candidate, then PUT its allocations for a new consumer: the peer's select+claim."""
        found = self.candidates(gpus, 1)
        if not found:
            return "no candidate"
        consumer = str(uuid.uuid4())
        body = {"allocations": found[0]["allocations"], "consumer_generation": None,
                "project_id": str(uuid.uuid4()), "user_id": "bench", "consumer_type": "INSTANCE"}
        self.session.put(f"{self.base}/allocations/{consumer}", data=json.dumps(body)).raise_for_status()
        self.claimed.append(consumer)
        return "claimed"

    def release(self) -> None:
        """Delete what was claimed (not timed): the fleet stays as empty as Meridian's."""
        for consumer in self.claimed:
            self.session.delete(f"{self.base}/allocations/{consumer}").raise_for_status()
        self.claimed.clear()


def timed_block(fn, seconds: float, outcomes: dict) -> list[float]:
    """``fn`` called back to back for ``seconds`` from one client: the latencies; the outcomes counted."""
    latencies = []
    end = time.perf_counter() + seconds
    while (started := time.perf_counter()) < end:
        outcome = fn()
        latencies.append(time.perf_counter() - started)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return latencies


def interleaved(base: str, token: str, bodies: dict, one_offering: dict, placement: PlacementClient) -> dict:
    """
    Meridian and Placement measured in alternating blocks of BLOCK_S, ROUNDS times, one client
    each (odd rounds start with Placement): each Meridian series beside the Placement call it is
    compared with, so both see the machine at the same speed. Returns, per series, the latencies
    of every round and the outcomes counted.
    """
    client = Client(token)

    def create(body):
        def one():
            response = client.session.post(f"{base}/reservations/", json={**body, "name": f"claim-{next(_names)}"})
            return response.json()["state"] if response.status_code == 201 else f"http {response.status_code}"
        return one

    def availability(offering_id):
        def one():
            client.session.get(f"{base}/offerings/{offering_id}/").raise_for_status()
            return "answered"
        return one

    def candidates(gpus, limit):
        def one():
            return f"{len(placement.candidates(gpus, limit))} candidates"
        return one

    def claim(gpus):
        return lambda: placement.select_and_claim(gpus)

    # (Meridian series, its call) beside [(Placement series, its call, share of a block)].
    pairs = [
        (("create 1 GPU VM", create(bodies["1 GPU VM"])), [("select+claim 1 GPU", claim(1), 1.0)]),
        (("create 8 GPU VM", create(bodies["8 GPU VM"])), [("select+claim 8 GPUs", claim(8), 1.0)]),
        (("create 8 GPU bare-metal node", create(bodies["8 GPU bare-metal node"])),
         [("select+claim 8 GPUs", claim(8), 1.0)]),
        (("one offering 1 GPU VM", availability(one_offering[1])),
         [("allocation_candidates 1 GPU limit10", candidates(1, 10), 0.5),
          ("allocation_candidates 1 GPU nolimit", candidates(1, None), 0.5)]),
        (("one offering 8 GPU VM", availability(one_offering[8])),
         [("allocation_candidates 8 GPU limit10", candidates(8, 10), 0.5),
          ("allocation_candidates 8 GPU nolimit", candidates(8, None), 0.5)]),
    ]
    rounds: dict[str, list[list[float]]] = {}
    outcomes: dict[str, dict] = {}
    for number in range(ROUNDS):
        for (label, call), theirs in pairs:
            blocks = [(label, call, 1.0), *theirs]
            for series, fn, share in (blocks if number % 2 == 0 else blocks[::-1]):
                latencies = timed_block(fn, BLOCK_S * share, outcomes.setdefault(series, {}))
                placement.release()
                per_round = rounds.setdefault(series, [])
                if len(per_round) <= number:
                    per_round.append([])
                per_round[number] += latencies
        print(f"interleaved round {number + 1}/{ROUNDS}: "
              + ", ".join(f"{series} {sum(r[number]) * 1000 / len(r[number]):.1f}" for series, r in rounds.items())
              + " ms mean")
    return {"rounds": rounds, "outcomes": outcomes}


def interleaved_ratios(measured: dict) -> dict:
    """
    Placement's time over Meridian's for each pair, pooled over the rounds and the lowest single
    round: a create's mean against select+claim's mean (one client: the claims-per-second ratio
    too) and, stricter, a create's p50 against ``allocation_candidates`` alone; one offering's
    availability p50 against ``allocation_candidates`` for as many GPUs.
    """
    rounds = measured["rounds"]

    def stat(latencies, how):
        return sum(latencies) / len(latencies) if how == "mean" else percentile(latencies, 50)

    def ratio(theirs, ours, how):
        pooled = stat(sum(rounds[theirs], []), how) / stat(sum(rounds[ours], []), how)
        lowest = min(stat(t, how) / stat(o, how) for t, o in zip(rounds[theirs], rounds[ours], strict=True) if t and o)
        return {"pooled": round(pooled, 1), "lowest_round": round(lowest, 1)}

    figures = {series: {"calls": sum(map(len, per_round)),
                        "mean_ms": round(stat(sum(per_round, []), "mean") * 1000, 1),
                        "p50_ms": round(stat(sum(per_round, []), "p50") * 1000, 1),
                        "p99_ms": round(percentile(sum(per_round, []), 99) * 1000, 1)}
               for series, per_round in rounds.items()}
    out = {}
    for ours, gpus in (("create 1 GPU VM", 1), ("create 8 GPU VM", 8), ("create 8 GPU bare-metal node", 8)):
        out[f"{ours} mean vs Placement select+claim {gpus} GPU mean (= claims/s x, 1 client)"] = ratio(
            f"select+claim {gpus} GPU{'s' if gpus > 1 else ''}", ours, "mean")
        out[f"{ours} p50 vs Placement allocation_candidates {gpus} GPU limit10 p50"] = ratio(
            f"allocation_candidates {gpus} GPU limit10", ours, "p50")
    for gpus in (1, 8):
        for limit in ("limit10", "nolimit"):
            out[f"one offering {gpus} GPU VM p50 vs Placement allocation_candidates {gpus} GPU {limit} p50"] = ratio(
                f"allocation_candidates {gpus} GPU {limit}", f"one offering {gpus} GPU VM", "p50")
    return {"rounds": len(next(iter(rounds.values()))), "block_seconds": BLOCK_S, "series": figures,
            "outcomes": measured["outcomes"], "ratios": out, "goal_ratio": GOAL_RATIO}


# Functions timed in the in-process breakdown of a create: (module, attribute) as reservation_create reaches them.
TIMED = [
    ("provisioning.admission", "check_never_fits"),
    ("provisioning.lock_objects", "tenant_lock"),
    ("provisioning.admission", "check_quota"),
    ("provisioning.services", "_score"),
    ("provisioning.services", "_outranked"),
    ("provisioning.services", "_place_on_free"),
    ("provisioning.services", "_fast_path"),
    ("provisioning.services", "_store_scheduled"),
]


def breakdown(bodies: dict, n: int) -> dict:
    """
    Where a create's time goes, in-process (no HTTP): ``services.reservation_create`` n times per
    kind of request, with a timer around the functions in TIMED, ``Planner.place``, and a counter on
    every query. Released after every ten, as in the HTTP run.
    """
    import importlib

    from django.db import connection

    from cloud.models import Offering, Region
    from provisioning import admission, services
    from provisioning.scheduling.planner import planning
    from tenants.choices import TenantRole
    from tenants.models import Membership, User
    from tenants.scoping import Principal

    alice = User.objects.get(email="alice@acme.example")
    tenant = Membership.objects.get(user=alice).tenant
    actor = Principal(user=alice, tenant=tenant, role=TenantRole.OWNER)
    out = {}
    for name, body in bodies.items():
        offering = Offering.objects.get(slug=body["offering"])
        regions = tuple(Region.objects.filter(slug__in=body["regions"]))
        units = body.get("nodes") or body["gpus"] // offering.gpus_per_unit
        totals: dict[str, list] = {}
        queries = [0, 0.0]
        patched = []

        def timer(label, fn, totals=totals):
            def timed(*args, **kwargs):
                t = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    entry = totals.setdefault(label, [0, 0.0])
                    entry[0] += 1
                    entry[1] += time.perf_counter() - t
            return timed

        def spy(execute, sql, params, many, context, queries=queries):
            t = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                queries[0] += 1
                queries[1] += time.perf_counter() - t

        targets = [(importlib.import_module(m), a) for m, a in TIMED] + [(planning.Planner, "place")]
        for owner, attribute in targets:
            original = owner.__dict__[attribute] if isinstance(owner, type) else getattr(owner, attribute)
            patched.append((owner, attribute, original))
            label = f"{getattr(owner, '__name__', owner).split('.')[-1]}.{attribute}"
            setattr(owner, attribute, timer(label, original))
        latencies = []
        try:
            with connection.execute_wrapper(spy):
                for i in range(n):
                    ask = admission.Ask(name=f"inproc-{i}", offering=offering, units=units, regions=regions,
                                        duration=timedelta(hours=body["duration_hours"]))
                    t = time.perf_counter()
                    services.reservation_create(actor=actor, ask=ask)
                    latencies.append(time.perf_counter() - t)
                    if i % 10 == 9:
                        release(0.0)
        finally:
            for owner, attribute, original in patched:
                setattr(owner, attribute, original)
        release(0.0)
        out[name] = {
            "creates": n, "p50_ms": round(percentile(latencies, 50) * 1000, 1),
            "queries_per_create": round(queries[0] / n, 1), "db_ms_per_create": round(queries[1] * 1000 / n, 1),
            "ms_per_create": {label: round(total * 1000 / n, 2)
                              for label, (_, total) in sorted(totals.items(), key=lambda kv: -kv[1][1])},
        }
        print(f"in-process {name}: {json.dumps(out[name])}")
    return out


def server_errors(log: Path) -> dict:
    """The last line of each distinct exception the server logged (a 5xx is a bug: the issue allows none)."""
    found: dict[str, int] = {}
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            j = i + 1
            while j < len(lines) and (lines[j].startswith((" ", "\t")) or not lines[j].strip()
                                      or lines[j].startswith(("The above", "During handling"))
                                      or lines[j].startswith("Traceback")):
                j += 1
            if j < len(lines):
                found[lines[j][:300]] = found.get(lines[j][:300], 0) + 1
    for error, n in found.items():
        print(f"server error x{n}: {error}")
    return found


class PeerServer:
    """The peer's Placement server, left running (KEEP=1) for the interleaved rounds, and its PostgreSQL."""

    def __init__(self, pid: int, port: int, work: str, db: str):
        self.pid, self.base, self.work, self.db = pid, f"http://127.0.0.1:{port}", work, db

    def stop(self) -> None:
        import contextlib
        import glob
        import signal

        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        if self.db == "postgres":
            pg_ctl = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))[-1]
            as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
            subprocess.run([*as_postgres, pg_ctl, "-D", f"{self.work}/pgdata", "-m", "fast", "stop"],
                           capture_output=True, timeout=60)


def placement_result() -> tuple[dict | None, PeerServer | None]:
    """
    Placement's figures: run the peer (BENCH_PLACEMENT=1), its server then left running for the
    interleaved rounds; or read a result it wrote (BENCH_PLACEMENT_RESULT: no rounds then).
    """
    import re

    path = os.environ.get("BENCH_PLACEMENT_RESULT")
    if os.environ.get("BENCH_PLACEMENT") == "1":
        script = PEERS / "openstack-placement.sh"
        work = os.environ.get("BENCH_PLACEMENT_WORK", "/tmp/placement-peer-bench")  # noqa: S108 -- the peer's folder
        db = os.environ.get("BENCH_PLACEMENT_DB", "postgres")
        print(f"running OpenStack Placement ({script}), WORK={work}: a few minutes")
        env = dict(os.environ, WORK=work, PORT=os.environ.get("BENCH_PLACEMENT_PORT", "8792"), DB=db, KEEP="1")
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=1200)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        kept = re.search(r"left running: placement pid (\d+) on 127\.0\.0\.1:(\d+)", done.stderr)
        server = PeerServer(int(kept[1]), int(kept[2]), work, db) if kept else None
        if done.returncode or not lines:
            print(f"Placement did not run (exit {done.returncode}): {done.stderr[-800:]}")
            if server:
                server.stop()
            return None, None
        return json.loads(lines[-1].removeprefix("RESULT ")), server
    if path and Path(path).is_file():
        return json.loads(Path(path).read_text()), None
    return None, None


def ratios(meridian: dict, placement: dict) -> dict:
    queries = placement.get("queries", {})
    select_claim = placement.get("claims", {}).get("select_plus_claim_per_s")
    out = {"placement_select_plus_claim_per_s": select_claim,
           "placement_allocation_candidates_ms": {k: queries.get(k, {}).get("median_ms") for k in
                                                  ("gpu1_limit10", "gpu8_limit10", "gpu1_nolimit", "gpu8_nolimit")}}
    claims = meridian["claims"]
    if select_claim:
        for series in ("1 GPU VM", "8 GPU VM", "8 GPU bare-metal node"):
            for clients in CLIENTS:
                key = f"{series}, {clients} client{'s' if clients > 1 else ''}"
                if key in claims:
                    out[f"claims_per_s x Placement: {key}"] = round(claims[key]["claims_per_s"] / select_claim, 1)
    for gpus, series in ((1, "1 GPU VM"), (8, "8 GPU VM"), (8, "8 GPU bare-metal node")):
        one_client = claims.get(f"{series}, 1 client", {})
        # Like for like: a placed create against one select+claim (GET allocation_candidates, then
        # PUT the allocations), both the mean of a single client's back-to-back requests.
        if select_claim and one_client.get("mean_ms"):
            out[f"latency x lower: {series} POST mean vs Placement select+claim mean"] = round(
                1000 / select_claim / one_client["mean_ms"], 1)
        # Stricter: the whole create against Placement's query alone.
        ac = queries.get(f"gpu{gpus}_limit10", {}).get("median_ms")
        ours = one_client.get("p50_ms")
        if ac and ours:
            out[f"latency x lower: {series} POST p50 vs Placement GET allocation_candidates {gpus} GPU p50"] = round(
                ac / ours, 1)
    capacity = meridian["capacity_query"].get("1 client", {}).get("p50_ms")
    if capacity and queries.get("gpu8_limit10", {}).get("median_ms"):
        out["latency x lower: GET offerings p50 vs Placement allocation_candidates 8 GPU p50"] = round(
            queries["gpu8_limit10"]["median_ms"] / capacity, 1)
    for gpus in (1, 8):
        ours = meridian["capacity_query"].get(f"one offering, {gpus} GPU VM, 1 client", {}).get("p50_ms")
        for limit in ("limit10", "nolimit"):
            ac = queries.get(f"gpu{gpus}_{limit}", {}).get("median_ms")
            if ac and ours:
                out[f"latency x lower: GET one offering {gpus} GPU VM p50 vs Placement allocation_candidates "
                    f"{gpus} GPU {limit} p50"] = round(ac / ours, 1)
    out["goal_ratio"] = GOAL_RATIO
    return out


def commit() -> str:
    """The commit measured (with "+" when the working tree differs from it: others may be editing)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True)
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def main():
    setup_django(DB)
    token, bodies = prepare()
    from django.db import connections

    from cloud.models import Offering

    one_offering = {gpus: Offering.objects.get(slug=bodies[name]["offering"]).pk
                    for gpus, name in ((1, "1 GPU VM"), (8, "8 GPU VM"))}

    connections.close_all()
    port = free_port()
    server_log = Path(os.environ["MERIDIAN_DATA_DIR"]) / "gunicorn.log"
    server = serve(port, server_log)
    base = f"http://127.0.0.1:{port}/api/v1"
    releaser = Releaser()
    releaser.start()
    claims, capacity = {}, {}
    placement, peer, side_by_side = None, None, None
    try:
        for name, body in bodies.items():
            for clients in CLIENTS:
                key = f"{name}, {clients} client{'s' if clients > 1 else ''}"
                claims[key] = claim_series(base, token, body, clients, CLAIMS)
                print(f"POST {key:34s} {claims[key]}")
        for clients in CLIENTS:
            key = f"{clients} client{'s' if clients > 1 else ''}"
            capacity[key] = query_series(f"{base}/offerings/", token, clients, QUERIES)
            print(f"GET /offerings/ {key:20s} {capacity[key]}")
        for gpus, offering_id in one_offering.items():
            key = f"one offering, {gpus} GPU VM, 1 client"
            capacity[key] = query_series(f"{base}/offerings/{offering_id}/", token, 1, QUERIES)
            print(f"GET /offerings/{{id}}/ {gpus} GPU VM {capacity[key]}")
        placement, peer = placement_result()
        if peer is not None:
            measured = interleaved(base, token, bodies, one_offering, PlacementClient(peer.base))
            side_by_side = interleaved_ratios(measured)
    finally:
        if peer is not None:
            peer.stop()
        releaser.stopping.set()
        releaser.join()
        server.terminate()
        server.wait()
    errors = server_errors(server_log)
    meridian = {"claims": claims, "capacity_query": capacity}
    result_breakdown = breakdown(bodies, BREAKDOWN) if BREAKDOWN else {}
    result = {"bench": "claims", "commit": commit(), "server": "gunicorn 2 workers x 4 threads", "cpus": os.cpu_count(),
              "released_during_run": releaser.released, "server_errors": errors, **meridian,
              "in_process_breakdown": result_breakdown}
    drop_database(DB)
    if placement:
        result["placement"] = {"label": placement.get("label"), "claims": placement.get("claims"),
                               "queries": {k: v for k, v in placement.get("queries", {}).items()
                                           if not k.endswith("_after_claims")}}
        result["ratios"] = ratios(meridian, placement)
        print("sequential (the peer's own run, minutes after Meridian's series):")
        for key, value in result["ratios"].items():
            print(f"  {key}: {value}")
    if side_by_side:
        result["interleaved"] = side_by_side
        print(f"interleaved ({side_by_side['rounds']} rounds of {BLOCK_S:g} s blocks, one client each):")
        for series, figures in side_by_side["series"].items():
            print(f"  {series}: {figures} {side_by_side['outcomes'][series]}")
        for key, value in side_by_side["ratios"].items():
            print(f"  {key}: {value}")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
