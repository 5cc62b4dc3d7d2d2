"""
High availability, with the real processes: a standby scheduler and a standby beat take over
when their leader is SIGKILLed, within two of their intervals, and nothing is placed or sent twice.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from django_celery_beat.models import PeriodicTask, PeriodicTasks

from provisioning.models import Allocation, Reservation
from tests.processes import SentTasks, processes
from tests.provisioning.factories import make_reservation
from tests.provisioning.test_allocations import OVERLAPPING_PAIRS
from tests.world import small_fleet, vm_offering

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SCHEDULER_INTERVAL = 1.0
BEAT_POLL = 1.0


def wait_until(condition, *, timeout: float, what: str, processes=()):
    deadline = time.monotonic() + timeout
    while not condition():
        for process in processes:
            assert process.popen.poll() is None, f"{process.name} exited:\n{process.output()}"
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout} s"
        time.sleep(0.1)


def test_a_standby_scheduler_leads_within_two_intervals_and_nothing_is_placed_twice_or_lost(world):
    small_fleet(4)  # one shared host: 8 H100s for VMs
    queued = lambda n: [make_reservation(world, state="queued", offering=vm_offering()) for _ in range(n)]  # noqa: E731
    before = queued(3)
    scheduler = ("manage.py", "run_scheduler", "--interval", str(SCHEDULER_INTERVAL))
    with processes() as start:
        leader = start("scheduler-a", *scheduler)
        leader.wait_for("Leading the scheduler", timeout=90)
        standby = start("scheduler-b", *scheduler)
        standby.wait_for("Standing by", timeout=90)
        wait_until(lambda: not Reservation.objects.filter(pk__in=[r.pk for r in before], state="queued").exists(),
                   timeout=60, what="placing the first reservations", processes=[leader, standby])

        killed = leader.kill()
        after = queued(3)  # queued while no scheduler leads
        took_over = standby.wait_for("Leading the scheduler", timeout=30, after=killed) - killed
        assert took_over <= 2 * SCHEDULER_INTERVAL, f"the standby led {took_over:.2f} s after the leader died"
        mine = [r.pk for r in before + after]
        wait_until(lambda: not Reservation.objects.filter(pk__in=mine, state="queued").exists(),
                   timeout=60, what="placing the reservations queued during the failover", processes=[standby])

    # The world's two queued reservations and these six fill the host's 8 GPUs: one GPU each, no overlap.
    assert Reservation.objects.filter(pk__in=mine, state="scheduled").count() == 6
    assert Allocation.objects.filter(reservation_id__in=mine).count() == 6
    assert Allocation.objects.filter(reservation__state="scheduled").values("gpu_id").distinct().count() == \
        Allocation.objects.filter(reservation__state="scheduled").count()
    with connection.cursor() as cursor:
        cursor.execute(OVERLAPPING_PAIRS)
        assert cursor.fetchone()[0] == 0


def test_a_standby_beat_takes_over_the_periodic_tasks_without_sending_any_twice():
    beat = ("-m", "celery", "-A", "config", "beat", "--loglevel", "INFO")
    with processes(MERIDIAN_BEAT_STANDBY_SECONDS=str(BEAT_POLL)) as start, SentTasks(start.queue) as sent_tasks:
        leader = start("beat-a", *beat)
        leader.wait_for("Leading beat", timeout=90)
        standby = start("beat-b", *beat)
        standby.wait_for("Standing by", timeout=90)
        # An hourly task last run an hour ago: due now. The leader sends it once; a new leader must
        # read that it ran (a beat syncing its schedule every few minutes would send it again).
        hourly = PeriodicTask.objects.get(name="tenants.hp_revoke_due")
        PeriodicTask.objects.filter(pk=hourly.pk).update(last_run_at=timezone.now() - timedelta(hours=1, minutes=1))
        PeriodicTasks.update_changed()
        # Sent, not only claimed: a kill between the claim and the send would lose that run (at most once).
        wait_until(lambda: "tenants.hp_revoke_due" in sent_tasks.names,
                   timeout=30, what="the leader sending the hourly task", processes=[leader, standby])

        killed = leader.kill()
        killed_at = timezone.now()
        took_over = standby.wait_for("Leading beat", timeout=30, after=killed) - killed
        assert took_over <= 2 * BEAT_POLL, f"the standby beat led {took_over:.2f} s after the leader died"
        watch = PeriodicTask.objects.get(name="cloud.heartbeats_watch")
        wait_until(lambda: PeriodicTask.objects.get(pk=watch.pk).last_run_at > killed_at + timedelta(seconds=2),
                   timeout=30, what="the standby sending the every-second watchdog", processes=[standby])
        time.sleep(1.5)
        standby.stop()
    names = sent_tasks.names

    assert names.count("tenants.hp_revoke_due") == 1
    assert PeriodicTask.objects.get(pk=hourly.pk).total_run_count == hourly.total_run_count + 1
    # Every send was claimed first in the database: never more messages than claims, and a claim
    # without its message only when a leader died between the two.
    watch.refresh_from_db()
    sent = names.count("cloud.heartbeats_watch")
    assert watch.total_run_count - 1 <= sent <= watch.total_run_count
    assert sent >= 3
