"""The staff queue page: ranked by score with every factor, paginated, the scheduler's last cycle."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from provisioning.models import Reservation
from provisioning.scheduling.priority import ScoreInputs, Weights, score
from provisioning.scheduling.scheduler import run_cycle
from tests.world import h100, unique, vm_offering

pytestmark = pytest.mark.django_db


def queue_up(tenant, n: int, *, team=None, urgency: float = 0.5, waited_h: float = 1.0) -> list[Reservation]:
    """``n`` queued reservations with a stored score and breakdown, as reservation_rescore leaves them."""
    rows = []
    for _ in range(n):
        breakdown = score(ScoreInputs(urgency=urgency, fulfilment_rate=0.9, current_load=0.25,
                                      waited_s=waited_h * 3600, usage_share=0.5), Weights())
        rows.append(Reservation(
            tenant=tenant, team=team, name=unique("queued"), offering=vm_offering(), gpu_model=h100(), units=2,
            gpus=2, regions=["us-east-1"], duration=timedelta(hours=4), state="queued", urgency=urgency,
            score=breakdown.total, score_breakdown=breakdown.as_dict(), state_reason="Not enough free H100s.",
        ))
    made = Reservation.objects.bulk_create(rows)
    Reservation.objects.filter(pk__in=[r.pk for r in made]).update(
        submitted_at=timezone.now() - timedelta(hours=waited_h))
    return made


def ranks(body: str) -> list[str]:
    """Reservation names in the order the table shows them."""
    return re.findall(r'<td class="reservation"><a href="/reservations/[0-9a-f-]+/">(queued-\d+)</a>', body)


@pytest.mark.parametrize("persona", ["t1_viewer", "t1_member", "t1_owner", "t2_member"])
def test_tenant_users_get_404(console, persona):
    assert console(persona).get("/staff/queue/").status_code == 404


def test_ranked_by_score_with_every_factor(console, world):
    low = queue_up(world.t1.tenant, 1, urgency=0.1)[0]
    high = queue_up(world.t2.tenant, 1, team=world.t2.team, urgency=1.0)[0]
    body = console("platform_approver").get("/staff/queue/").content.decode()
    order = ranks(body)
    assert order.index(high.name) < order.index(low.name)
    for label in ("Urgency", "Fulfilment", "Team load", "Age", "High priority", "Fair share"):
        assert f'<th scope="col" class="num">{label}<br>' in body
    urgency = high.score_breakdown["factors"][0]
    assert urgency["name"] == "urgency" and f'{urgency["contribution"]:.3f}' in body
    fair_share = next(f for f in high.score_breakdown["factors"] if f["name"] == "fair_share")
    assert f'{fair_share["contribution"]:.3f}' in body and fair_share["contribution"] < 0
    assert world.t2.tenant.name in body and world.t2.team.name in body
    assert "Not enough free H100s." in body and "1\xa0hour" in body


def test_top_hundred_by_default_then_pages(console, world):
    queue_up(world.t1.tenant, 108)  # and the world's two
    client = console("platform_admin")
    body = client.get("/staff/queue/").content.decode()
    assert len(ranks(body)) == 100 and "Page 1 of 2" in body
    body = client.get("/staff/queue/", {"page": 2}).content.decode()
    assert len(ranks(body)) == 10 and "ranks 101–110" in body
    assert len(ranks(client.get("/staff/queue/", {"per_page": 50}).content.decode())) == 50
    for junk in ({"per_page": "7"}, {"per_page": "x", "page": "y"}, {"page": "999"}):
        assert client.get("/staff/queue/", junk).status_code == 200


def test_no_cycle_yet_then_the_last_cycle(console, world):
    client = console("platform_admin")
    assert "No cycle yet" in client.get("/staff/queue/").content.decode()
    report = run_cycle()
    body = client.get("/staff/queue/").content.decode()
    assert "No cycle yet" not in body
    assert re.search(r"Queued</th><td class=\"num\">" + str(report.queued) + "<", body)
    assert "is the scheduler running?" not in body


def test_query_count_does_not_grow_with_the_queue(console, world, django_assert_max_num_queries):
    client = console("platform_admin")
    queue_up(world.t1.tenant, 3)
    client.get("/staff/queue/")
    with CaptureQueriesContext(connection) as few:
        client.get("/staff/queue/")
    queue_up(world.t2.tenant, 60, team=world.t2.team)
    with django_assert_max_num_queries(len(few)):
        body = client.get("/staff/queue/").content.decode()
    assert len(ranks(body)) == Reservation.objects.filter(state="queued").count() == 65


def test_a_row_links_to_the_reservation_and_says_why_it_waits_in_full(console, world):
    waiting = queue_up(world.t2.tenant, 1)[0]
    Reservation.objects.filter(pk=waiting.pk).update(state_reason="Not enough free H100s in us-east-1: " + "x" * 300)
    client = console("platform_approver")

    body = client.get("/staff/queue/").content.decode()

    assert f'<a href="/reservations/{waiting.pk}/">{waiting.name}</a>' in body
    why = re.search(r'<tr class="why">\s*<td colspan="(\d+)">(.*?)</td>', body, re.S)
    assert why and int(why[1]) >= 10 and "Not enough free H100s" in why[2] and "x" * 300 in why[2]
    assert str(waiting.pk)[:8] + "</code>" not in body  # no id fragments in place of a link
    page = client.get(f"/reservations/{waiting.pk}/")
    assert page.status_code == 200 and waiting.name in page.content.decode()
