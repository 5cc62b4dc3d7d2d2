"""
Staff's hand on the queue (provisioning.staff_actions): a priority adjustment moves a reservation
in the ranking the scheduler uses, a hold keeps it out of every placement until it is let go,
a cancel frees what it held; each is audited and told to the team, and bad input changes nothing.
"""

import pytest

from core.errors import Conflict, DomainError, Forbidden
from provisioning.models import Reservation
from provisioning.scheduling.queue import queue_position, score_report
from provisioning.scheduling.scheduler import QueueMirror, run_cycle
from provisioning.services import reservation_rescore, reservation_schedule_many
from provisioning.staff_actions import (
    reservation_adjust_priority,
    reservation_contact,
    reservation_hold,
    reservation_let_go,
    reservation_staff_cancel,
)
from security.models import AuditEvent
from tenants.models import Notification
from tests.provisioning.pipeline import reserve_vm
from tests.world import small_fleet

pytestmark = pytest.mark.django_db
URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    """Four nodes in us-east-1: one shared host with 8 H100s for VMs, the rest bare metal."""
    return small_fleet(4)


@pytest.fixture
def full(world, fleet):
    """The shared host is full: what comes next queues."""
    filler = reserve_vm(world, gpus=8)
    assert filler.state == "scheduled"
    return filler


def test_a_raise_moves_a_reservation_ahead_and_is_audited_and_told(world, full):
    first, second = reserve_vm(world, urgency=0.8), reserve_vm(world, "t2_member", urgency=0.2)
    assert queue_position(second) > queue_position(first)
    admin = world.principal("platform_admin")
    adjusted = reservation_adjust_priority(actor=admin, reservation=second, adjustment=0.5, note="Paper deadline")
    assert adjusted.score == pytest.approx(score_report(adjusted)["total"])
    assert queue_position(adjusted) < queue_position(Reservation.objects.get(pk=first.pk))
    assert score_report(adjusted)["adjustment"] == 0.5
    event = AuditEvent.objects.get(action="reservation.priority_adjust", target_id=str(second.pk))
    assert event.after["priority_adjustment"] == 0.5 and event.after["note"] == "Paper deadline"
    told = Notification.objects.get(kind="reservation.priority_adjusted", tenant=second.tenant)
    assert "raised" in told.title and "Paper deadline" in told.body
    # The score kept from here on includes it (the scheduler rescoring it, say).
    assert reservation_rescore(adjusted) == pytest.approx(adjusted.score)


def test_the_scheduler_reads_an_adjustment_made_after_it_mirrored_the_queue(world, full):
    queued = reserve_vm(world)
    mirror = QueueMirror()
    assert [row[4] for row in mirror.queued() if row[0] == queued.pk] == [0.0]
    reservation_adjust_priority(actor=world.principal("platform_admin"), reservation=queued, adjustment=-0.25,
                                note="Lower for now")
    assert [row[4] for row in mirror.queued() if row[0] == queued.pk] == [-0.25]


@pytest.mark.parametrize(("adjustment", "note", "field"), [
    (1.5, "too much", "adjustment"), (float("nan"), "nan", "adjustment"), ("0.5", "text", "adjustment"),
    (0.5, "", "note"), (0.5, "   ", "note"), (0.5, "x" * 501, "note"),
])
def test_bad_input_names_its_field_and_changes_nothing(world, full, adjustment, note, field):
    queued = reserve_vm(world)
    with pytest.raises(DomainError) as refused:
        reservation_adjust_priority(actor=world.principal("platform_admin"), reservation=queued,
                                    adjustment=adjustment, note=note)
    assert field in refused.value.detail
    queued.refresh_from_db()
    assert queued.priority_adjustment == 0.0 and queued.staff_note == ""
    assert not AuditEvent.objects.filter(action="reservation.priority_adjust").exists()


@pytest.mark.parametrize("persona", ["platform_approver", "t1_owner"])
def test_only_platform_admins_act_on_the_queue(world, full, persona):
    queued = reserve_vm(world)
    for act in (lambda a: reservation_adjust_priority(actor=a, reservation=queued, adjustment=0.1, note="n"),
                lambda a: reservation_hold(actor=a, reservation=queued, note="n"),
                lambda a: reservation_staff_cancel(actor=a, reservation=queued, reason="n"),
                lambda a: reservation_contact(actor=a, reservation=queued, message="n")):
        with pytest.raises(Forbidden):
            act(world.principal(persona))
    queued.refresh_from_db()
    assert queued.state == "queued" and queued.held_at is None and queued.priority_adjustment == 0.0


def test_a_held_reservation_is_not_placed_until_it_is_let_go(world, full):
    admin = world.principal("platform_admin")
    held = reserve_vm(world)
    reservation_hold(actor=admin, reservation=held, note="Checking the image with the team")
    held.refresh_from_db()
    assert held.state_reason == "Held by the operator: Checking the image with the team"
    assert queue_position(held) is None and score_report(held)["held"] is True
    assert world.client("t1_owner").post(f"{URL}{full.pk}/release/").status_code == 200
    run_cycle()
    held.refresh_from_db()
    assert held.state == "queued" and held.held_at is not None
    with pytest.raises(Conflict):
        reservation_hold(actor=admin, reservation=held, note="again")
    reservation_let_go(actor=admin, reservation=held, note="Image fixed")
    run_cycle()
    held.refresh_from_db()
    assert held.state == "scheduled" and held.held_at is None
    kinds = set(Notification.objects.filter(tenant=held.tenant).values_list("kind", flat=True))
    assert {"reservation.held", "reservation.let_go"} <= kinds
    assert AuditEvent.objects.filter(action__in=["reservation.hold", "reservation.let_go"],
                                     target_id=str(held.pk)).count() == 2


