"""
One full scheduling cycle (``provisioning.scheduling.scheduler.run_cycle``: load the queue, rank it, take a
snapshot, plan, apply through services) on the benchmark fleet: one region, 1,280 nodes x 8 GPUs
(leaves of 32 nodes, a quarter shared hosts, 4 % bare-metal spares), with VM, container and
bare-metal offerings from ``config.demo.offerings_for`` (plus 2- and 4-GPU VMs), eight tenants of
four teams with quotas that never bind. BENCH_REGIONS=8 is the 10,240-node fleet (81,920 GPUs; each
region's GPU model as the demo's, the queue spread over the regions), BENCH_FABRICS=8 the same in
one region of eight fabrics; its targets are a cycle p99 under 500 ms (the loop's interval) and the
same 680 placements a second, with the seeding time and the scheduler's memory printed.

Cycles run as the loop runs them (``manage.py run_scheduler``): the collector paused, a
``LoopMemory`` kept between cycles (the teams' records for MERIDIAN_SCHEDULER_RECORD_REFRESH_SECONDS,
their decayed usage for MERIDIAN_SCHEDULER_USAGE_REFRESH_SECONDS, the fleet's shape, the queue's
rows, the planner's index caught up each cycle from the nodes whose allocations changed) and the
cycle budget MERIDIAN_SCHEDULER_CYCLE_BUDGET_MS (250 by default: a cycle plans only what the time
left can commit; 0 turns it off), with MERIDIAN_SCHEDULER_PLACING_SHARE (0.4) of a
cycle kept for placing when its fixed part fills the budget. A cycle cut short by its budget
leaves its ranking to the cycles after it for MERIDIAN_SCHEDULER_RERANK_SECONDS (1): the steady
run says how many of its cycles ranked the queue afresh; the cycles at each fill level below all
do (each is a full cycle from the same state). Set the MERIDIAN_ variables to try other values.

  1. At 0 %, 50 % and 90 % full (allocations inserted in bulk for scheduled reservations) with
     10,000 queued reservations of mixed sizes (1/2/4/8-GPU VMs, 1-2 GPU and MIG-slot containers,
     16-64 GPU bare-metal gangs; on-demand, reserved and spot; some advance windows): a new
     leader's memory, primed as run_scheduler primes it when it starts leading (the time is
     printed), then up to BENCH_CYCLES (10) cycles, each from the same state (what a cycle placed
     is put back in the queue and its allocations removed before the next), at least two, fewer
     when the level's BENCH_FILL_BUDGET_SECONDS (45) runs out: p50/p99 and the ``timings_ms``
     breakdown. The first cycle writes every waiting reason. The last cycle is instrumented:
     queries and database time per phase, garbage-collection pauses, and a timer around each step
     run_cycle takes (TIMED). Outside the cycle: the queue load alone and the ranking alone
     (run_cycle's "rank" lap holds both). BENCH_PROFILE=1 adds one cycle under cProfile per level.
  2. A run of BENCH_SECONDS (60) from BENCH_STEADY_FILL (50 %) full, after one warm-up cycle, while a
     process of its own (as a deployment's workers and API are) keeps the queue at 10,000 and
     releases (directly in the database) what was placed BENCH_HOLD_SECONDS (0: everything placed
     by the cycles before) ago, so capacity exists: placements committed per second of wall time
     (the target), the cycle p50/p99 and the slowest cycles' phases, the loop's resident memory,
     and the cores the loop and the whole machine used.
     Cycles run back to back, as the loop runs them while cycles are cut short by their budget with
     work left (its 0.5 s interval is for a queue that is drained). With a hold of a second, what the
     run measures is how fast the bench turns capacity over: cycles then place as many as were
     released, far fewer than the queue and the budget allow. Releasing hundreds of reservations a
     second rewrites thousands of allocation rows a second, which outpaces autovacuum's default
     one-minute round here (the window's read then wades through dead index entries and slows by half
     within a minute), so the bench vacuums the allocation and reservation tables every
     BENCH_VACUUM_SECONDS (10; 0: never), as autovacuum tuned for a hot table would, in that
     process. It also archives allocations every 5 s, as the
     lifecycle tick does, with the deployment's horizon (MERIDIAN_ALLOCATION_ARCHIVE_AFTER_SECONDS,
     20): the constraint's index holds the last twenty-odd seconds of the run's releases, not all of
     them (with a horizon of an hour each placement got dearer all minute long).

Targets: cycle p99 under 300 ms (500 ms on the 10,240-node fleet); at least 680 placements per
second of wall time in the steady run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/meridian .venv/bin/python bench/scheduler_cycle.py
    BENCH_SECONDS=20 BENCH_CYCLES=3 BENCH_FILLS=50 ... bench/scheduler_cycle.py      # shorter

It prints readable lines and one final ``RESULT {json}`` line.
"""

from __future__ import annotations

import cProfile
import gc
import io
import json
import os
import pstats
import random
import resource
import time
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal

