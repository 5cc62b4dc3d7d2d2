"""
Failover of the singleton loops, with the real processes on PostgreSQL and RabbitMQ: a leader and
a standby of the scheduler (``manage.py run_scheduler``) and of beat (``celery beat`` with
``config.beat.LeaderScheduler``); the leader is SIGKILLed, as a machine losing power would be.

Per trial (BENCH_TRIALS, 5, of each):
- scheduler: 40 one-GPU VM reservations queued, 20 before the kill and 20 while no one leads; how
  long until the standby leads, until it places the first reservation queued after the kill, and
  until every one is placed; then every reservation holds exactly its GPU and no two allocations
  overlap (double placements: 0);
- beat: an hourly task made due and sent once by the leader before the kill; how long until the
  standby leads and until it sends the every-second watchdog again; the hourly task sent once in
  all (double sends: 0).

The goal (issue 42): the standby leads within two of its intervals (scheduler 0.5 s, beat 1 s).

    .venv/bin/python bench/failover.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import drop_database, setup_django  # noqa: E402

DATABASE = "meridian_bench_failover"
TRIALS = int(os.environ.get("BENCH_TRIALS", "5"))
QUEUED = 20


def wait(condition, timeout: float, what: str, poll: float = 0.01) -> float:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"failover bench: {what} did not happen in {timeout} s")
        time.sleep(poll)
    return time.monotonic()


def seed():
    from cloud.catalogue import load_gpu_catalogue
    from cloud.fleet import FleetSpec, build_fleet
    from cloud.models import GPUModel, Offering
    from provisioning.drivers.simulated_devices import trust_simulated_fleet
    from tenants.models import Tenant

    load_gpu_catalogue(GPUModel)
    build_fleet(FleetSpec(regions=1, nodes_per_fabric=32, spare_ratio=0.0, shared_ratio=0.25))
    trust_simulated_fleet()
    offering = Offering.objects.create(slug="bench-vm-h100x1", name="VM 1x H100", kind="vm",
                                       gpu_model=GPUModel.objects.get(slug="h100-80gb-sxm"), gpus_per_unit=1,
                                       price_per_gpu_hour="2.49")
    return Tenant.objects.create(name="Failover", slug="failover"), offering


def queue(tenant, offering, n: int) -> list:
    from provisioning.models import Reservation

    return [Reservation.objects.create(tenant=tenant, name=f"failover-{i}", offering=offering,
                                       gpu_model=offering.gpu_model, units=1, gpus=1, regions=["us-east-1"],
                                       duration=timedelta(hours=1), state="queued").pk for i in range(n)]


def clear() -> None:
    from provisioning.models import Allocation, Operation, Reservation

    Allocation.objects.all().delete()
    Operation.objects.all().delete()
    Reservation.objects.all().delete()


def scheduler_trial(start, tenant, offering, interval: float) -> dict:
    from django.db import connection

    from provisioning.models import Allocation, Reservation

    argv = ("manage.py", "run_scheduler", "--interval", str(interval))
    before = queue(tenant, offering, QUEUED)
    leader = start("scheduler-a", *argv)
    leader.wait_for("Leading the scheduler", timeout=120)
    standby = start("scheduler-b", *argv)
    standby.wait_for("Standing by", timeout=120)
    wait(lambda: not Reservation.objects.filter(pk__in=before, state="queued").exists(), 60, "the first placements")
    killed = leader.kill()
    after = queue(tenant, offering, QUEUED)
    led = standby.wait_for("Leading the scheduler", timeout=60, after=killed)
    placed = wait(lambda: Reservation.objects.filter(pk__in=after).exclude(state="queued").exists(), 60,
                  "a placement after the kill")
    done = wait(lambda: not Reservation.objects.filter(pk__in=after, state="queued").exists(), 60,
                "every placement after the kill")
    standby.stop()
    mine = before + after
    with connection.cursor() as cursor:
        cursor.execute("""SELECT count(*) FROM provisioning_allocation a JOIN provisioning_allocation b
                          ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.starts_at < b.ends_at AND b.starts_at < a.ends_at
                          AND a.mem_lo < b.mem_hi AND b.mem_lo < a.mem_hi""")
        overlaps = cursor.fetchone()[0]
    doubles = overlaps + sum(1 for pk in mine if Allocation.objects.filter(reservation_id=pk).count() != 1)
    clear()
    return {"lead": led - killed, "first": placed - killed, "all": done - killed, "doubles": doubles}


def beat_trial(start, poll: float) -> dict:
    from django.utils import timezone
    from django_celery_beat.models import PeriodicTask, PeriodicTasks

    from tests.processes import SentTasks

    argv = ("-m", "celery", "-A", "config", "beat", "--loglevel", "INFO")
    with SentTasks(start.queue) as sent:
        leader = start("beat-a", *argv)
        leader.wait_for("Leading beat", timeout=120)
        standby = start("beat-b", *argv)
        standby.wait_for("Standing by", timeout=120)
        hourly = PeriodicTask.objects.get(name="tenants.hp_revoke_due")
        PeriodicTask.objects.filter(pk=hourly.pk).update(last_run_at=timezone.now() - timedelta(hours=2))
        PeriodicTasks.update_changed()
        # Sent, not only claimed: a kill between the claim and the send would lose that run (at most once).
        wait(lambda: "tenants.hp_revoke_due" in sent.names, 30, "the hourly task's send")
        killed, killed_at = leader.kill(), timezone.now()
        led = standby.wait_for("Leading beat", timeout=60, after=killed)
        watch = PeriodicTask.objects.get(name="cloud.heartbeats_watch")
        resumed = wait(lambda: PeriodicTask.objects.get(pk=watch.pk).last_run_at > killed_at, 60,
                       "the watchdog's send after the kill")
        time.sleep(2)
        standby.stop()
    return {"lead": led - killed, "first": resumed - killed, "doubles": sent.names.count("tenants.hp_revoke_due") - 1,
            "claimed": PeriodicTask.objects.get(pk=hourly.pk).total_run_count - hourly.total_run_count}


def line(name: str, values: list[float]) -> str:
    return (f"{name}: median {statistics.median(values):.2f} s, max {max(values):.2f} s "
            f"({', '.join(f'{v:.2f}' for v in values)})")


def main() -> None:
    setup_django(DATABASE)
    from django.conf import settings

    from tests.processes import processes

    tenant, offering = seed()
    interval, poll = settings.MERIDIAN_SCHEDULER_INTERVAL, settings.MERIDIAN_BEAT_STANDBY_POLL
    print(f"failover: {TRIALS} trials each; scheduler interval {interval} s, beat standby poll {poll} s", flush=True)
    schedulers, beats = [], []
    for trial in range(TRIALS):
        with processes() as start:
            schedulers.append(scheduler_trial(start, tenant, offering, interval))
        with processes() as start:
            beats.append(beat_trial(start, poll))
        print(f"  trial {trial + 1}: scheduler led after {schedulers[-1]['lead']:.2f} s, "
              f"beat after {beats[-1]['lead']:.2f} s", flush=True)
    print(line("scheduler: standby leads after the kill", [r["lead"] for r in schedulers]))
    print(line("scheduler: first reservation queued after the kill placed", [r["first"] for r in schedulers]))
    print(line(f"scheduler: all {QUEUED} queued after the kill placed", [r["all"] for r in schedulers]))
    print(line("beat: standby leads after the kill", [r["lead"] for r in beats]))
    print(line("beat: every-second watchdog sent again", [r["first"] for r in beats]))
    doubles = sum(r["doubles"] for r in schedulers) + sum(r["doubles"] for r in beats)
    worst_s, worst_b = max(r["lead"] for r in schedulers), max(r["lead"] for r in beats)
    print(f"RESULT scheduler_takeover_max_s={worst_s:.2f} (goal <= {2 * interval}) "
          f"beat_takeover_max_s={worst_b:.2f} (goal <= {2 * poll}) doubles={doubles} "
          f"hourly_task_claims={[r['claimed'] for r in beats]}")
    drop_database(DATABASE)


if __name__ == "__main__":
    main()