def test_a_hold_landing_before_a_batched_placement_keeps_the_reservation_out_of_it(world, full):
    """The batch locks the rows it moves and leaves a held one: the hold and the placement never both win."""
    held = reserve_vm(world)
    reservation_hold(actor=world.principal("platform_admin"), reservation=held, note="Wait")
    assert reservation_schedule_many(items=[(held, None, None)]) == []
    held.refresh_from_db()
    assert held.state == "queued" and not held.allocations.exists()


def test_a_held_reservation_of_a_higher_score_does_not_block_a_new_one_on_free_capacity(world, fleet):
    filler = reserve_vm(world, gpus=8)
    waiting = reserve_vm(world, urgency=1.0)  # queued behind the full host
    reservation_adjust_priority(actor=world.principal("platform_admin"), reservation=waiting, adjustment=1.0,
                                note="Top")
    reservation_hold(actor=world.principal("platform_admin"), reservation=waiting, note="Hold")
    assert world.client("t1_owner").post(f"{URL}{filler.pk}/release/").status_code == 200
    assert reserve_vm(world, "t2_member", urgency=0.2).state == "scheduled"


def test_staff_cancel_frees_the_capacity_says_why_and_refuses_what_is_active(world, full):
    admin = world.principal("platform_admin")
    queued = reserve_vm(world)
    cancelled = reservation_staff_cancel(actor=admin, reservation=queued, reason="Duplicate of job-7")
    assert cancelled.state == "cancelled" and cancelled.state_reason == "Cancelled by the operator: Duplicate of job-7"
    told = Notification.objects.get(kind="reservation.cancelled_by_operator")
    assert "Duplicate of job-7" in told.body and told.link.endswith(f"/reservations/{queued.pk}/")
    Reservation.objects.filter(pk=full.pk).update(state="active")
    with pytest.raises(Conflict) as refused:
        reservation_staff_cancel(actor=admin, reservation=full, reason="No")
    assert refused.value.meta["current_state"] == "active"


def test_contacting_the_team_tells_only_that_team_and_changes_nothing(world, full):
    queued = reserve_vm(world, "t2_member")
    queued.team = world.t2.team
    queued.save(update_fields=["team"])
    before = Reservation.objects.filter(pk=queued.pk).values().get()
    reservation_contact(actor=world.principal("platform_admin"), reservation=queued, message="Can you use 4 GPUs?")
    assert Reservation.objects.filter(pk=queued.pk).values().get() == before
    told = Notification.objects.get(kind="operator.message")
    assert told.tenant == world.t2.tenant and told.team == world.t2.team and told.body == "Can you use 4 GPUs?"
    assert AuditEvent.objects.filter(action="reservation.contact", target_id=str(queued.pk)).exists()
    assert not Notification.objects.filter(kind="operator.message", tenant=world.t1.tenant).exists()


def test_adjusting_a_placed_reservation_is_a_conflict(world, full):
    with pytest.raises(Conflict):
        reservation_adjust_priority(actor=world.principal("platform_admin"), reservation=full, adjustment=0.2,
                                    note="n")


def test_the_api_takes_the_same_actions_and_refuses_bad_bodies_with_the_field_named(world, full):
    client = world.client("platform_admin")
    queued = reserve_vm(world)
    url = f"{URL}{queued.pk}"
    answer = client.post(f"{url}/priority/", {"adjustment": 0.5, "note": "Deadline"}, format="json")
    assert answer.status_code == 200 and answer.json()["id"] == str(queued.pk)
    assert client.get(f"{url}/score/").json()["adjustment"] == 0.5
    for body, attr in (({"adjustment": "0.5", "note": "x"}, "adjustment"), ({"adjustment": 2, "note": "x"},
                       "adjustment"), ({"adjustment": 0.1}, "note"), ({"adjustment": 0.1, "note": "x" * 501}, "note"),
                       ({"adjustment": 0.1, "note": "x", "colour": "red"}, "colour")):
        refused = client.post(f"{url}/priority/", body, format="json")
        assert refused.status_code == 400 and refused.json()["errors"][0]["attr"] == attr, refused.content
    assert client.post(f"{url}/hold/", {"note": "Wait"}, format="json").json()["state_reason"].startswith("Held")
    assert client.get(f"{url}/score/").json()["held"] is True
    assert client.post(f"{url}/hold/", {"note": "Again"}, format="json").json()["errors"][0]["code"] == "already_held"
    assert client.post(f"{url}/let-go/", {"note": "Go"}, format="json").status_code == 200
    assert client.post(f"{url}/contact/", {"message": "Hello"}, format="json").status_code == 200
    cancelled = client.post(f"{url}/operator-cancel/", {"reason": "Duplicate"}, format="json").json()
    assert cancelled["state"] == "cancelled" and cancelled["state_reason"] == "Cancelled by the operator: Duplicate"
    assert client.post(f"{url}/hold/", {"note": "x"}, format="json").status_code == 409
    assert world.client("t1_owner").post(f"{url}/hold/", {"note": "x"}, format="json").status_code == 403