from common import REPO, Upkeep, drop_database, percentile, setup_django

DB = "meridian_bench_cycle"
QUEUE = int(os.environ.get("BENCH_QUEUE", "10000"))
CYCLES = int(os.environ.get("BENCH_CYCLES", "10"))
FILL_BUDGET_S = float(os.environ.get("BENCH_FILL_BUDGET_SECONDS", "45"))
FILLS = [int(f) for f in os.environ.get("BENCH_FILLS", "0,50,90").split(",") if f.strip()]
SECONDS = float(os.environ.get("BENCH_SECONDS", "60"))
STEADY_FILL = int(os.environ.get("BENCH_STEADY_FILL", "50"))
HOLD_S = float(os.environ.get("BENCH_HOLD_SECONDS", "0"))
VACUUM_S = float(os.environ.get("BENCH_VACUUM_SECONDS", "10"))
PROFILE = os.environ.get("BENCH_PROFILE", "0") == "1"
# Regions of BENCH_FABRICS fabrics of 1,280 nodes: 8 regions is the 10,240-node fleet (81,920 GPUs;
# a region's GPU model as the demo's, H100, H200, A100, B200 in turn), as is 1 region of 8 fabrics.
REGIONS = int(os.environ.get("BENCH_REGIONS", "1"))
FABRICS = int(os.environ.get("BENCH_FABRICS", "1"))
TARGET_CYCLE_P99_MS = 300.0 if REGIONS * FABRICS == 1 else 500.0  # the 10,240-node fleet: the loop's 0.5 s interval
TARGET_PLACEMENTS_PER_S = 680.0
TENANTS, TEAMS_PER_TENANT = 8, 4
QUEUE_PREFIX, FILL_PREFIX = "q-", "fill-"
WAITING = "Waiting for the scheduler."
HOUR = timedelta(hours=1)

# (share, offering slug suffix, how many units: a function of the random generator)
MIX = [
    (0.28, "vm-{m}x1", lambda rng: 1),
    (0.12, "vm-{m}x2", lambda rng: 1),
    (0.10, "vm-{m}x4", lambda rng: 1),
    (0.10, "vm-{m}x8", lambda rng: 1),
    (0.10, "ct-{m}x1", lambda rng: rng.choice((1, 1, 2))),
    (0.08, "ct-{m}-mig", lambda rng: rng.randint(1, 3)),
    (0.22, "bm-{m}x8", lambda rng: rng.randint(2, 8)),  # 16-64 GPUs, whole nodes
]


@dataclass
class Site:
    """One region of the benchmark fleet: its GPU model, the offerings of that model, its nodes."""

    region: object
    model: object
    short: str
    offerings: dict
    bare_metal: list  # [(node_id, [gpu_id, ...])] sellable bare-metal nodes
    shared: list  # same, shared hosts
    memory_mib: int


@dataclass
class World:
    sites: list[Site]
    owners: list  # (tenant_id, team_id or None)
    queue_ids: set = field(default_factory=set)
    seeded_s: float = 0.0  # building the fleet


def build_world() -> World:
    from cloud.fleet import FleetSpec, build_fleet
    from cloud.models import GPU, Node, Offering, Region
    from config.demo import offerings_for
    from tenants.choices import QuotaResource
    from tenants.models import Quota, Team, Tenant

    started = time.perf_counter()
    report = build_fleet(FleetSpec(regions=REGIONS, nodes_per_fabric=1280, fabrics_per_region=FABRICS))
    seeded_s = time.perf_counter() - started
    by_model: dict = {}  # GPU model -> (short name, offerings): regions of one model sell the same ones
    sites = []
    for region in Region.objects.order_by("slug"):
        gpus = GPU.objects.filter(node__region=region)
        model = gpus.first().model
        if model.pk not in by_model:
            rows = offerings_for(model)
            vm1 = next(row for row in rows if row["kind"] == "vm" and row["gpus_per_unit"] == 1)
            short = vm1["slug"].removeprefix("vm-").removesuffix("x1")
            for n in (2, 4):  # 2- and 4-GPU VMs, as a cloud would sell them beside the demo's 1 and 8
                rows.append({**vm1, "slug": f"vm-{short}x{n}", "name": f"VM {n}x {model.name}", "gpus_per_unit": n,
                             "spot_available": False, "spot_floor_price": None})
            offerings = {}
            for row in rows:
                row = {k: v for k, v in row.items() if v is not None}
                offerings[row["slug"]] = Offering.objects.create(**row)
            by_model[model.pk] = (short, offerings)
        short, offerings = by_model[model.pk]
        by_node: dict = {}
        for gpu_id, node_id in gpus.order_by("node_id", "index").values_list("id", "node_id"):
            by_node.setdefault(node_id, []).append(gpu_id)
        sellable = Node.objects.filter(region=region, is_spare=False).values_list("id", "pool")
        sites.append(Site(region=region, model=model, short=short, offerings=offerings,
                          bare_metal=[(n, by_node[n]) for n, pool in sellable if pool == "bare_metal"],
                          shared=[(n, by_node[n]) for n, pool in sellable if pool == "shared"],
                          memory_mib=model.memory_gib * 1024))
    owners = []
    for t in range(TENANTS):
        tenant = Tenant.objects.create(slug=f"bench-{t}", name=f"Bench tenant {t}")
        Quota.objects.create(tenant=tenant, resource=QuotaResource.GPUS, limit=10_000_000)
        owners.append((tenant.pk, None))
        for k in range(TEAMS_PER_TENANT):
            owners.append((tenant.pk, Team.objects.create(tenant=tenant, slug=f"team-{k}", name=f"Team {k}").pk))
    world = World(sites=sites, owners=owners, seeded_s=seeded_s)
    print(f"fleet: {report.nodes} nodes, {report.gpus} GPUs in {len(sites)} region(s) "
          f"({sum(len(x.bare_metal) for x in sites)} sellable bare-metal nodes, "
          f"{sum(len(x.shared) for x in sites)} shared hosts), seeded in {seeded_s:.1f} s; "
          f"{sum(len(o) for _, o in by_model.values())} offerings, {len(owners)} owners; "
          f"{time.perf_counter() - started:.1f} s in all")
    return world


