"""The staff tenants page: each tenant's GPUs now, waiting work, GPU-hours and spend this month, staff only."""

from datetime import timedelta

import pytest
from django.utils import timezone

from provisioning.models import Allocation, Reservation
from provisioning.usage import month_start, month_to_date
from tests.console.test_staff_queue import queue_up
from tests.provisioning.pipeline import reserve_on_small_fleet

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("persona", ["t1_viewer", "t1_owner", "t2_member"])
def test_tenant_users_get_404(console, persona):
    assert console(persona).get("/staff/tenants/").status_code == 404


def test_spend_gpus_and_waiting_work_per_tenant_biggest_spend_first(console, world, steps):
    pk = reserve_on_small_fleet(world, hours=4)
    steps.run()
    now = timezone.now()
    Allocation.objects.filter(reservation_id=pk).update(starts_at=max(month_start(now), now - timedelta(hours=2)))
    queue_up(world.t2.tenant, 2)
    spend = month_to_date(Reservation.objects.filter(tenant=world.t1.tenant), now)
    assert spend.amount > 0
    body = console("platform_approver").get("/staff/tenants/").content.decode()
    assert body.index(world.t1.tenant.name) < body.index(world.t2.tenant.name)  # the spender first
    assert f"${spend.amount:,.2f}" in body
    held_now = Reservation.objects.get(pk=pk).gpus
    assert f'<td class="num">{held_now}</td>' in body
    waiting = Reservation.objects.filter(tenant=world.t2.tenant, state__in=["pending", "queued"])
    gpus = sum(r.gpus for r in waiting)
    assert f"{waiting.count()} ({gpus} GPUs)" in body
    assert 'href="/staff/tenants/" aria-current="page"' in body


def test_the_page_costs_the_same_queries_with_more_tenants(console, world, django_assert_max_num_queries):
    from tenants.models import Tenant

    client = console("platform_admin")
    client.get("/staff/tenants/")
    Tenant.objects.bulk_create([Tenant(name=f"Extra {n}", slug=f"extra-{n}") for n in range(30)])
    queue_up(world.t1.tenant, 5)
    with django_assert_max_num_queries(12):
        assert client.get("/staff/tenants/").status_code == 200
