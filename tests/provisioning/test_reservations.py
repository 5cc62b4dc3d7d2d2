"""Reservations through the API: admission, the fast path, the queue, cancel/release/extend, idempotency."""

import threading
import uuid
from datetime import timedelta
from unittest import mock

import pytest
from django.db import connection, connections
from django.utils import timezone

from cloud.leader import LeaderLock
from cloud.models import GPU
from provisioning.admission import Ask
from provisioning.models import Allocation, IdempotencyKey, Operation, Reservation
from provisioning.scheduling.scheduler import LoopMemory, run_cycle
from provisioning.services import _outranked, reservation_create
from security.models import AuditEvent
from tenants.choices import QuotaResource, TenantRole
from tenants.models import Membership, Quota, Tenant
from tenants.scoping import Principal
from tests.provisioning.factories import make_reservation, offering
from tests.provisioning.test_allocations import OVERLAPPING_PAIRS
from tests.provisioning.test_kept_capacity import fresh_index, index_view
from tests.world import make_user, small_fleet, unique, vm_offering

URL = "/api/v1/reservations/"


def body(**extra):
    return {"name": "train", "offering": vm_offering().slug, "gpus": 1, "regions": ["us-east-1"],
            "duration_hours": 2, **extra}


@pytest.fixture
def fleet(world):
    """Four nodes in us-east-1: one shared host with 8 H100s for VMs, the rest bare metal."""
    return small_fleet(4)


def error(response):
    return {(e["attr"], e["code"]) for e in response.json()["errors"]}