def analyze() -> None:
    from django.db import connection

    from provisioning.models import Allocation, Operation, Reservation

    with connection.cursor() as cursor:
        for model in (Reservation, Allocation, Operation):
            cursor.execute(f"ANALYZE {connection.ops.quote_name(model._meta.db_table)}")


def reset() -> None:
    """Remove every reservation and what hangs off it (the fleet and the tenants stay)."""
    from django.db import connection

    from provisioning.models import Allocation, Instance, Operation, Reservation, StepRun

    tables = ", ".join(connection.ops.quote_name(m._meta.db_table)
                       for m in (StepRun, Instance, Allocation, Operation, Reservation))
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {tables} CASCADE")  # and whatever else points at them (memberships...)


def prefill(world: World, fill: int, rng: random.Random) -> int:
    """Scheduled reservations holding ``fill`` % of each pool's GPUs now and for a week; returns GPUs held."""
    from django.db import transaction
    from django.utils import timezone

    from provisioning.models import Allocation, Reservation

    if fill <= 0:
        return 0
    now = timezone.now()
    start, end = now - HOUR, now + timedelta(days=7)
    reservations, allocations = [], []

    def hold(site: Site, slug: str, units: int, picks: list, term: str) -> None:
        tenant_id, team_id = rng.choice(world.owners)
        r = Reservation(tenant_id=tenant_id, team_id=team_id, name=f"{FILL_PREFIX}{len(reservations)}",
                        offering=site.offerings[slug], gpu_model=site.model, units=units, gpus=len(picks),
                        regions=[site.region.slug], region=site.region, duration=end - start, billing_term=term,
                        urgency=0.5, state="scheduled", starts_at=start, ends_at=end, scheduled_at=start,
                        score=rng.random())
        reservations.append(r)
        allocations.extend(Allocation(reservation=r, gpu_id=g, node_id=n, mem_lo=0, mem_hi=site.memory_mib,
                                      starts_at=start, ends_at=end) for n, g in picks)

    for site in world.sites:
        nodes = rng.sample(site.bare_metal, round(len(site.bare_metal) * fill / 100))
        for node_id, gpus in nodes:  # one whole node each
            hold(site, f"bm-{site.short}x8", 1, [(node_id, g) for g in gpus], rng.choice(("on_demand", "reserved")))
        target = round(sum(len(g) for _, g in site.shared) * fill / 100)
        taken = 0
        for node_id, gpus in rng.sample(site.shared, len(site.shared)):
            free = list(gpus)
            while free and taken < target:
                size = min(rng.choice((1, 2, 4, 8)), len(free), target - taken)
                size = max(s for s in (1, 2, 4, 8) if s <= size)
                picks, free = free[:size], free[size:]
                hold(site, f"vm-{site.short}x{size}", 1, [(node_id, g) for g in picks], "on_demand")
                taken += size
            if taken >= target:
                break
    with transaction.atomic():
        Reservation.objects.bulk_create(reservations, batch_size=2000)
        Allocation.objects.bulk_create(allocations, batch_size=5000)
    return len(allocations)


