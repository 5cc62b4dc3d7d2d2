"""The SLA pages: the tenant's month (/sla/) and staff's every-tenant view (/staff/sla/)."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tenants.models import Tenant
from tests.provisioning.test_sla import NOW, at, incident, reservation
from tests.world import unique

pytestmark = pytest.mark.django_db


def page(client, name, *args, **params):
    with time_machine.travel(NOW, tick=False):
        return client.get(reverse(name, args=args), params)


@pytest.fixture
def month(world):
    """November 2026: t1 loses 1 of 4 GPUs for 12 h of 30 days (99.58 %); t2 loses 4 of 4 for 3 days (90 %)."""
    t1 = reservation(world.t1.tenant, gpus=4, start=at(1), end=at(1, month=12))
    incident(t1, gpus=1, start=at(10), restored=at(10, 12))
    t2 = reservation(world.t2.tenant, gpus=4, start=at(1), end=at(1, month=12))
    incident(t2, gpus=4, start=at(20), restored=at(23))
    return {"t1": t1, "t2": t2}


def test_a_viewer_sees_the_tenants_month_and_the_credit_table(console, world, month):
    response = page(console("t1_viewer"), "sla", month="2026-11")

    assert response.status_code == 200
    f = response.context["f"]
    assert (f.reserved_gpu_minutes, f.unavailable_gpu_minutes, f.met) == (4 * 43_200, 720, True)
    body = response.content.decode().split('<main id="content"')[1]
    assert "99.5833%" in body and "target 99% met" in body and 'method="post"' not in body
    assert "<td>95%</td>" in body and "<td class=\"num\">25%</td>" in body  # the credit table
    assert world.t2.tenant.name not in body


def test_a_month_below_the_target_shows_the_credit_owed(console, world, month):
    response = page(console("t2_member"), "sla", month="2026-11")

    f = response.context["f"]
    assert f.availability == 90 and not f.met and f.credit_percent == 25  # 90 % is not below 90: 25 %
    assert "below the 99% target" in response.content.decode()


def test_a_bad_month_is_a_400_with_the_reason(console, month):
    response = page(console("t1_owner"), "sla", month="2026-13")
    assert response.status_code == 400
    assert "The month must be 01 to 12." in response.content.decode()
    assert page(console("t1_owner"), "sla", month="2099-01").status_code == 400


def test_staff_see_every_tenant_worst_first_and_tenants_get_404(console, world, month):
    response = page(console("platform_approver"), "staff-sla", month="2026-11")

    assert response.status_code == 200
    names = [row["tenant"].name for row in response.context["page"].object_list]
    assert names == [world.t2.tenant.name, world.t1.tenant.name]
    assert (response.context["below_target"], response.context["tenant_count"]) == (1, 2)
    assert response.context["credit_total"] == Decimal("1792.80")  # 25 % of 4 GPUs x 720 h x 2.49
    detail = page(console("platform_admin"), "staff-sla-tenant", world.t1.tenant.pk, month="2026-11")
    assert detail.status_code == 200 and detail.context["f"].unavailable_gpu_minutes == 720
    for persona in ("t1_owner", "t2_member"):
        assert page(console(persona), "staff-sla").status_code == 404
        assert page(console(persona), "staff-sla-tenant", world.t1.tenant.pk).status_code == 404


def test_staff_acting_platform_wide_are_sent_to_the_staff_page(console):
    response = page(console("platform_admin"), "sla", month="2026-10")
    assert response.status_code == 302 and response["Location"] == reverse("staff-sla") + "?month=2026-10"


def test_the_staff_page_costs_the_same_queries_with_more_tenants(console, world, month):
    client = console("platform_admin")

    def count():
        with time_machine.travel(datetime(2026, 12, 5, 12, tzinfo=UTC), tick=False), \
                CaptureQueriesContext(connection) as queries:
            assert client.get(reverse("staff-sla"), {"month": "2026-11"}).status_code == 200
        return len(queries)

    few = count()
    for i in range(5):
        tenant = Tenant.objects.create(name=f"More {i}", slug=unique("more"))
        incident(reservation(tenant, gpus=2, start=at(2), end=at(9)), gpus=1, start=at(3), restored=at(4))
    assert count() == few
