"""
The control plane's own state, for the readiness check, /metrics and the staff console: can this
process reach its database, broker and cache, are its migrations applied, and are the singleton
loops alive -- the scheduler's leader cycling, beat sending, workers answering, queues draining.

``ready()`` is what a load balancer asks every few seconds: the dependencies only, each bounded by
a short timeout. ``read()`` adds the loops, which cost a broker round trip and a worker ping.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import datetime

from celery import current_app
from django.conf import settings
from django.core.cache import cache
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Max
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django_celery_beat.models import PeriodicTask

from provisioning.scheduling.scheduler import last_cycle

BROKER_TIMEOUT_S = 2.0
_migrations_applied = False  # once true in a process it stays true: nothing unapplies them under it


@dataclass
class Check:
    ok: bool
    ms: float
    error: str = ""


@dataclass
class ControlPlaneStatus:
    checks: dict[str, Check] = field(default_factory=dict)
    migrations_pending: int = 0
    scheduler_leader: str | None = None
    scheduler_last_cycle_age_s: float | None = None
    beat_last_run_age_s: float | None = None
    workers: list[str] = field(default_factory=list)
    queue_depths: dict[str, int] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return all(check.ok for check in self.checks.values())

    def as_dict(self) -> dict:
        return {"status": "ready" if self.ready else "not_ready", **asdict(self)}


def _timed(probe) -> Check:
    began = time.perf_counter()
    try:
        probe()
    except Exception as exc:  # any failure is the answer: the dependency is not usable
        return Check(False, round((time.perf_counter() - began) * 1000, 1), f"{type(exc).__name__}: {exc}"[:300])
    return Check(True, round((time.perf_counter() - began) * 1000, 1))


def _database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _cache() -> None:
    key = "meridian:health:probe"
    cache.set(key, "ok", 30)
    if cache.get(key) != "ok":
        raise RuntimeError("the cache did not return what was just stored")


def _broker() -> None:
    with current_app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)


def pending_migrations() -> int:
    global _migrations_applied
    if _migrations_applied:
        return 0
    executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
    pending = len(executor.migration_plan(executor.loader.graph.leaf_nodes()))
    _migrations_applied = pending == 0
    return pending


def ready() -> ControlPlaneStatus:
    """Whether this process can serve: database, broker, cache, and the schema it was built for."""
    status = ControlPlaneStatus()
    status.checks["database"] = _timed(_database)
    status.checks["cache"] = _timed(_cache)
    status.checks["broker"] = _timed(_broker)

    def migrations():
        status.migrations_pending = pending_migrations()
        if status.migrations_pending:
            raise RuntimeError(f"{status.migrations_pending} migrations not applied: run `manage.py migrate`")

    status.checks["migrations"] = _timed(migrations) if status.checks["database"].ok else Check(
        False, 0.0, "the database is unreachable")
    return status


def _age(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else round(max((now - moment).total_seconds(), 0.0), 3)


def queue_depths() -> dict[str, int]:
    """Messages waiting in each queue the workers consume (the broker's count, ready ones only)."""
    depths = {}
    with current_app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)
        channel = conn.default_channel
        for queue in (settings.CELERY_TASK_DEFAULT_QUEUE,):
            _, messages, _ = channel.queue_declare(queue=queue, passive=True)
            depths[queue] = messages
    return depths


def read(*, ping_timeout: float = 0.5) -> ControlPlaneStatus:
    """``ready()`` plus the loops: scheduler leader and its last cycle, beat's last send, workers, queues."""
    status = ready()
    now = timezone.now()
    cycle = last_cycle() or {}
    status.scheduler_leader = cycle.get("leader") or None
    status.scheduler_last_cycle_age_s = _age(parse_datetime(cycle["finished_at"]) if cycle.get("finished_at")
                                             else None, now)
    if status.checks["database"].ok:
        last_sent = PeriodicTask.objects.filter(enabled=True).aggregate(last=Max("last_run_at"))["last"]
        status.beat_last_run_age_s = _age(last_sent, now)
    if status.checks["broker"].ok:
        try:
            status.queue_depths = queue_depths()
        except Exception:  # a queue not declared yet (no worker started): nothing waiting in it
            status.queue_depths = {}
        try:
            replies = current_app.control.ping(timeout=ping_timeout) or []
        except Exception:  # the broker went away since its check: no worker answered
            replies = []
        status.workers = sorted(name for reply in replies for name in reply)
    return status