def test_a_reservation_that_fits_now_is_scheduled_inside_the_request(world, fleet):
    """The fast path places it at once: scheduled, its GPUs held, one audit event, a finished operation."""
    events = AuditEvent.objects.count()
    response = world.client("t1_member").post(URL, body(gpus=1), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["state"] == "scheduled"
    assert data["region"] == "us-east-1"
    reservation = Reservation.objects.get(pk=data["id"])
    assert reservation.allocations.count() == 1
    assert AuditEvent.objects.count() == events + 1
    assert Operation.objects.get(reservation=reservation).state == "succeeded"


def test_a_fast_path_that_loses_its_gpus_at_the_database_stores_the_reservation_queued(world, fleet):
    """Another writer takes a planned GPU between the plan and the INSERT: queued, nothing of the placement kept."""
    from provisioning import services

    rival = make_reservation(world, side="t2", state="scheduled")
    planned = services._fast_path

    def taken_meanwhile(reservation, now):
        placement = planned(reservation, now)
        first = placement.assignments[0]
        Allocation.objects.create(reservation=rival, gpu_id=first.gpu_id, node_id=first.node_id, mem_lo=first.mem_lo,
                                  mem_hi=first.mem_hi, starts_at=placement.start, ends_at=placement.end)
        return placement

    with mock.patch.object(services, "_fast_path", taken_meanwhile):
        response = world.client("t1_member").post(URL, body(gpus=1), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["state"] == "queued"
    reservation = Reservation.objects.get(pk=response.json()["id"])
    assert (reservation.state, reservation.starts_at, reservation.region_id) == ("queued", None, None)
    assert not reservation.allocations.exists()
    assert Operation.objects.get(reservation=reservation).state == "pending"
    assert AuditEvent.objects.filter(action="reservation.create", target_id=str(reservation.pk)).count() == 1
    assert Allocation.objects.filter(reservation=rival).count() == 1  # the other writer's hold stands


@pytest.mark.parametrize(("score", "regions", "placed"), [
    (0.99, ["us-east-1"], False),  # higher priority, same region: the scheduler decides
    (0.99, ["eu-west-1", "us-east-1"], False),  # it would take this region second
    (0.99, ["eu-west-1"], True),  # higher priority elsewhere: no competitor here
    (0.0, ["us-east-1"], True),  # lower priority: placed at once
])
def test_the_fast_path_leaves_capacity_to_queued_work_of_higher_priority_in_its_regions(
        world, fleet, score, regions, placed):
    waiting = make_reservation(world, side="t2", state="queued", offering=vm_offering(), score=score)
    Reservation.objects.filter(pk=waiting.pk).update(regions=regions)
    response = world.client("t1_member").post(URL, body(gpus=1), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["state"] == ("scheduled" if placed else "queued")


@pytest.mark.parametrize("vendor", ["postgresql", "sqlite"])
def test_queued_work_outranks_a_create_only_with_a_higher_score_the_same_model_and_a_shared_region(
        world, fleet, vendor):
    waiting = make_reservation(world, side="t2", state="queued", offering=vm_offering(), score=0.5)
    Reservation.objects.filter(pk=waiting.pk).update(regions=["eu-west-1", "us-east-1"])

    def outranks(score=0.4, regions=("us-east-1",), model=waiting.gpu_model_id):
        with mock.patch.object(connection, "vendor", vendor):
            return _outranked(Reservation(score=score, regions=list(regions), gpu_model_id=model))

    assert outranks()
    assert outranks(regions=("ap-south-1", "eu-west-1"))
    assert not outranks(score=0.5)
    assert not outranks(regions=("ap-south-1",))
    assert not outranks(model=uuid.uuid4())  # another GPU model


def test_query_filters_narrow_lists_and_leave_one_reservation_found_by_its_id(world, fleet):
    client = world.client("t1_member")
    created = client.post(URL, body(gpus=1), format="json").json()
    listed = client.get(URL, {"state": "cancelled"}).json()
    assert created["id"] not in {r["id"] for r in listed["results"]}
    one = client.get(f"{URL}{created['id']}/", {"state": "cancelled", "ordering": "nonsense"})
    assert one.status_code == 200 and one.json()["id"] == created["id"]
    # Scoping is the queryset's, not a filter's: the other tenant still cannot see it.
    assert world.client("t2_member").get(f"{URL}{created['id']}/").status_code == 404


def test_a_reservation_that_does_not_fit_now_waits_and_the_scheduler_places_it_later(world, fleet):
    """With the shared host full the next one queues; after a release the scheduler places it."""
    client = world.client("t1_owner")
    first = client.post(URL, body(offering=vm_offering(8).slug, gpus=8), format="json").json()
    assert first["state"] == "scheduled"
    second = client.post(URL, body(gpus=1), format="json").json()
    assert second["state"] == "queued"
    assert run_cycle().placed == 0
    assert Reservation.objects.get(pk=second["id"]).state_reason
    assert client.post(f"{URL}{first['id']}/release/").status_code == 200
    assert run_cycle().placed >= 1  # the world's own queued reservations may be placed too
    assert Reservation.objects.get(pk=second["id"]).state == "scheduled"


@pytest.mark.parametrize(("changes", "attr", "code"), [
    ({"gpus": 9}, "gpus", "never_fits"),
    ({"duration_hours": 24 * 31}, "duration_hours", "duration_too_long"),
    ({"start": "2020-01-01T00:00:00Z"}, "start", "start_in_past"),
    ({"billing_term": "spot", "spot_max_price": "1.00"}, "billing_term", "invalid"),
    ({"spot_max_price": "1.00"}, "spot_max_price", "invalid"),
    ({"gpus": 0}, "gpus", "min_value"),
    ({"gpus": "8"}, "gpus", "invalid"),
    ({"nodes": 1}, "gpus", "invalid"),
    ({"regions": ["mars-1"]}, "regions.0", "does_not_exist"),
    ({"regions": []}, "regions", "min_length"),
    ({"urgency": 2}, "urgency", "invalid"),
    ({"urgency": "whenever"}, "urgency", "invalid"),
    ({"ssh_public_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nabc"}, "ssh_public_key", "private_key"),
    ({"ssh_public_key": "ssh-rsa not-a-key"}, "ssh_public_key", "invalid"),
    ({"spec": {"kind": "vm", "min_fp16_tflops": 100, "min_memory_gib": 80}}, "offering", "invalid"),
    ({"state": "active"}, "state", "unknown_field"),
])
def test_bad_requests_are_400_and_write_nothing(world, fleet, changes, attr, code):
    """Each bad input names its field and code; no reservation, allocation or event is written."""
    counts = (Reservation.objects.count(), Allocation.objects.count(), AuditEvent.objects.count())
    response = world.client("t1_member").post(URL, body(**changes), format="json")
    assert response.status_code == 400, response.content
    assert (attr, code) in error(response), response.content
    assert (Reservation.objects.count(), Allocation.objects.count(), AuditEvent.objects.count()) == counts


@pytest.mark.parametrize(("sold", "count"), [
    ({"kind": "vm", "gpus_per_unit": 1}, "gpus"),
    ({"kind": "bare_metal", "gpus_per_unit": 8}, "nodes"),
    ({"kind": "container", "gpus_per_unit": 1, "slots_per_gpu": 7}, "slots"),
])
def test_a_request_that_never_fits_names_the_count_field_it_was_sent(world, fleet, sold, count):
    """The error's attr is the request's own field (gpus, nodes or slots), never an internal name."""
    data = {k: v for k, v in body(offering=offering(**sold).slug).items() if k != "gpus"}
    response = world.client("t1_member").post(URL, {**data, count: 10_000}, format="json")
    assert response.status_code == 400, response.content
    assert error(response) == {(count, "never_fits")}, response.content


def test_an_offering_not_sold_in_the_chosen_regions_says_so_and_where_it_is_sold(world, fleet):
    """A region without the offering's hardware is not "the largest region has 0": it names where it is sold."""
    from cloud.models import Region

    Region.objects.get_or_create(slug="eu-west-1", defaults={"name": "EU West 1"})
    response = world.client("t1_member").post(URL, body(regions=["eu-west-1"]), format="json")
    assert response.status_code == 400, response.content
    [err] = response.json()["errors"]
    assert (err["attr"], err["code"]) == ("regions", "not_sold_in_region"), err
    assert err["detail"] == f"{vm_offering().slug} is not sold in eu-west-1; it is sold in us-east-1."


def test_extending_past_the_maximum_duration_names_hours(world, fleet):
    """Extend takes ``hours``: a refusal of the extra time names that field."""
    client = world.client("t1_member")
    placed = client.post(URL, body(), format="json").json()
    response = client.post(f"{URL}{placed['id']}/extend/", {"hours": 24 * 40}, format="json")
    assert response.status_code == 400, response.content
    assert error(response) == {("hours", "duration_too_long")}, response.content


def test_a_logical_spec_takes_the_best_fitting_gpu_model(world, fleet):
    """60 TFLOPS and 70 GiB fit an H100 (80 GiB) before an H200 (141 GiB)."""
    from cloud.models import GPUModel, Offering
    from config.demo import offerings_for

    for model in GPUModel.objects.filter(slug__in=["h100-80gb-sxm", "h200-141gb-sxm"]):
        for row in offerings_for(model):
            Offering.objects.get_or_create(slug=row.pop("slug"), defaults=row)
    spec = {"kind": "vm", "min_fp16_tflops": 60, "min_memory_gib": 70}
    data = {k: v for k, v in body(spec=spec).items() if k != "offering"}
    response = world.client("t1_member").post(URL, data, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["gpu_model"] == "h100-80gb-sxm"


def test_over_quota_is_409_with_the_numbers(world, fleet):
    """A team quota of 2 GPUs, 1 in use, 2 asked: 409 with limit, in use and asked."""
    Quota.objects.update_or_create(tenant=world.t1.tenant, team=world.t1.team, resource=QuotaResource.GPUS,
                                   gpu_model=None, defaults={"limit": 2})
    client = world.client("t1_admin")
    assert client.post(URL, body(team=str(world.t1.team.pk)), format="json").status_code == 201
    response = client.post(URL, body(team=str(world.t1.team.pk), offering=vm_offering(2).slug, gpus=2),
                           format="json")
    assert response.status_code == 409
    [err] = response.json()["errors"]
    assert err["code"] == "quota_exceeded"
    assert (err["meta"]["limit"], err["meta"]["in_use"], err["meta"]["asked"]) == (2, 1, 2)


def test_cancel_and_release_follow_the_transition_table(world, fleet):
    """Queued work cancels; cancelling twice is a 409 naming the state; active work is released instead."""
    client = world.client("t1_member")
    queued = world.t1.objects[Reservation]
    assert client.post(f"{URL}{queued.pk}/cancel/").json()["state"] == "cancelled"
    again = client.post(f"{URL}{queued.pk}/cancel/")
    assert again.status_code == 409
    assert again.json()["errors"][0]["meta"]["current_state"] == "cancelled"
    placed = client.post(URL, body(), format="json").json()
    Reservation.objects.filter(pk=placed["id"]).update(state="active")
    refused = client.post(f"{URL}{placed['id']}/cancel/")
    assert refused.status_code == 409 and "release" in refused.json()["errors"][0]["detail"]
    released = client.post(f"{URL}{placed['id']}/release/")
    assert released.json()["state"] == "released"  # no instance was provisioned: nothing to clean
    assert not Allocation.objects.filter(reservation_id=placed["id"], ends_at__gt=timezone.now()).exists()


def test_extend_needs_the_same_gpus_free_for_the_extra_time(world, fleet):
    """Extending into an advance reservation on the same GPUs is a 409; into free time it works."""
    client = world.client("t1_owner")
    placed = client.post(URL, body(offering=vm_offering(8).slug, gpus=8, duration_hours=1), format="json").json()
    later = (timezone.now() + timedelta(hours=3)).isoformat()
    held = client.post(URL, body(offering=vm_offering(8).slug, gpus=8, start=later), format="json").json()
    assert held["state"] == "queued"  # an advance reservation is placed by the scheduler, holding its window
    run_cycle()
    assert Reservation.objects.get(pk=held["id"]).state == "scheduled"
    assert client.post(f"{URL}{placed['id']}/extend/", {"hours": 1}, format="json").status_code == 200
    clash = client.post(f"{URL}{placed['id']}/extend/", {"hours": 5}, format="json")
    assert clash.status_code == 409
    assert clash.json()["errors"][0]["code"] == "capacity_taken"


def test_score_shows_every_factor_and_the_queue_position(world, fleet):
    """GET score: each factor with its weight and contribution adding up to the total, a queue position."""
    Reservation.objects.all().delete()
    client = world.client("t1_member")
    later = (timezone.now() + timedelta(hours=2)).isoformat()
    queued = client.post(URL, body(start=later, urgency="high"), format="json").json()
    assert queued["state"] == "queued"
    response = world.client("t1_viewer").get(f"{URL}{queued['id']}/score/")
    assert response.status_code == 200
    data = response.json()
    factors = {f["name"]: f for f in data["factors"]}
    assert {"urgency", "fulfilment", "load", "age", "high_priority", "fair_share"} <= set(factors)
    assert factors["urgency"]["value"] == 0.8
    assert data["total"] == pytest.approx(sum(f["contribution"] for f in data["factors"]), abs=1e-9)
    assert data["queue_position"] == 1
    assert data["waiting_reason"]


def test_idempotency_key_replays_refuses_a_different_body_and_is_per_tenant(world, fleet):
    """Same key and body: one reservation and a replay; another body: 422; another tenant: its own."""
    key = str(uuid.uuid4())
    client = world.client("t1_member")
    first = client.post(URL, body(), format="json", HTTP_IDEMPOTENCY_KEY=key)
    replay = client.post(URL, body(), format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == replay.status_code == 201
    assert replay.json() == first.json()
    assert replay["Idempotent-Replayed"] == "true"
    assert Reservation.objects.filter(name="train").count() == 1
    other = client.post(URL, body(name="different"), format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert other.status_code == 422
    assert other.json()["errors"][0]["code"] == "idempotency_key_reused"
    mine = world.client("t2_member").post(URL, body(), format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert mine.status_code == 201 and mine.json()["id"] != first.json()["id"]
    assert IdempotencyKey.objects.filter(key=key).count() == 2


def test_a_failed_request_stores_no_idempotency_key(world, fleet):
    """A 400 stores nothing: the same key may be retried with a corrected body."""
    key = str(uuid.uuid4())
    client = world.client("t1_member")
    assert client.post(URL, body(gpus=0), format="json", HTTP_IDEMPOTENCY_KEY=key).status_code == 400
    assert client.post(URL, body(), format="json", HTTP_IDEMPOTENCY_KEY=key).status_code == 201


@pytest.mark.django_db(transaction=True)
def test_only_one_scheduler_leads(world):
    """Two schedulers at once: the second stands by until the first lets go."""
    results = {}

    def contender(name, hold):
        lock = LeaderLock("scheduler-test")
        results[name] = lock.acquire()
        hold.wait(5)
        lock.release()
        connections.close_all()

    hold = threading.Event()
    first = threading.Thread(target=contender, args=("first", hold))
    first.start()
    while "first" not in results:
        pass
    second = threading.Thread(target=contender, args=("second", threading.Event()))
    second.start()
    second.join()
    hold.set()
    first.join()
    assert results == {"first": True, "second": False}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_racing_creates_and_the_scheduler_never_double_book_the_last_8_gpus(world):
    """80 creates from 8 tenants race a scheduler loop for one host's 8 GPUs: 8 GPUs held, no overlap, no error."""
    small_fleet(4)
    assert GPU.objects.filter(node__pool="shared", node__is_spare=False).count() == 8
    tenants = []
    for i in range(8):
        tenant = Tenant.objects.create(name=f"Racer {i}", slug=unique("racer"))
        user = make_user(f"{unique('racer')}@example.com")
        Membership.objects.create(tenant=tenant, user=user, role=TenantRole.MEMBER)
        tenants.append(Principal(user=user, tenant=tenant, role=TenantRole.MEMBER))
    from cloud.models import Region

    region = Region.objects.get(slug="us-east-1")
    offering = vm_offering()
    outcomes, errors, stop = [], [], threading.Event()
    # PostgreSQL allows 100 connections, shared with the other test process: 30 creates at a time.
    gate = threading.Semaphore(30)

    def create(principal):
        gate.acquire()
        try:
            ask = Ask(name="race", offering=offering, units=1, regions=(region,), duration=timedelta(hours=1))
            outcomes.append(reservation_create(actor=principal, ask=ask).state)
        except Exception as exc:  # noqa: BLE001 -- any failure fails the test
            errors.append(repr(exc))
        finally:
            connections.close_all()
            gate.release()

    # The loop as run_scheduler runs it: its planning index kept and caught up between cycles.
    memory = LoopMemory.for_loop()

    def scheduler():
        while not stop.is_set():
            try:
                run_cycle(memory=memory)
            except Exception as exc:  # noqa: BLE001
                errors.append(repr(exc))
        connections.close_all()

    loop = threading.Thread(target=scheduler)
    loop.start()
    threads = [threading.Thread(target=create, args=(tenants[i % 8],)) for i in range(80)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    loop.join()
    for _ in range(3):
        run_cycle(memory=memory)
    assert errors == []
    # What the kept index believes after the race is what the database holds.
    later = timezone.now()
    assert index_view(memory.capacity.for_cycle(later)) == index_view(fresh_index(later))
    assert len(outcomes) == 80
    # The world's two queued one-GPU reservations race too.
    assert Allocation.objects.count() == 8
    assert Reservation.objects.filter(state="scheduled").count() == 8
    assert Reservation.objects.filter(state="queued").count() == 80 + 2 - 8
    with connection.cursor() as cursor:
        cursor.execute(OVERLAPPING_PAIRS)
        assert cursor.fetchone()[0] == 0


@pytest.mark.django_db(transaction=True)
def test_racing_creates_of_one_tenant_never_both_pass_its_quota(world):
    """Twelve creates of 4 GPUs at once under a quota of 8: exactly two are admitted, the rest are 409s."""
    from cloud.models import Region
    from core.errors import QuotaExceeded

    small_fleet(4)
    tenant = Tenant.objects.create(name="Quota racer", slug=unique("racer"))
    user = make_user(f"{unique('racer')}@example.com")
    Membership.objects.create(tenant=tenant, user=user, role=TenantRole.MEMBER)
    Quota.objects.create(tenant=tenant, resource=QuotaResource.GPUS, limit=8)
    principal = Principal(user=user, tenant=tenant, role=TenantRole.MEMBER)
    region, offering = Region.objects.get(slug="us-east-1"), vm_offering(4)
    start = timezone.now() + timedelta(days=1)  # advance work: the quota, not the capacity, decides
    outcomes, errors, ready = [], [], threading.Barrier(12)

    def create():
        try:
            ask = Ask(name="race", offering=offering, units=1, regions=(region,), duration=timedelta(hours=1),
                      requested_start=start)
            ready.wait(timeout=30)  # all at once; a thread that failed before it breaks the barrier, not the run
            outcomes.append(reservation_create(actor=principal, ask=ask).state)
        except QuotaExceeded:
            outcomes.append("409")
        except Exception as exc:  # noqa: BLE001 -- any other failure fails the test
            errors.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=create) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(outcomes) == ["409"] * 10 + ["queued"] * 2
    assert Reservation.objects.filter(tenant=tenant).count() == 2


@pytest.mark.parametrize("key", ["not a key", "ssh-foo AAAAB3NzaC1yc2E", "ecdsa-sha2-nistp999 AAAA"])
def test_an_ssh_key_of_an_unknown_type_is_a_400_not_a_500(world, fleet, key):
    response = world.client("t1_member").post(URL, body(ssh_public_key=key), format="json")
    assert response.status_code == 400
    assert ("ssh_public_key", "invalid") in error(response)
    assert not Reservation.objects.filter(tenant=world.t1.tenant, name="train").exists()


def test_gpus_counted_against_a_quota_sums_whole_gpus_and_slot_shares_over_the_window(world, fleet):
    """
    Placed work overlapping the window and waiting work that could run in it count; a fractional
    reservation counts as its share of a GPU; work outside the window, cancelled work and another
    team's work (for a team limit) do not.
    """
    from provisioning.admission import gpus_counted
    from tenants.quotas import QuotaLimit
    from tests.provisioning.factories import make_reservation, offering

    Reservation.objects.filter(tenant=world.t1.tenant).delete()
    now = timezone.now().replace(microsecond=0)
    window = (now, now + timedelta(hours=2))
    sliced = offering("container", 1, slots_per_gpu=4)
    placed = {"state": "scheduled", "team": world.t1.team}
    make_reservation(world, units=1, starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=1), **placed)
    make_reservation(world, units=1, offering=sliced, starts_at=now, ends_at=now + timedelta(hours=1), **placed)
    make_reservation(world, units=2, offering=sliced, state="queued", team=world.t1.team)  # as soon as possible
    make_reservation(world, units=1, starts_at=now + timedelta(hours=3), ends_at=now + timedelta(hours=4),
                     **placed)  # after the window
    make_reservation(world, units=1, state="cancelled", team=world.t1.team)
    make_reservation(world, units=1, state="queued")  # no team: the tenant's
    tenant_limit = QuotaLimit(scope="tenant", resource=QuotaResource.GPUS, gpu_model_id=None, limit=100)
    team_limit = QuotaLimit(scope="team", resource=QuotaResource.GPUS, gpu_model_id=None, limit=100)
    whole = offering().gpus_per_unit  # one unit of the default offering: a whole node's GPUs
    assert gpus_counted(world.t1.tenant, world.t1.team, tenant_limit, *window) == whole + 0.25 + 0.5 + whole
    assert gpus_counted(world.t1.tenant, world.t1.team, team_limit, *window) == whole + 0.25 + 0.5
    other_model = QuotaLimit(scope="tenant", resource=QuotaResource.GPUS, gpu_model_id=uuid.uuid4(), limit=1)
    assert gpus_counted(world.t1.tenant, world.t1.team, other_model, *window) == 0
