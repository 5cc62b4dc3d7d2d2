"""
The scheduler applies its plan in batches: a few statements per hundred placements, with the
same guarantees as one by one (no overlap, state moves only from waiting, audited, operations
closed), and a batch that meets a lost race is redone one by one.
"""

import uuid
from datetime import timedelta
from unittest import mock

import pytest
from django.db import connection, transaction
from django.utils import timezone

from cloud.models import GPU, Node, Region
from core.db import copy_rows, update_rows
from provisioning.admission import quota_suspects
from provisioning.allocations import Binding, CapacityTaken, allocation_bind, allocation_bind_many
from provisioning.lifecycle import dispatch as dispatching
from provisioning.lifecycle import start as starting
from provisioning.models import Allocation, Operation, Reservation
from provisioning.scheduling import scheduler, team_record
from provisioning.scheduling.plan_types import Assignment, Eviction, Placement
from provisioning.scheduling.scheduler import run_cycle
from provisioning.scheduling.team_record import TeamRecords
from security.models import AuditEvent
from tenants.choices import QuotaResource
from tenants.models import Quota
from tests.provisioning.factories import make_reservation
from tests.provisioning.test_allocations import OVERLAPPING_PAIRS
from tests.world import small_fleet, vm_offering

URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(4)


def queue(world, n, *, gpus=1):
    client = world.client("t1_member")
    later = (timezone.now() + timedelta(hours=2)).isoformat()
    made = [client.post(URL, {"name": f"job-{i}", "offering": vm_offering(gpus).slug, "gpus": gpus,
                              "regions": ["us-east-1"], "duration_hours": 1, "start": later}, format="json").json()
            for i in range(n)]
    assert all(r["state"] == "queued" for r in made), made
    return [r["id"] for r in made]


def test_a_batch_is_scheduled_with_its_window_operation_and_audit(world, fleet):
    ids = queue(world, 3)
    report = run_cycle()
    assert (report.placed, report.conflicts) == (3, 0)
    for reservation in Reservation.objects.filter(pk__in=ids):
        assert reservation.state == "scheduled" and reservation.region.slug == "us-east-1"
        assert reservation.starts_at and reservation.ends_at - reservation.starts_at == timedelta(hours=1)
        assert reservation.scheduled_at and reservation.score > 0
        assert reservation.allocations.count() == 1
        assert Operation.objects.get(reservation=reservation, kind="place").state == "succeeded"
        event = AuditEvent.objects.get(action="reservation.schedule", target_id=str(reservation.pk))
        assert event.tenant_id == reservation.tenant_id and event.after["state"] == "scheduled"


def test_a_clash_in_a_batch_places_the_others_one_by_one(world, fleet):
    """A GPU taken between plan and apply costs only the placement that planned it."""
    queue(world, 3)
    real_plan = scheduler.plan

    def plan_then_take_one(*args, **kwargs):
        result = real_plan(*args, **kwargs)
        first = result.placements[0]
        taker = make_reservation(world, state="scheduled")
        with transaction.atomic():
            allocation_bind(reservation=taker, assignments=list(first.assignments), starts_at=first.start,
                            ends_at=first.end)
        return result

    with mock.patch.object(scheduler, "plan", plan_then_take_one):
        report = run_cycle()
    assert (report.placed, report.conflicts) == (2, 1)
    assert Reservation.objects.filter(state="queued").count() == 1
    with connection.cursor() as cursor:
        cursor.execute(OVERLAPPING_PAIRS)
        assert cursor.fetchone()[0] == 0