def enqueue(world: World, count: int, rng: random.Random) -> None:
    """``count`` new queued reservations of the mix (each with its pending place operation)."""
    from django.db import connection, transaction
    from django.utils import timezone

    from provisioning.choices import OperationKind
    from provisioning.models import Operation, Reservation
    from provisioning.scheduling.priority import URGENCY_LEVELS

    if count <= 0:
        return
    now = timezone.now()
    levels = list(URGENCY_LEVELS.values())
    reservations = []
    for _ in range(count):
        site = rng.choice(world.sites)
        mix = [row for row in MIX if row[1].format(m=site.short) in site.offerings]
        _, pattern, units_of = rng.choices(mix, weights=[share for share, _, _ in mix])[0]
        offering = site.offerings[pattern.format(m=site.short)]
        units = units_of(rng)
        term = rng.choices(("on_demand", "reserved", "spot"), weights=(0.75, 0.15, 0.10))[0]
        if term == "spot" and not offering.spot_available:
            term = "on_demand"
        tenant_id, team_id = rng.choice(world.owners)
        whole = offering.slots_per_gpu == 1
        reservations.append(Reservation(
            tenant_id=tenant_id, team_id=team_id, name=f"{QUEUE_PREFIX}{len(world.queue_ids) + len(reservations)}",
            offering=offering, gpu_model=site.model, units=units,
            gpus=units * offering.gpus_per_unit if whole else 0, regions=[site.region.slug],
            requested_start=now + timedelta(hours=rng.randint(1, 48)) if rng.random() < 0.05 else None,
            duration=timedelta(minutes=rng.randint(60, 24 * 60)), billing_term=term,
            spot_max_price=(offering.spot_floor_price * Decimal("1.5")) if term == "spot" else None,
            urgency=rng.choice(levels), state="queued", state_reason=WAITING, score=rng.random(),
        ))
    with transaction.atomic():
        Reservation.objects.bulk_create(reservations, batch_size=2000)
        Operation.objects.bulk_create([Operation(tenant_id=r.tenant_id, reservation=r, kind=OperationKind.PLACE,
                                                 step="place") for r in reservations], batch_size=2000)
        # Submitted over the last three days, so the age term and the tie-breaks have work to do.
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {Reservation._meta.db_table} SET submitted_at = submitted_at - random() * "
                           "interval '3 days' WHERE id = ANY(%s)", [[r.pk for r in reservations]])
    world.queue_ids.update(r.pk for r in reservations)


def requeue(world: World) -> int:
    """Put every queue reservation the last cycle placed (or evicted) back in the queue, capacity freed."""
    from django.db import transaction

    from provisioning.choices import OperationState
    from provisioning.models import Allocation, Operation, Reservation

    with transaction.atomic():
        moved = list(Reservation.objects.filter(name__startswith=QUEUE_PREFIX).exclude(state="queued")
                     .values_list("pk", flat=True))
        Allocation.objects.filter(reservation_id__in=moved).delete()
        Reservation.objects.filter(pk__in=moved).update(state="queued", state_reason=WAITING, starts_at=None,
                                                        ends_at=None, region=None, scheduled_at=None,
                                                        released_at=None, preempted_by=None)
        Operation.objects.filter(reservation_id__in=moved).update(state=OperationState.PENDING, progress=0)
    return len(moved)


def release_finished(hold_s: float) -> int:
    """End what the bench's queue got placed ``hold_s`` ago (and whatever was evicted): capacity comes back."""
    from django.db import transaction
    from django.utils import timezone

    from provisioning.models import Allocation, Reservation

    now = timezone.now()
    with transaction.atomic():
        # Locked first, as the release service locks its reservation: an eviction the loop commits
        # meanwhile locks the victim and then its allocations, and the other order would deadlock.
        done = list(Reservation.objects.select_for_update().filter(name__startswith=QUEUE_PREFIX).filter(
            state__in=("scheduled", "provisioning", "active"), scheduled_at__lte=now - timedelta(seconds=hold_s),
        ).order_by("pk").values_list("pk", flat=True))
        evicted = list(Reservation.objects.select_for_update().filter(name__startswith=QUEUE_PREFIX,
                                                                      state="releasing")
                       .order_by("pk").values_list("pk", flat=True))
        Allocation.objects.filter(reservation_id__in=done, starts_at__gte=now).delete()
        Allocation.objects.filter(reservation_id__in=done, ends_at__gt=now).update(ends_at=now)
        Reservation.objects.filter(pk__in=done + evicted).update(state="released", released_at=now,
                                                                 state_changed_at=now)
    return len(done)


def archive_after_s() -> float:
    from django.conf import settings

    return settings.MERIDIAN_ALLOCATION_ARCHIVE_AFTER.total_seconds()


def queued_count() -> int:
    from provisioning.models import Reservation

    return Reservation.objects.filter(state="queued").count()


_memory = []


def loop_memory():
    """What the scheduler loop keeps between cycles (run_scheduler keeps one too)."""
    from provisioning.scheduling.scheduler import LoopMemory

    if not _memory:
        _memory.append(LoopMemory.for_loop())
    return _memory[0]


def new_leader() -> float:
    """A fresh memory primed as run_scheduler primes it when it starts leading; the milliseconds it took."""
    from provisioning.scheduling.scheduler import LoopMemory

    _memory[:] = [LoopMemory.for_loop()]
    started = time.perf_counter()
    _memory[0].prime()
    return (time.perf_counter() - started) * 1000


