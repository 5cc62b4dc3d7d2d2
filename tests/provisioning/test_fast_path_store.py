"""
The fast path stores a placed create in one statement on PostgreSQL (services._store_in_one):
the reservation, its operation, its audit event and its allocations, the allocations ON CONFLICT
DO NOTHING. A GPU taken between the read and the store leaves the create queued with nothing of
the placement kept; a deadlock with a racing insert aborts the create's transaction, which runs
again and ends queued or scheduled, never half-made.
"""

import threading
import time
from datetime import timedelta
from unittest import mock

import psycopg
import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from cloud.models import GPU
from provisioning import services
from provisioning.admission import Ask
from provisioning.models import Allocation, Operation, Reservation
from security.models import AuditEvent
from tests.provisioning.factories import held, make_reservation
from tests.world import small_fleet, unique, vm_offering


def postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement store is PostgreSQL's")


def ask(gpus: int, name: str = "now") -> Ask:
    from cloud.models import Region

    return Ask(name=name, offering=vm_offering(gpus), units=1, regions=(Region.objects.get(slug="us-east-1"),),
               duration=timedelta(hours=1))


def what_stays(reservation: Reservation) -> dict:
    events = AuditEvent.objects.filter(target_id=str(reservation.pk), action="reservation.create")
    return {
        "state": Reservation.objects.get(pk=reservation.pk).state,
        "allocations": Allocation.objects.filter(reservation=reservation).count(),
        "operations": list(Operation.objects.filter(reservation=reservation).values_list("state", flat=True)),
        "events": [event.after["state"] for event in events],
    }


def test_a_placed_create_is_stored_in_one_statement(world):
    postgresql_only()
    small_fleet(4)
    eight = ask(8)
    with CaptureQueriesContext(connection) as queries:
        reservation = services.reservation_create(actor=world.principal("t1_member"), ask=eight)
    assert reservation.state == "scheduled"
    writes = [q["sql"] for q in queries.captured_queries if "INSERT INTO" in q["sql"]]
    assert len(writes) == 1
    for table in ("provisioning_reservation", "provisioning_operation", "security_auditevent",
                  "provisioning_allocation"):
        assert f'INSERT INTO "{table}"' in writes[0]
    assert what_stays(reservation) == {"state": "scheduled", "allocations": 8, "operations": ["succeeded"],
                                       "events": ["scheduled"]}
    assert reservation.starts_at is not None and not reservation._state.adding


def test_a_gpu_taken_between_the_read_and_the_store_leaves_the_create_queued_with_nothing_kept(world):
    postgresql_only()
    small_fleet(4)
    planned = services._fast_path

    def then_taken(reservation, now):
        placement = planned(reservation, now)
        # Another writer takes one planned GPU after the read: the store's insert skips that row.
        taken = GPU.objects.get(pk=placement.assignments[3].gpu_id)
        held(make_reservation(world, side="t2", state="scheduled"), [taken], start=placement.start, end=placement.end)
        return placement

    before = AuditEvent.objects.count()
    with mock.patch.object(services, "_fast_path", side_effect=then_taken):
        reservation = services.reservation_create(actor=world.principal("t1_member"), ask=ask(8))
    assert reservation.state == "queued" and reservation.starts_at is None and reservation.region is None
    assert what_stays(reservation) == {"state": "queued", "allocations": 0, "operations": ["pending"],
                                       "events": ["queued"]}
    assert AuditEvent.objects.count() == before + 1  # this create's, once
    assert Reservation.objects.filter(pk=reservation.pk).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_create_that_loses_a_deadlock_runs_again_and_is_never_half_made(world):
    """
    Another transaction holds one of the host's GPUs (uncommitted) while the create's insert,
    holding the first of its eight, waits for it; then it takes the create's first GPU: a
    deadlock, which PostgreSQL breaks by aborting the create (its deadlock_timeout runs out
    first). The create runs again and, the other's GPUs taken, ends queued.
    """
    postgresql_only()
    small_fleet(4)
    host = list(GPU.objects.filter(node__pool="shared", node__is_spare=False).order_by("id"))
    assert len(host) == 8
    first, later = sorted(host, key=lambda g: str(g.pk))[0], sorted(host, key=lambda g: str(g.pk))[4]
    now = timezone.now()
    settings = connection.settings_dict

    def connect(**kwargs):
        return psycopg.connect(host=settings["HOST"] or None, port=settings["PORT"] or None, user=settings["USER"],
                               password=settings["PASSWORD"] or None, dbname=settings["NAME"], **kwargs)

    other, watcher = connect(), connect(autocommit=True)  # the watcher's every read is a fresh snapshot
    other.execute("SET deadlock_timeout = '60s'")  # the create is the one that finds the deadlock

    def hold(gpu):
        other.execute(
            "INSERT INTO provisioning_allocation (reservation_id, gpu_id, node_id, mem_lo, mem_hi, starts_at, "
            "ends_at) VALUES (gen_random_uuid(), %s, %s, 0, %s, %s, %s)",
            [gpu.pk, gpu.node_id, gpu.memory_mib, now - timedelta(minutes=1), now + timedelta(hours=3)])

    def create_waits() -> bool:
        for _ in range(1000):
            row = watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                  "AND wait_event_type = 'Lock' AND pid <> %s", [other.info.backend_pid]).fetchone()
            if row[0]:
                return True
            time.sleep(0.02)
        return False

    hold(later)
    name, outcome, calls = unique("racer"), {}, []
    real = services._create

    def counted(**kwargs):
        calls.append(kwargs["savepoint"])
        return real(**kwargs)

    def create():
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET deadlock_timeout = '3s'")  # the cycle forms well before
            outcome["reservation"] = services.reservation_create(actor=world.principal("t1_member"), ask=ask(8, name))
        except Exception as exc:  # noqa: BLE001 -- any failure fails the test
            outcome["error"] = repr(exc)
        finally:
            connections.close_all()

    racer = threading.Thread(target=create)
    try:
        with mock.patch.object(services, "_create", side_effect=counted):
            racer.start()
            assert create_waits()  # its insert, holding the first GPU, waits on the held one
            hold(first)  # waits on the create: the cycle, which the create's check breaks by aborting it
            other.commit()
            racer.join(60)
    finally:
        other.close()  # whatever failed above, the create is not left waiting on it
        watcher.close()
        racer.join(60)
    assert "error" not in outcome, outcome
    assert calls == [False, True]  # the one-statement store, then again under a savepoint
    reservation = outcome["reservation"]
    assert what_stays(reservation) == {"state": "queued", "allocations": 0, "operations": ["pending"],
                                       "events": ["queued"]}
    assert Reservation.objects.filter(name=name).count() == 1