def test_a_failed_batch_leaves_nothing_behind(world, fleet):
    """All or nothing: one clash and no allocation, state move, operation or audit of the batch stays."""
    from provisioning.services import reservation_schedule_many

    ids = queue(world, 2)
    queued = list(Reservation.objects.filter(pk__in=ids).select_related("offering"))
    gpu = GPU.objects.filter(node__pool="shared").first()
    start = timezone.now() + timedelta(hours=2)
    whole = Assignment(node_id=gpu.node_id, gpu_id=gpu.pk, mem_lo=0, mem_hi=gpu.memory_mib)
    placement = mock.Mock(assignments=[whole], start=start, end=start + timedelta(hours=1), evictions=())
    region = Region.objects.get(slug="us-east-1")
    with pytest.raises(CapacityTaken), transaction.atomic():
        reservation_schedule_many(items=[(r, placement, region) for r in queued])  # both on one GPU
    assert not Allocation.objects.filter(reservation_id__in=ids).exists()
    assert set(Reservation.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"queued"}
    assert not AuditEvent.objects.filter(action="reservation.schedule").exists()


def test_a_reservation_that_moved_on_is_not_scheduled_by_its_batch(world, fleet):
    from provisioning.services import reservation_schedule_many

    ids = queue(world, 2)
    Reservation.objects.filter(pk=ids[0]).update(state="cancelled")
    queued = list(Reservation.objects.filter(pk__in=ids).select_related("offering"))
    gpus = list(GPU.objects.filter(node__pool="shared")[:2])
    start = timezone.now() + timedelta(hours=2)
    placements = [mock.Mock(assignments=[Assignment(g.node_id, g.pk, 0, g.memory_mib)], start=start,
                            end=start + timedelta(hours=1), evictions=()) for g in gpus]
    with transaction.atomic():
        moved = reservation_schedule_many(items=[(r, p, Region.objects.get(slug="us-east-1"))
                                                 for r, p in zip(queued, placements, strict=True)])
    assert [r.pk for r in moved] == [r.pk for r in queued if str(r.pk) == ids[1]]
    assert Reservation.objects.get(pk=ids[0]).state == "cancelled"
    assert not Allocation.objects.filter(reservation_id=ids[0]).exists()


