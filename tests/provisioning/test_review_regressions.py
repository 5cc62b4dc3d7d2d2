"""Races and limits found in review: each keeps its fix honest."""

import threading
from datetime import timedelta
from unittest import mock

import pytest
from django.db import connection, connections
from django.utils import timezone

from cloud.leader import LeaderLock
from provisioning.models import Reservation
from provisioning.scheduling import scheduler
from provisioning.scheduling.scheduler import run_cycle
from tenants.choices import QuotaResource
from tenants.models import Quota, TeamMembership
from tests.world import issue_token, small_fleet, vm_offering

URL = "/api/v1/reservations/"


def body(**extra):
    return {"name": "job", "offering": vm_offering().slug, "gpus": 1, "regions": ["us-east-1"],
            "duration_hours": 1, **extra}


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()  # the world's queued ones would compete for the one shared host
    return small_fleet(4)


def team_quota(world, limit):
    Quota.objects.update_or_create(tenant=world.t1.tenant, team=world.t1.team, resource=QuotaResource.GPUS,
                                   gpu_model=None, defaults={"limit": limit})


def test_a_reservation_cancelled_between_plan_and_apply_does_not_stop_the_cycle(world, fleet):
    """The cycle counts the lost race and goes on; nothing is allocated to the cancelled reservation."""
    client = world.client("t1_member")
    queued = client.post(URL, body(start=(timezone.now() + timedelta(hours=2)).isoformat()), format="json").json()
    real_plan = scheduler.plan

    def plan_then_cancel(*args, **kwargs):
        result = real_plan(*args, **kwargs)
        client.post(f"{URL}{queued['id']}/cancel/")
        return result

    with mock.patch.object(scheduler, "plan", plan_then_cancel):
        report = run_cycle()
    assert report.conflicts == 1
    cancelled = Reservation.objects.get(pk=queued["id"])
    assert cancelled.state == "cancelled" and not cancelled.allocations.exists()


def test_released_gpus_no_longer_count_against_the_quota(world, fleet):
    """Quota 2: two GPUs, released, then two more fit."""
    team_quota(world, 2)
    client = world.client("t1_admin")
    team = str(world.t1.team.pk)
    first = client.post(URL, body(offering=vm_offering(2).slug, gpus=2, team=team), format="json")
    assert first.status_code == 201
    assert client.post(f"{URL}{first.json()['id']}/release/").status_code == 200
    again = client.post(URL, body(offering=vm_offering(2).slug, gpus=2, team=team), format="json")
    assert again.status_code == 201, again.content


def test_an_advance_reservation_counts_against_the_quota_of_its_own_window_only(world, fleet):
    """Quota 2: two GPUs now for an hour, and two more from later the same day, both fit and get placed."""
    team_quota(world, 2)
    client = world.client("t1_admin")
    team = str(world.t1.team.pk)
    now = client.post(URL, body(offering=vm_offering(2).slug, gpus=2, team=team), format="json")
    later = client.post(URL, body(offering=vm_offering(2).slug, gpus=2, team=team,
                                  start=(timezone.now() + timedelta(hours=1, minutes=5)).isoformat()), format="json")
    assert (now.status_code, later.status_code) == (201, 201), later.content
    run_cycle()
    assert Reservation.objects.get(pk=later.json()["id"]).state == "scheduled"
    # ...but extending the first into the second's window passes the quota: 409.
    extend = client.post(f"{URL}{now.json()['id']}/extend/", {"hours": 1}, format="json")
    assert extend.status_code == 409
    assert extend.json()["errors"][0]["code"] == "quota_exceeded"


def test_a_team_bound_token_books_and_changes_only_for_its_team(world, fleet):
    """Another team is 403; no team means its own; a tenant-wide reservation is out of its reach (404)."""
    other = world.t1.team.__class__.objects.create(tenant=world.t1.tenant, name="Other", slug="other")
    member = world.users["t1_member"]
    assert TeamMembership.objects.filter(team=world.t1.team, user=member).exists()
    token = issue_token(member, world.t1.tenant)
    from tenants.models import APIToken

    APIToken.objects.filter(prefix=token.split("_")[1]).update(team=world.t1.team)
    client = world.client("anon")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert client.post(URL, body(team=str(other.pk)), format="json").status_code == 403
    own = client.post(URL, body(), format="json")
    assert own.status_code == 201 and own.json()["team"] == str(world.t1.team.pk)
    tenant_wide = world.client("t1_owner").post(URL, body(), format="json").json()
    assert client.post(f"{URL}{tenant_wide['id']}/cancel/").status_code == 404
    assert client.get(f"{URL}{tenant_wide['id']}/").status_code == 200  # reading it is fine


