"""
The project's Celery app, for a worker whose database connection is terminated once -- with
``pg_terminate_backend`` from another connection -- right before the outcome of the step named by
``MERIDIAN_TEST_BLIP_STEP`` is recorded: the moment a database blip once left an operation stuck
at that step (tests.test_database_blips). Start it with ``celery -A tests.blip_worker worker``.
"""

import os

import psycopg
from celery.signals import worker_process_init

from config.celery import app

__all__ = ["app"]


@worker_process_init.connect
def _blip_once(**_):
    """In the pool child: wrap the step bookkeeping so that it meets a terminated connection once."""
    from django.db import connection

    from provisioning.lifecycle import runner

    step, recorded, done = os.environ["MERIDIAN_TEST_BLIP_STEP"], runner._steps_succeeded, []

    def blip(succeeded, **kwargs):
        if not done and any(run.name == step for _, run in succeeded):
            pid = connection.connection.info.backend_pid
            s = connection.settings_dict
            with psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"],
                                 dbname=s["NAME"], autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])  # waits until it is gone
            done.append(pid)
            print(f"blip: terminated backend {pid} before recording {step}", flush=True)
        return recorded(succeeded, **kwargs)

    runner._steps_succeeded = blip
