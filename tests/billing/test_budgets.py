"""
Budgets: set by tenant admins for the tenant or a team (bad amounts and thresholds refused, one
each); each threshold crossed is told once a month; a budget with a hard stop refuses new work
once spent (409 naming it), and only for its tenant or team.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.budgets import budgets_check
from billing.meter import hour_floor, meter_run
from billing.models import Budget
from tenants.models import Notification
from tests.billing.test_meter import ran
from tests.world import vm_offering

pytestmark = pytest.mark.django_db
URL = "/api/v1/budgets/"


def code(answer) -> str:
    return answer.json()["errors"][0]["code"]


@pytest.fixture
def spent(world):
    """Two GPUs for the last two hours, metered: 4 GPU-hours at the list price, for t1's team."""
    now = hour_floor(timezone.now())
    ran(world, start=now - timedelta(hours=2), end=now)
    meter_run(now=now)
    return 4 * vm_offering().price_per_gpu_hour


def test_an_admin_sets_budgets_and_bad_ones_are_refused(world):
    admin = world.client("t1_admin")
    made = admin.post(URL, {"amount": "5000.00", "thresholds": [100, 50, 80]}, format="json")
    assert made.status_code == 201 and made.json()["thresholds"] == [50, 80, 100] and made.json()["team"] is None
    again = admin.post(URL, {"amount": "10.00"}, format="json")
    assert again.status_code == 409 and code(again) == "budget_exists"
    for body in ({"amount": 10.5}, {"amount": "-1"}, {"amount": "0"}, {"amount": "ten"},
                 {"amount": "10", "thresholds": [50, 50]}, {"amount": "10", "thresholds": [0]},
                 {"amount": "10", "team": str(world.t2.team.pk)}):
        assert admin.post(URL, body, format="json").status_code == 400, body
    assert world.client("t1_member").post(URL, {"amount": "1.00"}, format="json").status_code == 403
    changed = admin.patch(f"{URL}{made.json()['id']}/", {"hard_stop": True}, format="json")
    assert changed.status_code == 200 and changed.json()["hard_stop"] is True and changed.json()["amount"] == "5000.00"
    assert world.client("t2_owner").get(f"{URL}{made.json()['id']}/").status_code == 404
    assert Budget.objects.count() == 1


def test_each_threshold_crossed_is_told_once(world, spent):
    world.client("t1_admin").post(URL, {"team": str(world.t1.team.pk), "amount": f"{spent * 2:.2f}",
                                        "thresholds": [25, 50, 80]}, format="json")
    assert budgets_check() == 2 and budgets_check() == 0  # 50 % spent: 25 and 50, once each
    notices = Notification.objects.filter(kind="budget.crossed").order_by("title")
    assert [n.title.split(": ")[1] for n in notices] == ["25 % of the month's budget spent",
                                                        "50 % of the month's budget spent"]
    assert {n.team_id for n in notices} == {world.t1.team.pk}
    listed = world.client("t1_admin").get(URL).json()["results"]
    assert listed[0]["spent"] == f"{spent:.2f}"


def test_a_spent_budget_with_a_hard_stop_refuses_new_work_for_its_team_only(world, spent):
    budget = world.client("t1_admin").post(URL, {"team": str(world.t1.team.pk), "amount": f"{spent:.2f}",
                                                 "hard_stop": True}, format="json").json()
    body = {"name": "more", "offering": vm_offering().slug, "gpus": 1, "regions": ["us-east-1"],
            "duration_hours": 1, "team": str(world.t1.team.pk)}
    refused = world.client("t1_owner").post("/api/v1/reservations/", body, format="json")
    assert refused.status_code == 409 and code(refused) == "budget_spent"
    assert refused.json()["errors"][0]["meta"]["budget"] == budget["id"]
    tenant_wide = world.client("t1_owner").post("/api/v1/reservations/", {**body, "team": None}, format="json")
    assert tenant_wide.status_code == 201  # the team's budget binds the team only