def test_a_member_books_only_for_teams_they_belong_to(world, fleet):
    """A member outside a team cannot spend that team's quota (403)."""
    other = world.t1.team.__class__.objects.create(tenant=world.t1.tenant, name="Other", slug="other")
    response = world.client("t1_member").post(URL, body(team=str(other.pk)), format="json")
    assert response.status_code == 403


@pytest.mark.django_db(transaction=True)
def test_a_leader_that_lost_its_connection_stops_leading(world):
    """A closed session frees the advisory lock: another process takes over and the old one stands by."""
    first = LeaderLock("scheduler-reconnect")
    assert first.acquire()
    connection.close()  # the server releases the session's advisory lock
    taken = {}

    def other():
        taken["second"] = LeaderLock("scheduler-reconnect").acquire()
        done.wait(5)
        connections.close_all()

    done = threading.Event()
    thread = threading.Thread(target=other)
    thread.start()
    while "second" not in taken:
        pass
    assert taken["second"] is True
    assert first.acquire() is False
    done.set()
    thread.join()


def test_a_quota_lowered_after_admission_keeps_the_reservation_queued(world, fleet):
    """Checked again at placement: the reservation waits and says which quota holds it."""
    team_quota(world, 4)
    client = world.client("t1_admin")
    later = (timezone.now() + timedelta(hours=2)).isoformat()
    queued = client.post(URL, body(offering=vm_offering(2).slug, gpus=2, team=str(world.t1.team.pk), start=later),
                         format="json").json()
    assert queued["state"] == "queued"
    team_quota(world, 1)
    report = run_cycle()
    assert report.over_quota == 1
    waiting = Reservation.objects.get(pk=queued["id"])
    assert waiting.state == "queued" and "quota" in waiting.state_reason


def test_an_owner_over_quota_is_left_out_of_planning_while_its_record_is_kept(world, fleet):
    """Refused at placement, its work would take a budgeted cycle's places again and again."""
    from provisioning.scheduling.scheduler import LoopMemory

    team_quota(world, 4)
    admin, member = world.client("t1_admin"), world.client("t2_member")
    later = (timezone.now() + timedelta(hours=2)).isoformat()
    held = admin.post(URL, body(offering=vm_offering(2).slug, gpus=2, team=str(world.t1.team.pk), start=later,
                                urgency=1.0), format="json").json()
    team_quota(world, 1)
    memory = LoopMemory(record_refresh_s=3600, shape_refresh_s=3600)
    assert run_cycle(memory=memory).over_quota == 1
    other = member.post(URL, body(start=later), format="json").json()
    with mock.patch.object(scheduler, "_owners_over_quota", wraps=scheduler._owners_over_quota) as checked:
        report = run_cycle(memory=memory)
    assert (report.placed, report.over_quota) == (1, 0)  # the other tenant's work only
    assert held["id"] not in {str(r.pk) for r in checked.call_args.args[0]}
    assert Reservation.objects.get(pk=other["id"]).state == "scheduled"
    waiting = Reservation.objects.get(pk=held["id"])
    assert waiting.state == "queued" and "quota" in waiting.state_reason
    memory.over_quota = {owner: 0.0 for owner in memory.over_quota}  # the record is read again: tried again
    team_quota(world, 4)
    assert run_cycle(memory=memory).placed == 1
    assert Reservation.objects.get(pk=held["id"]).state == "scheduled"


def test_a_node_held_back_after_the_snapshot_is_not_allocated(world, fleet):
    """The cycle checks its planned GPUs once before applying: a node put in maintenance meanwhile is skipped."""
    from cloud.models import Node

    client = world.client("t1_member")
    queued = client.post(URL, body(start=(timezone.now() + timedelta(hours=2)).isoformat()), format="json").json()
    real_plan = scheduler.plan

    def plan_then_hold(*args, **kwargs):
        result = real_plan(*args, **kwargs)
        Node.objects.filter(pool="shared").update(state="maintenance")
        return result

    with mock.patch.object(scheduler, "plan", plan_then_hold):
        report = run_cycle()
    assert (report.placed, report.conflicts) == (0, 1)
    assert Reservation.objects.get(pk=queued["id"]).state == "queued"