def rank_afresh() -> None:
    """
    The next cycle ranks the whole queue: a level's cycles each start from the same state, and a
    cut-short cycle's ranking, kept by the loop for the cycles after it, would skip what was put back.
    """
    loop_memory().kept_ranking = None


def timed_cycle():
    from provisioning.scheduling.scheduler import run_cycle

    started = time.perf_counter()
    report = run_cycle(memory=loop_memory())
    return (time.perf_counter() - started) * 1000, report


def summary(values: list[float]) -> dict:
    return {"p50": round(percentile(values, 50), 1), "p99": round(percentile(values, 99), 1),
            "max": round(max(values), 1), "n": len(values)}


# Functions timed (calls, total) in an instrumented cycle: (module, attribute) as run_cycle reaches them.
TIMED = [
    ("provisioning.scheduling.team_record", "team_inputs_many"),
    ("provisioning.scheduling.scheduler", "rank"),
    ("provisioning.scheduling.fleet_shape", "window_allocations"),
    ("provisioning.scheduling.kept_capacity", "window_allocations"),
    ("provisioning.scheduling.change_feed", "_read"),
    ("provisioning.scheduling.kept_capacity", "blocked_now"),
    ("provisioning.scheduling.scheduler", "plan"),
    ("provisioning.scheduling.scheduler", "_owners_over_quota"),
    ("provisioning.scheduling.scheduler", "reservation_schedule_many"),
    ("provisioning.scheduling.scheduler", "reservation_schedule"),
    ("provisioning.scheduling.scheduler", "_note_waiting"),
    ("provisioning.services", "reservation_evict"),
    ("provisioning.services", "allocation_bind_many"),
    ("provisioning.services", "allocation_bind"),
    ("provisioning.scheduling.scheduler", "nodes_held_back"),
    ("provisioning.services", "reservation_transition"),
    ("provisioning.services", "audit_record_many"),
    ("provisioning.services", "audit_record"),
    ("provisioning.services", "update_rows"),
    ("provisioning.allocations", "copy_rows"),
    ("provisioning.lifecycle.dispatch", "provision_when_due"),
    ("provisioning.admission", "quota_suspects"),
]


def instrumented_cycle() -> tuple[float, object, dict]:
    """
    A cycle with a timer around the functions in TIMED and a counter on every query (a clock
    read per call: the overhead is small next to what it measures). Queries and database time are
    attributed to the phases of ``timings_ms`` by when they ran.
    """
    import importlib

    from django.db import connection

    totals: dict[str, list] = {}
    patched = []

    def timer(name, fn):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                entry = totals.setdefault(name, [0, 0.0])
                entry[0] += 1
                entry[1] += time.perf_counter() - t
        return timed

    for module_name, attribute in TIMED:
        module = importlib.import_module(module_name)
        original = getattr(module, attribute)
        patched.append((module, attribute, original))
        setattr(module, attribute, timer(f"{module_name.split('.')[-1]}.{attribute}", original))
    queries: list[tuple[float, float]] = []
    slowest: list[tuple[float, str]] = []

    def spy(execute, sql, params, many, context):
        t = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            queries.append((t - origin, time.perf_counter() - t))
            slowest.append((time.perf_counter() - t, sql[:110]))

    pauses: list[float] = []
    gc_started = [0.0]

    def gc_clock(phase, info):
        if phase == "start":
            gc_started[0] = time.perf_counter()
        else:
            pauses.append(time.perf_counter() - gc_started[0])

    gc.callbacks.append(gc_clock)
    try:
        origin = time.perf_counter()
        with connection.execute_wrapper(spy):
            ms, report = timed_cycle()
    finally:
        gc.callbacks.remove(gc_clock)
        for module, attribute, original in patched:
            setattr(module, attribute, original)
    phases, edge = {}, 0.0
    for name, phase_ms in report.timings_ms.items():
        lo, edge = edge, edge + phase_ms / 1000
        inside = [d for t, d in queries if lo <= t < edge]
        phases[name] = {"ms": phase_ms, "queries": len(inside), "db_ms": round(sum(inside) * 1000, 1)}
    functions = {name: {"calls": calls, "total_ms": round(total * 1000, 1),
                        "ms_per_call": round(total * 1000 / calls, 3)}
                 for name, (calls, total) in sorted(totals.items(), key=lambda kv: -kv[1][1])}
    attempts = report.placed + report.conflicts + report.over_quota
    slowest.sort(reverse=True)
    detail = {"phases": phases, "functions": functions, "queries": len(queries),
              "slowest_queries": [(round(d * 1000, 1), sql) for d, sql in slowest[:6]],
              "gc_pauses": len(pauses), "gc_ms": round(sum(pauses) * 1000, 1),
              "db_ms": round(sum(d for _, d in queries) * 1000, 1),
              "apply_queries_per_attempt": round(phases.get("apply", {}).get("queries", 0) / max(attempts, 1), 1)}
    return ms, report, detail


