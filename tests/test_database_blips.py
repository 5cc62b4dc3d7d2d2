"""
A database blip: the application's PostgreSQL connection is terminated (``pg_terminate_backend``
from another connection, as an operator or a failover does) while work is in flight.

- A worker step: a real Celery worker on RabbitMQ loses its connection right before it records
  the outcome of ``hand_over`` (the moment that once left an operation at ``hand_over`` until the
  stuck-operation sweep, 11 minutes later). The task is retried within seconds on a fresh
  connection -- the lifecycle tick (the sweep) does not run here -- and the reservation becomes
  active, its last step run twice, its hardware provisioned once.
- An API request: a create with an Idempotency-Key loses its connection after its reservation
  was written, just before the key is: a 503 with Retry-After and the API's error shape, nothing
  of it in the database, and the same request with the same key then creates it once.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from django.db import connection

from provisioning.lifecycle.steps import PIPELINES
from provisioning.models import Allocation, IdempotencyKey, Operation, Reservation, StepRun
from security.models import AuditEvent
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY
from tests.test_worker_faults import fleet, published, queue, wait_for, workers  # noqa: F401 -- fixtures

URL = "/api/v1/reservations/"
STEPS = [step.name for step in PIPELINES[("provision", "bare_metal")]]


def bare_metal(name: str) -> dict:
    return {"name": name, "offering": offering("bare_metal", 8).slug, "regions": ["us-east-1"],
            "duration_hours": 2, "ssh_public_key": SSH_KEY, "nodes": 1}


def terminate(pid: int) -> bool:
    """End backend ``pid`` from a connection of our own, and wait until it is gone."""
    s = connection.settings_dict
    with psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"], dbname=s["NAME"],
                         autocommit=True) as other:
        return other.execute("SELECT pg_terminate_backend(%s, 5000)", [pid]).fetchone()[0]


def backend_alive(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return bool(cursor.fetchone()[0])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_connection_is_terminated_retries_the_step_within_seconds_and_finishes(
        world, fleet, queue, published, workers):  # noqa: F811 -- fixtures
    worker = workers.start("a", {}, app="tests.blip_worker", env={"MERIDIAN_TEST_BLIP_STEP": "hand_over"})
    response = world.client("t1_member").post(URL, bare_metal("blip"), format="json")
    assert response.status_code == 201, response.json()
    pk = response.json()["id"]

    # No beat, no lifecycle tick here: only the task's own retry can finish it.
    wait_for(lambda: Reservation.objects.filter(pk=pk, state="active").exists(), "active reservation",
             workers=workers, timeout=90, must_live=[worker])
    log = worker.output()
    blips = [line for line in log.splitlines() if "blip: terminated backend" in line]
    assert len(blips) == 1, str(workers)
    killed = int(blips[0].split("terminated backend ")[1].split()[0])
    assert not backend_alive(killed)
    # Celery's own account: the task was retried after 2 s, not failed.
    assert "Retry in 2s" in log and "terminating connection due to administrator command" in log, str(workers)
    assert "raised unexpected" not in log, str(workers)

    operation = Operation.objects.get(reservation_id=pk, kind="provision")
    assert (operation.state, operation.step, operation.progress) == ("succeeded", "hand_over", 100)
    runs = list(StepRun.objects.filter(operation=operation).order_by("id").values_list("name", "attempt", "state",
                                                                                      "error"))
    assert [(name, attempt, state) for name, attempt, state, _ in runs] == [
        *[(name, 1, "succeeded") for name in STEPS[:-1]], ("hand_over", 1, "failed"), ("hand_over", 2, "succeeded")]
    assert "its database connection was" in runs[-2][3]
    assert Allocation.objects.filter(reservation_id=pk).count() == 8
    workers.stop()


@pytest.mark.django_db(transaction=True)
def test_a_create_whose_connection_is_terminated_answers_503_and_the_same_key_then_creates_it_once(
        world, fleet):  # noqa: F811 -- a fixture
    client, key, body = world.client("t1_member"), str(uuid.uuid4()), bare_metal("blip")
    events = AuditEvent.objects.count()
    written, killed = [], []

    def blip(execute, sql, params, many, context):
        """Terminate this request's connection right before the Idempotency-Key is stored."""
        written.append(sql)
        if not killed and sql.startswith(f'INSERT INTO "{IdempotencyKey._meta.db_table}"'):
            pid = context["connection"].connection.info.backend_pid
            assert terminate(pid)
            killed.append(pid)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(blip):
        response = client.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert killed, "the create never stored its key"
    # The reservation was written in that transaction before the connection went.
    assert any(f'INSERT INTO "{Reservation._meta.db_table}"' in sql for sql in written)

    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "2"
    assert response.json() == {"type": "server_error", "errors": [{
        "code": "database_unavailable", "attr": None,
        "detail": "The database was briefly unavailable and nothing was changed; send the request again in a few "
                  "seconds (a create with the same Idempotency-Key)."}]}
    assert not backend_alive(killed[0])
    # Nothing half-made: no reservation, allocation, operation, key or audit event of it.
    assert not Reservation.objects.filter(name="blip").exists()
    assert not Allocation.objects.exists() and not Operation.objects.filter(reservation__name="blip").exists()
    assert not IdempotencyKey.objects.filter(key=key).exists()
    assert AuditEvent.objects.count() == events

    again = client.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert again.status_code == 201, again.json()
    replay = client.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
    assert replay.json()["id"] == again.json()["id"]
    assert Reservation.objects.filter(name="blip").count() == 1
