"""Shared set-up of the benchmarks: a scratch PostgreSQL database, migrated, for one run."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BASE_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/meridian")


def scratch_database(name: str) -> str:
    """Create (or recreate) database ``name`` beside DATABASE_URL's and point Django at it."""
    import psycopg

    parts = urlsplit(BASE_URL)
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = urlunsplit(parts._replace(path=f"/{name}"))
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("MERIDIAN_DATA_DIR", tempfile.mkdtemp(prefix="meridian-bench-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("MERIDIAN_SECURE_TRANSPORT", "0")
    # A deployment-like run (PostgreSQL) takes its keys from the environment, never from files.
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-secret-key-0123456789-0123456789-0123456789")
    os.environ.setdefault("MERIDIAN_ENCRYPTION_KEYS", "kJ0Qv1CSYVzQxUOq9tJ8Y2m6TqkJ7iAHF2h4b0QdVRk=")
    return url


def setup_django(database: str) -> str:
    url = scratch_database(database)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    return url


def drop_database(name: str) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    admin = urlunsplit(urlsplit(BASE_URL)._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def serve(port: int, log: Path | None = None):
    """
    gunicorn (2 workers x 4 threads) on 127.0.0.1:``port`` over the scratch database, once it
    answers /health/. The per-token rate limit is lifted: it is not what the benchmarks measure.
    """
    import subprocess
    import urllib.request

    env = dict(os.environ, MERIDIAN_API_RATE="100000000/min")
    server = subprocess.Popen(
        [str(REPO / ".venv/bin/gunicorn"), "config.wsgi:application", "--bind", f"127.0.0.1:{port}", "--workers", "2",
         "--threads", "4"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
        stderr=log.open("w") if log else subprocess.DEVNULL,
    )
    for _ in range(150):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health/", timeout=1)  # noqa: S310 -- loopback
            return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    sys.exit("gunicorn did not start")


def vacuum() -> None:
    """
    VACUUM ANALYZE the tables a bench's releases rewrite (allocations, reservations), as
    autovacuum tuned for hot tables would: releasing hundreds of reservations a second leaves
    their dead versions in the indexes the fast path and the scheduler read.
    """
    from django.db import connection

    from provisioning.models import Allocation, Reservation

    with connection.cursor() as cursor:
        for model in (Allocation, Reservation):
            cursor.execute(f"VACUUM ANALYZE {connection.ops.quote_name(model._meta.db_table)}")


class Upkeep:
    """
    What a deployment does beside a bench's load, called often from the bench's own loop: archives
    ended allocations every 5 s (the lifecycle tick's ``allocations_archive``, with the deployment's
    horizon) and vacuums the tables releases rewrite every ``vacuum_s`` (0: never), as autovacuum
    tuned for a hot table would.
    """

    def __init__(self, vacuum_s: float):
        self.vacuum_s = vacuum_s
        self.archived = self.vacuumed = time.perf_counter()

    def tick(self) -> None:
        from provisioning.allocations import allocations_archive

        if time.perf_counter() - self.archived >= 5:
            allocations_archive()
            self.archived = time.perf_counter()
        if self.vacuum_s and time.perf_counter() - self.vacuumed >= self.vacuum_s:
            vacuum()
            self.vacuumed = time.perf_counter()


def free_port() -> int:
    """A free TCP port on the loopback address, for a server the benchmark starts."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


class Inline:
    """
    The lifecycle's messages kept in this process and run in order, as the tests run them (with
    zero-latency simulated drivers: "instant drivers"); ``drain`` runs what is waiting.
    """

    def __init__(self):
        from provisioning import task_names
        from provisioning.lifecycle import dispatch as dispatching

        self.tasks: deque = deque()
        publish = task_names.send
        task_names.send = lambda name, args, **options: (self.tasks.append(("step", args))
                                                         if name == task_names.OPERATION_STEP
                                                         else publish(name, args, **options))
        dispatching.provision_when_due = lambda reservations: self.tasks.extend(("start", (str(r.pk),))
                                                                             for r in reservations)

    def drain(self) -> None:
        from provisioning.lifecycle import runner
        from provisioning.lifecycle import start as starting

        while self.tasks:
            what, args = self.tasks.popleft()
            if what == "start":
                starting.reservation_provision_start(*args)
            else:
                runner.operation_run_step(*args)

    def stop(self) -> None:
        pass