def load_and_rank_split() -> dict:
    """
    The queue load alone (the loop's mirror of it: cold, then warm, when it reads only the ids)
    and ranking alone (records + scores): the "rank" lap holds both.
    """
    from django.utils import timezone

    from provisioning.scheduling.scheduler import QueueMirror, rank_queue
    from provisioning.services import weights

    mirror = QueueMirror()
    started = time.perf_counter()
    queued = mirror.queued()
    cold_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    mirror.queued()
    warm_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    rank_queue(queued, mirror.owners, timezone.now(), weights())
    return {"queue_load_ms": round(cold_ms, 1), "queue_load_warm_ms": round(warm_ms, 1),
            "rank_queue_ms": round((time.perf_counter() - started) * 1000, 1)}


def profile_cycle(top: int = int(os.environ.get("BENCH_PROFILE_TOP", "16"))) -> list[str]:
    from provisioning.scheduling.scheduler import run_cycle

    profiler = cProfile.Profile()
    profiler.enable()
    run_cycle(memory=loop_memory())
    profiler.disable()
    stats = pstats.Stats(profiler, stream=io.StringIO())
    rows = []
    for (path, line, name), (_, calls, _, cumulative, _) in stats.stats.items():
        if str(REPO) in path and "/.venv/" not in path and "/bench/" not in path:
            rows.append((cumulative, calls, f"{os.path.relpath(path, REPO)}:{line}({name})"))
    rows.sort(reverse=True)
    lines = [f"{cum * 1000:9.1f} ms {calls:7d} calls  {where}" for cum, calls, where in rows[:top]]
    own = sorted(((tottime, calls, f"{os.path.relpath(path, REPO)}:{line}({name})")
                  for (path, line, name), (_, calls, tottime, _, _) in stats.stats.items()), reverse=True)
    lines += [f"{t * 1000:9.1f} ms {calls:7d} calls  (own time) {where}" for t, calls, where in own[:top // 2]]
    print("    cProfile of one more cycle (cumulative in project code, then own time anywhere; profiling slows it):")
    for line in lines:
        print("      " + line)
    return lines


def at_fill(world: World, fill: int, rng: random.Random) -> dict:
    """
    Cycles from one state: the fill and a full queue. The first cycle writes every waiting reason;
    later ones start with the reasons the cycle before wrote (the placed ones put back).
    """
    reset()
    world.queue_ids.clear()
    held = prefill(world, fill, rng)
    enqueue(world, QUEUE, rng)
    analyze()
    split = load_and_rank_split()
    split["prime_ms"] = round(new_leader(), 1)
    print(f"  {fill:3d} % full ({held} GPUs held), {QUEUE} queued; outside a cycle: {split}")
    started = time.perf_counter()
    cycles, reports, detail = [], [], {}
    while True:
        last = len(cycles) + 1 >= CYCLES or (
            len(cycles) >= 1 and time.perf_counter() - started + 2 * cycles[-1] / 1000 > FILL_BUDGET_S)
        if cycles:
            requeue(world)
            rank_afresh()
        if last:
            ms, report, detail = instrumented_cycle()
        else:
            ms, report = timed_cycle()
        cycles.append(ms)
        reports.append(report)
        print(f"        cycle {ms:8.1f} ms  placed {report.placed:5d}  conflicts {report.conflicts}  "
              f"over quota {report.over_quota}  waiting {report.waiting}  timings {report.timings_ms}")
        if last:
            break
    phases = {name: round(percentile([r.timings_ms.get(name, 0.0) for r in reports], 50), 1)
              for name in reports[0].timings_ms}
    placed = [r.placed for r in reports]
    # The first cycle of a level is a new leader's first (its memory primed, its budget's
    # estimates not yet learnt); the others are what a running loop does. The target is held to all.
    result = {"gpus_held": held, "queued": reports[0].queued, "cycle_ms": summary(cycles),
              "first_cycle_ms": round(cycles[0], 1), "warm_cycle_ms": summary(cycles[1:]) if len(cycles) > 1 else {},
              "timings_ms_p50": phases,
              "placed_per_cycle": round(sum(placed) / len(placed)),
              "conflicts_per_cycle": round(sum(r.conflicts for r in reports) / len(reports)),
              "placements_per_s_in_cycle": round(sum(placed) / (sum(cycles) / 1000), 1), **split,
              "instrumented": detail}
    print(f"  {fill:3d} %: cycle p50 {result['cycle_ms']['p50']} ms, p99 {result['cycle_ms']['p99']} ms over "
          f"{len(cycles)} (target < {TARGET_CYCLE_P99_MS:.0f}); first {result['first_cycle_ms']} ms, then "
          f"p50/p99 {result['warm_cycle_ms'].get('p50')}/{result['warm_cycle_ms'].get('p99')} ms; phases p50 {phases}, "
          f"{result['placed_per_cycle']} placed per cycle")
    print(f"    instrumented cycle: {detail['queries']} queries, {detail['db_ms']} ms in the database, "
          f"{detail['gc_ms']} ms in {detail['gc_pauses']} garbage collections, "
          f"{detail['apply_queries_per_attempt']} queries per placement attempt in apply")
    print(f"      phases: {json.dumps(detail['phases'])}")
    for name, f in list(detail["functions"].items())[:16]:
        print(f"      {name:40s} {f['calls']:6d} calls {f['total_ms']:9.1f} ms  {f['ms_per_call']:7.3f} ms/call")
    for ms, sql in detail["slowest_queries"]:
        print(f"      {ms:7.1f} ms  {sql}")
    if PROFILE:
        requeue(world)
        rank_afresh()
        result["profile_top"] = profile_cycle()
    return result


def housekeeper(world: World, seed: int, stop, released, rounds) -> None:
    """
    What the rest of a deployment does beside the loop, in a process of its own: releases what was
    placed (workers), new requests to keep the queue full (the API), archiving (the lifecycle tick,
    every 5 s) and vacuuming (autovacuum tuned for a hot table, every BENCH_VACUUM_SECONDS).
    """
    from django.db import OperationalError, connections

    connections.close_all()  # the parent's connection is the parent's
    rng = random.Random(seed)
    upkeep = Upkeep(VACUUM_S)
    while not stop.is_set():
        try:
            done = release_finished(HOLD_S)
        except OperationalError:  # a deadlock with an eviction the loop commits: a worker would retry
            done = 0
        enqueue(world, QUEUE - queued_count(), rng)
        upkeep.tick()
        with released.get_lock():
            released.value += done
        with rounds.get_lock():
            rounds.value += 1
        stop.wait(0.05)
    connections.close_all()


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine since boot (Linux /proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [float(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def rss_mib() -> float:
    """This process's resident memory now (Linux), in MiB."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def steady_run(world: World, rng: random.Random) -> dict:
    import multiprocessing

    from django.db import connections

    reset()
    world.queue_ids.clear()
    held = prefill(world, STEADY_FILL, rng)
    enqueue(world, QUEUE, rng)
    analyze()
    new_leader()
    # Warm-up, not counted: the first cycle fills the free capacity at once and writes every waiting reason.
    warm_ms, warm = timed_cycle()
    print(f"  steady run from {STEADY_FILL} % full ({held} GPUs held): warm-up cycle {warm_ms:.0f} ms, "
          f"placed {warm.placed}; releases, new requests, archiving and vacuum run in a process of their own")
    cycles, placed, conflicts, afresh, slowest = [], 0, 0, 0, []
    fork = multiprocessing.get_context("fork")
    stop, released, rounds = fork.Event(), fork.Value("l", 0), fork.Value("l", 0)
    connections.close_all()  # not shared with the child
    helper = fork.Process(target=housekeeper, args=(world, rng.randrange(2**32), stop, released, rounds), daemon=True)
    helper.start()
    rss = [rss_mib()]
    cpu_before, machine_before = resource.getrusage(resource.RUSAGE_SELF), machine_cpu()
    started = time.perf_counter()
    deadline = started + SECONDS
    next_print = started + 10
    try:
        # A cycle is not started when less than half of the last one's time is left (so the run ends near SECONDS).
        while time.perf_counter() + (cycles[-1] / 2000 if cycles else 0.0) < deadline:
            ms, report = timed_cycle()
            cycles.append(ms)
            slowest = sorted([*slowest, (ms, report.placed, report.ranked_afresh, report.timings_ms)],
                             key=lambda t: -t[0])[:3]
            placed += report.placed
            conflicts += report.conflicts
            afresh += report.ranked_afresh
            if not report.placed and not report.cut_short:
                time.sleep(0.05)  # nothing released yet: the loop would wait for its interval
            if time.perf_counter() >= next_print:
                next_print += 10
                elapsed = time.perf_counter() - started
                rss.append(rss_mib())
                print(f"    {elapsed:5.1f} s: {len(cycles)} cycles, {placed} placed ({placed / elapsed:.0f}/s), "
                      f"last cycle {ms:.0f} ms {report.timings_ms}, queue {report.queued}, "
                      f"scheduler RSS {rss[-1]:.0f} MiB")
    finally:
        wall = time.perf_counter() - started
        stop.set()
        helper.join(30)
    rss.append(rss_mib())
    cpu_after, machine_after = resource.getrusage(resource.RUSAGE_SELF), machine_cpu()
    scheduler_cpu = (cpu_after.ru_utime + cpu_after.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime) / wall
    busy = (machine_after[0] - machine_before[0]) / (machine_after[1] - machine_before[1])
    in_cycles = sum(cycles) / 1000
    result = {
        "seconds": round(wall, 1), "fill_pct": STEADY_FILL, "gpus_held_by_fill": held, "queue": QUEUE,
        "hold_s": HOLD_S, "vacuum_every_s": VACUUM_S, "archive_after_s": archive_after_s(), "cycles": len(cycles),
        "cycles_ranked_afresh": afresh, "placed": placed,
        "conflicts": conflicts, "released": released.value, "housekeeping_rounds": rounds.value,
        "placements_per_s": round(placed / in_cycles, 1) if in_cycles else 0.0,
        "placements_per_s_wall": round(placed / wall, 1),
        "cycle_ms": summary(cycles) if cycles else {},
        "scheduler_rss_mib": {"start": round(rss[0]), "max": round(max(rss)), "end": round(rss[-1])},
        # Cores: the loop's process, and the whole machine (PostgreSQL, the releasing process, anything else).
        "scheduler_cores": round(scheduler_cpu, 2), "machine_cores_busy": round(busy * (os.cpu_count() or 1), 2),
        "slowest_cycles": [{"ms": round(ms), "placed": n, "ranked_afresh": fresh, "timings_ms": t}
                           for ms, n, fresh, t in slowest],
        "target_placements_per_s": TARGET_PLACEMENTS_PER_S, "target_cycle_p99_ms": TARGET_CYCLE_P99_MS,
    }
    print(f"  steady {SECONDS:.0f} s at {STEADY_FILL} % + queue {QUEUE}: {placed} placed in {len(cycles)} cycles, "
          f"{result['placements_per_s_wall']}/s of wall time (target >= {TARGET_PLACEMENTS_PER_S:.0f}; "
          f"{result['placements_per_s']}/s of scheduler time), cycle p99 {result['cycle_ms'].get('p99')} ms, "
          f"{afresh} of {len(cycles)} cycles ranked the queue afresh; scheduler RSS "
          f"{result['scheduler_rss_mib']['start']} -> {result['scheduler_rss_mib']['max']} MiB; the loop used "
          f"{result['scheduler_cores']} of a core, the machine {result['machine_cores_busy']} of "
          f"{os.cpu_count()} cores")
    for cycle in result["slowest_cycles"]:
        print(f"    a slowest cycle: {cycle}")
    return result


def commit() -> str:
    """The commit measured (with "+" when the working tree differs from it: others may be editing)."""
    import subprocess

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True)
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def main() -> None:
    import logging

    setup_django(DB)
    logging.getLogger("provisioning").setLevel(logging.WARNING)
    rng = random.Random(20250602)
    world = build_world()
    from django.conf import settings

    print(f"queue {QUEUE}, {CYCLES} cycles per fill level; steady run {SECONDS:.0f} s; cycle budget "
          f"{settings.MERIDIAN_SCHEDULER_CYCLE_BUDGET_MS:.0f} ms, at most "
          f"{settings.MERIDIAN_SCHEDULER_MAX_PLACEMENTS} placements a cycle, placing share "
          f"{settings.MERIDIAN_SCHEDULER_PLACING_SHARE}")
    fills = {}
    for fill in FILLS:
        fills[f"{fill}%"] = at_fill(world, fill, rng)
    steady = steady_run(world, rng) if SECONDS > 0 else {}
    worst_p99 = max((f["cycle_ms"]["p99"] for f in fills.values()), default=0.0)
    result = {
        "bench": "scheduler_cycle", "commit": commit(), "regions": REGIONS, "nodes": 1280 * FABRICS * REGIONS,
        "gpus": 10240 * FABRICS * REGIONS, "seed_s": round(world.seeded_s, 1),
        "queue": QUEUE,
        "queue_depth": settings.MERIDIAN_SCHEDULER_QUEUE_DEPTH, "cycles_per_fill": CYCLES,
        "cycle_budget_ms": settings.MERIDIAN_SCHEDULER_CYCLE_BUDGET_MS,
        "placing_share": settings.MERIDIAN_SCHEDULER_PLACING_SHARE,
        "max_placements": settings.MERIDIAN_SCHEDULER_MAX_PLACEMENTS,
        "cpus": os.cpu_count(), "fills": {k: {key: v[key] for key in v if key != "profile_top"} for k, v in
                                          fills.items()},
        "cycle_p99_ms_worst": worst_p99, "target_cycle_p99_ms": TARGET_CYCLE_P99_MS,
        "cycle_p99_ok": worst_p99 < TARGET_CYCLE_P99_MS,
        "steady": steady,
        "placements_per_s": steady.get("placements_per_s_wall"), "target_placements_per_s": TARGET_PLACEMENTS_PER_S,
        "placements_per_s_ok": bool(steady) and steady["placements_per_s_wall"] >= TARGET_PLACEMENTS_PER_S,
        "steady_cycle_p99_ok": bool(steady) and steady["cycle_ms"].get("p99", 1e9) < TARGET_CYCLE_P99_MS,
    }
    print("RESULT " + json.dumps(result))
    drop_database(DB)


if __name__ == "__main__":
    main()