def test_the_embedded_check_refuses_two_bindings_of_a_batch_on_one_gpu(world, fleet):
    """SQLite has no constraint: the batch's own bindings are checked against each other too."""
    gpu = GPU.objects.filter(node__pool="shared").first()
    now = timezone.now()
    half = Assignment(gpu.node_id, gpu.pk, 0, gpu.memory_mib // 2 + 1)
    other_half = Assignment(gpu.node_id, gpu.pk, gpu.memory_mib // 2, gpu.memory_mib)
    bindings = [Binding(make_reservation(world), [half], now, now + timedelta(hours=1)),
                Binding(make_reservation(world), [other_half], now, now + timedelta(hours=1))]
    with (mock.patch.object(connection, "vendor", "sqlite"),
          mock.patch.object(Allocation.objects, "bulk_create", side_effect=AssertionError("reached the insert")),
          pytest.raises(CapacityTaken), transaction.atomic()):
        allocation_bind_many(bindings)


@pytest.mark.parametrize("vendor", ["postgresql", "sqlite"])
def test_update_rows_writes_each_rows_own_values(world, fleet, vendor):
    rows = [make_reservation(world, state="queued") for _ in range(3)]
    for i, row in enumerate(rows):
        row.score, row.state_reason = 0.1 * (i + 1), f"reason {i}"
    with mock.patch.object(connection, "vendor", vendor):
        update_rows(Reservation, rows, ["score", "state_reason"])
    fresh = Reservation.objects.filter(pk__in=[r.pk for r in rows])
    stored = {r.pk: (round(r.score, 3), r.state_reason) for r in fresh}
    assert stored == {row.pk: (round(0.1 * (i + 1), 3), f"reason {i}") for i, row in enumerate(rows)}


@pytest.mark.parametrize("vendor", ["postgresql", "sqlite"])
def test_update_rows_writes_nulls_times_and_foreign_keys_row_by_row(world, fleet, vendor):
    region = Region.objects.first()
    rows = [make_reservation(world, state="queued") for _ in range(3)]
    now = timezone.now()
    for i, row in enumerate(rows):
        row.scheduled_at = now + timedelta(minutes=i) if i else None
        row.region = region if i == 1 else None
        row.starts_at = None  # a column of nulls only
    with mock.patch.object(connection, "vendor", vendor):
        update_rows(Reservation, rows, ["scheduled_at", "region", "starts_at"])
    fresh = Reservation.objects.filter(pk__in=[r.pk for r in rows])
    stored = {r.pk: (r.scheduled_at, r.region_id, r.starts_at) for r in fresh}
    assert stored == {rows[0].pk: (None, None, None), rows[1].pk: (now + timedelta(minutes=1), region.pk, None),
                      rows[2].pk: (now + timedelta(minutes=2), None, None)}


def test_update_rows_refuses_a_json_field_before_writing_anything(world, fleet):
    event = AuditEvent.objects.first() or AuditEvent(pk=1)
    with pytest.raises(TypeError, match="JSON"):
        update_rows(AuditEvent, [event], [next(f.name for f in AuditEvent._meta.fields
                                               if f.get_internal_type() == "JSONField")])


@pytest.mark.skipif(connection.vendor != "postgresql", reason="COPY is PostgreSQL's")
def test_copy_rows_refuses_a_field_that_prepares_its_own_values(world, fleet):
    """An encrypted field written by COPY would land in clear text: refused before anything is sent."""
    node = fleet[0]
    with pytest.raises(TypeError, match="bmc_password"), transaction.atomic():
        copy_rows(Node, ("id", "hostname", "bmc_password"), [(node.pk, "copy", "secret")])


def test_audit_events_of_a_batch_carry_what_one_at_a_time_would(world, fleet):
    from security.audit import audit_record, audit_record_many

    first, second = make_reservation(world), make_reservation(world)
    after = {"state": "scheduled", "nested": {"gpus": [1, 2]}, "when": "2026-01-01T00:00:00+00:00"}
    with transaction.atomic():
        one = audit_record(actor=world.principal("t1_owner"), action="test.batch", target=first, after=after)
        assert audit_record_many(actor=world.principal("t1_owner"), action="test.batch",
                                 changes=[(second, after)]) == 1
    many = AuditEvent.objects.get(action="test.batch", target_id=str(second.pk))
    for name in ("actor_id", "actor_email", "token_id", "tenant_id", "action", "target_type", "after", "before",
                 "request_id", "chain_hash", "seal_seq"):
        assert getattr(many, name) == getattr(one, name), name
    assert many.public_id != one.public_id and many.occurred_at and many.pk > one.pk


def test_quota_suspects_are_only_owners_whose_whole_commitment_passes_a_limit(world, fleet):
    queue(world, 2)
    owner = (world.t1.tenant.pk, None, vm_offering().gpu_model_id)
    Quota.objects.update_or_create(tenant=world.t1.tenant, team=None, resource=QuotaResource.GPUS, gpu_model=None,
                                   defaults={"limit": 2})
    assert quota_suspects({owner}) == set()
    Quota.objects.filter(tenant=world.t1.tenant, team=None, resource=QuotaResource.GPUS).update(limit=1)
    assert quota_suspects({owner}) == {owner}


def test_the_loop_rereads_team_records_only_after_the_refresh(world):
    now = timezone.now()
    a, b = ("tenant-a", None, "model"), ("tenant-b", None, "model")
    no_usage = mock.patch.object(team_record, "decayed_usage_many", side_effect=lambda owners, **_: {})
    every = {"side_effect": lambda keys, **_: {k: k for k in keys}}
    with mock.patch.object(team_record, "team_inputs_many", **every) as read, no_usage:
        records = TeamRecords(refresh_s=3600)
        records.get({a}, now, None)
        records.get({a}, now, None)
        assert read.call_count == 1
        records.get({a, b}, now, None)
        assert read.call_args.args[0] == {b}  # only the owner new to the queue
        records.refresh_s = 0
        records.get({a, b}, now, None)
        assert read.call_count == 3 and read.call_args.args[0] == {a, b}


def test_creates_score_with_a_team_record_at_most_a_few_seconds_old(world):
    from django.core.cache import cache

    from provisioning.scheduling import team_record

    cache.clear()
    owner = {"tenant": world.t1.tenant.pk, "team": None, "gpu_model_id": vm_offering().gpu_model_id,
             "now": timezone.now(), "weights": None}
    with mock.patch.object(team_record, "team_inputs", return_value="record") as read:
        assert team_record.team_inputs_recent(**owner, max_age_s=60) == "record"
        assert team_record.team_inputs_recent(**owner, max_age_s=60) == "record"
        assert read.call_count == 1  # the second create reused it
        team_record.team_inputs_recent(**owner, max_age_s=0)
        assert read.call_count == 2  # no reuse when the refresh is 0


def test_the_fast_path_reads_only_free_gpus_when_they_are_enough(world, fleet):
    """On-demand whole-GPU work is placed from the free GPUs alone; the pool with its holders is not read."""
    from provisioning import services
    from provisioning.scheduling import free_hint

    with (mock.patch.object(free_hint, "free_snapshot", wraps=free_hint.free_snapshot) as free,
          mock.patch.object(services, "load_snapshot", wraps=services.load_snapshot) as pool):
        response = world.client("t1_member").post(URL, {"name": "now", "offering": vm_offering(1).slug, "gpus": 1,
                                                        "regions": ["us-east-1"], "duration_hours": 1}, format="json")
    assert response.json()["state"] == "scheduled"
    assert free.call_count == 1 and pool.call_count == 0


def test_free_candidates_are_the_best_fitting_hosts_and_a_whole_free_leaf(world, fleet):
    from provisioning.allocations import allocation_bind
    from provisioning.scheduling.snapshot import free_candidates, request_for
    from tests.provisioning.factories import make_reservation, offering

    now = timezone.now()
    host = GPU.objects.filter(node__pool="shared").order_by("node__hostname").first().node
    taken = list(host.gpus.order_by("index")[:6])
    with transaction.atomic():
        allocation_bind(reservation=make_reservation(world, state="scheduled"),
                        assignments=[Assignment(g.node_id, g.pk, 0, g.memory_mib) for g in taken],
                        starts_at=now, ends_at=now + timedelta(hours=3))
    vm = make_reservation(world, offering=vm_offering(2), state="queued")
    vm.score = 0.5
    assert free_candidates(request_for(vm, now), now=now)[0] == host.pk  # 2 free: the best fit
    too_big = make_reservation(world, offering=vm_offering(8), units=50, state="queued")
    assert free_candidates(request_for(too_big, now), now=now) is None

    bare = make_reservation(world, offering=offering("bare_metal", 8), units=1, state="queued")
    nodes = free_candidates(request_for(bare, now), now=now)
    assert nodes and all(Node.objects.get(pk=n).pool == "bare_metal" for n in nodes)
    assert not Node.objects.filter(pk__in=nodes, is_spare=True).exists()


def test_a_cycle_commits_at_most_max_placements_and_the_rest_wait(world, fleet, settings):
    settings.MERIDIAN_SCHEDULER_MAX_PLACEMENTS = 2
    ids = queue(world, 3)
    assert run_cycle().placed == 2
    assert Reservation.objects.filter(pk__in=ids, state="queued").count() == 1
    assert run_cycle().placed == 1


def test_work_due_now_is_started_a_few_reservations_per_message(db, monkeypatch, django_capture_on_commit_callbacks):
    from provisioning import task_names
    from provisioning.lifecycle import dispatch as dispatching

    sent = []
    monkeypatch.setattr(task_names, "send", lambda name, args, **kw: sent.append(args[0]))
    now = timezone.now()
    due = [mock.Mock(pk=i, starts_at=now) for i in range(dispatching.STARTS_PER_TASK * 2 + 1)]
    later = mock.Mock(pk="later", starts_at=now + timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        dispatching.provision_when_due(due + [later])
    assert dispatching.START_SENDER.flush()
    assert [len(chunk) for chunk in sent] == [dispatching.STARTS_PER_TASK, dispatching.STARTS_PER_TASK, 1]
    assert [rid for chunk in sent for rid in chunk] == [str(r.pk) for r in due]


def test_one_start_that_fails_does_not_stop_the_others(monkeypatch, caplog):
    """Started together in one transaction; when that fails, each alone: only the bad one is left to the tick."""

    tried = []

    def start(reservation_ids, also=()):
        tried.append(list(reservation_ids) + list(also))
        if "bad" in reservation_ids:
            raise RuntimeError("driver exploded")
        return [mock.Mock(pk=pk, step="define_domain") for pk in reservation_ids]

    sent = []
    monkeypatch.setattr(starting, "provision_start_many", start)
    monkeypatch.setattr(starting, "_placed_just_now", lambda **_: [])
    monkeypatch.setattr(dispatching, "enqueue",
                        lambda operations, step: sent.append(([o.pk for o in operations], step)))
    assert starting.reservations_start(["a", "bad", "c"]) == 2
    assert tried == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]
    assert "Starting reservation bad failed" in caplog.text
    assert sent == [(["a", "c"], "define_domain")]  # the started go on together, in one message


def test_a_cycle_that_ran_long_binds_its_start_now_work_from_when_it_commits(world, fleet, settings):
    """
    Bound from the cycle's moment, work planned more than half the archive horizon ago would be
    refused as stale (and a host whose every cycle ran that long would place nothing): a cycle
    that ran long moves such windows, whole, to start when they are bound.
    """
    settings.MERIDIAN_ALLOCATION_ARCHIVE_AFTER = timedelta(seconds=20)
    ids = [make_reservation(world, state="queued", offering=vm_offering(1)).pk for _ in range(2)]
    planned_at = timezone.now() - timedelta(seconds=12)
    report = run_cycle(now=planned_at)
    assert (report.placed, report.conflicts) == (2, 0)
    for reservation in Reservation.objects.filter(pk__in=ids):
        assert reservation.state == "scheduled"
        assert reservation.starts_at >= planned_at + timedelta(seconds=12)
        assert reservation.ends_at - reservation.starts_at == reservation.duration
        assert reservation.allocations.get().starts_at == reservation.starts_at


def test_a_long_cycle_moves_every_window_that_would_start_in_the_past_and_nothing_else(settings):
    settings.MERIDIAN_ALLOCATION_ARCHIVE_AFTER = timedelta(seconds=20)
    planned_at = timezone.now() - timedelta(seconds=12)

    def placement(start, evict_at=None):
        evictions = (Eviction(uuid.uuid4(), uuid.uuid4(), evict_at, "spot"),) if evict_at else ()
        return Placement(uuid.uuid4(), "us-east-1", start, start + timedelta(hours=1), (), 1, evictions)

    now_work = placement(planned_at, evict_at=planned_at)  # start-now work that evicts spot work at once
    missed = placement(planned_at + timedelta(seconds=4))  # a start the cycle's length overtook
    ahead = placement(planned_at + timedelta(hours=1))
    moment, moved = scheduler._bound_from_now([now_work, missed, ahead], planned_at=planned_at)
    assert moment - planned_at >= timedelta(seconds=12)
    assert [p.start for p in moved] == [moment, moment, ahead.start]
    assert all(p.end - p.start == timedelta(hours=1) for p in moved)
    assert moved[0].evictions[0].at == moment
    # A short lag moves nothing: backfill that ends as a held window begins would clash.
    recent = timezone.now() - timedelta(seconds=2)
    assert scheduler._bound_from_now([placement(recent)], planned_at=recent)[1][0].start == recent
