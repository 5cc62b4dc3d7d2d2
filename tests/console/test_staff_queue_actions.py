"""
The staff queue's actions in the console: platform admins raise or lower, hold and let go,
cancel and contact from a row's forms (without JavaScript: plain posts and a redirect back); an
approver and tenant users cannot; a refusal is a message, not a 500; the tenant's page says so.
"""

import pytest

from provisioning.history import history_sample
from provisioning.models import Reservation
from provisioning.views import queue_charts
from tenants.models import Notification
from tests.console.test_staff_queue import queue_up

pytestmark = pytest.mark.django_db


@pytest.fixture
def waiting(world):
    return queue_up(world.t1.tenant, 1, team=world.t1.team)[0]


@pytest.fixture
def other(world):
    return queue_up(world.t2.tenant, 1, urgency=0.1)[0]  # ranked below ``waiting`` until that is held


def act(client, reservation, verb, **data):
    return client.post(f"/staff/queue/{reservation.pk}/{verb}/", data, follow=True)


def test_the_queue_offers_platform_admins_the_actions_and_approvers_none(console, waiting):
    body = console("platform_admin").get("/staff/queue/").content.decode()
    for action in ("priority", "hold", "cancel", "contact"):
        assert f'action="/staff/queue/{waiting.pk}/{action}/"' in body
    assert f"Act on {waiting.name}" in body
    assert f"/staff/queue/{waiting.pk}/" not in console("platform_approver").get("/staff/queue/").content.decode()


def test_an_admin_raises_holds_lets_go_cancels_and_contacts(console, world, waiting, other):
    client = console("platform_admin")
    response = act(client, waiting, "priority", adjustment="0.3", note="Deadline on Friday",
                   next="/staff/queue/?page=1")
    assert response.redirect_chain[-1][0] == "/staff/queue/?page=1"
    assert "priority adjustment +0.30 saved" in response.content.decode()
    waiting.refresh_from_db()
    assert waiting.priority_adjustment == 0.3 and waiting.staff_note == "Deadline on Friday"
    body = act(client, waiting, "hold", note="Checking quota").content.decode()
    assert "is held" in body and "Held by staff (listed last)" in body
    assert body.index(f"Act on {waiting.name}") > body.index(f"Act on {other.name}")  # held: listed last
    assert '<span class="badge state-maintenance">Held' in body
    assert f'action="/staff/queue/{waiting.pk}/let-go/"' in body  # the hold form turned into "let it go"
    assert "back in the queue" in act(client, waiting, "let-go", note="OK").content.decode()
    assert "message about" in act(client, waiting, "contact", message="Could 1 GPU do?").content.decode()
    assert "was cancelled" in act(client, waiting, "cancel", reason="Duplicate").content.decode()
    waiting.refresh_from_db()
    assert waiting.state == "cancelled"
    kinds = set(Notification.objects.filter(tenant=world.t1.tenant).values_list("kind", flat=True))
    assert {"reservation.priority_adjusted", "reservation.held", "reservation.let_go", "operator.message",
            "reservation.cancelled_by_operator"} <= kinds


@pytest.mark.parametrize(("verb", "data", "said"), [
    ("priority", {"adjustment": "2", "note": "x"}, "from -1 (lowest) to 1"),
    ("priority", {"adjustment": "high", "note": "x"}, "from -1 (lowest) to 1"),
    ("hold", {"note": ""}, "Write a note"),
    ("cancel", {}, "Write a reason"),
    ("contact", {"message": "x" * 501}, "Write a message"),
    ("let-go", {"note": "x"}, "is not held"),
])
def test_a_refused_action_is_a_message_and_changes_nothing(console, waiting, verb, data, said):
    before = Reservation.objects.filter(pk=waiting.pk).values().get()
    response = act(console("platform_admin"), waiting, verb, **data)
    assert response.status_code == 200 and said in response.content.decode()
    assert Reservation.objects.filter(pk=waiting.pk).values().get() == before


def test_the_way_back_never_leaves_the_site(console, waiting):
    response = act(console("platform_admin"), waiting, "contact", message="hi", next="https://evil.example/")
    assert response.redirect_chain[-1][0] == "/staff/queue/"


@pytest.mark.parametrize(("persona", "status"), [("platform_approver", 403), ("t1_owner", 404), ("t2_member", 404)])
def test_others_cannot_act(console, waiting, persona, status):
    response = console(persona).post(f"/staff/queue/{waiting.pk}/hold/", {"note": "x"})
    assert response.status_code == status
    waiting.refresh_from_db()
    assert waiting.held_at is None


def test_an_unknown_action_or_reservation_is_404(console, waiting):
    client = console("platform_admin")
    assert client.post(f"/staff/queue/{waiting.pk}/delete/", {}).status_code == 404
    assert client.post("/staff/queue/00000000-0000-0000-0000-000000000000/hold/", {"note": "x"}).status_code == 404


def test_the_tenant_sees_the_hold_the_adjustment_and_the_queue_over_time(console, world, waiting):
    client = console("platform_admin")
    act(client, waiting, "priority", adjustment="-0.2", note="Over its fair share")
    history_sample()
    history_sample()
    body = console("t1_owner").get(f"/reservations/{waiting.pk}/").content.decode()
    assert "Operator's adjustment: Over its fair share" in body and "-0.200" in body
    assert "Place in the queue over time" in body and "The latest 2 of 2 samples" in body
    assert queue_charts(waiting)["count"] == 2
    act(client, waiting, "hold", note="Talk to us")
    body = console("t1_owner").get(f"/reservations/{waiting.pk}/").content.decode()
    assert "Held in the queue by the operator." in body and "Talk to us" in body
