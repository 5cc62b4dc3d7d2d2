"""The dashboard and the switchers: scoped like the API, and staff land on the fleet."""

from decimal import Decimal

import pytest

pytestmark = pytest.mark.django_db


def test_signed_out_goes_to_login(console):
    response = console("anon").get("/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_dashboard_shows_own_tenant_only(console, world):
    page = console("t1_member").get("/")
    assert page.status_code == 200
    body = page.content.decode()
    assert world.t1.tenant.name in body and world.t2.tenant.name not in body


def test_viewer_sees_no_reserve_button(console):
    assert "Reserve GPUs</a>" not in console("t1_viewer").get("/").content.decode()
    assert "Reserve GPUs</a>" in console("t1_member").get("/").content.decode()


def test_switching_to_a_tenant_one_is_not_in_is_refused(console, world):
    client = console("t1_member")
    response = client.post("/switch/", {"tenant": world.t2.tenant.slug, "next": "/"})
    assert response.status_code == 302 and response["Location"] == "/tenants/"
    assert world.t2.tenant.name not in client.get("/").content.decode()


def test_switch_refuses_an_offsite_next(console, world):
    response = console("t1_member").post("/switch/", {"tenant": world.t1.tenant.slug, "next": "https://evil.example/"})
    assert response["Location"] == "/"


def test_staff_without_a_tenant_land_on_the_problems_page(console):
    response = console("platform_admin").get("/")
    assert response.status_code == 302 and response["Location"] == "/staff/"


def test_tenant_users_see_no_staff_pages_nor_links(console, world):
    client = console("t1_owner")
    for url in ("/staff/fleet/", "/staff/queue/", "/staff/quotas/"):
        assert client.get(url).status_code == 404
    assert "/staff/fleet/" not in client.get("/").content.decode()
    # A 404 on a staff page does not lose the tenant chosen with the switcher.
    assert world.t1.tenant.name in client.get("/").content.decode()


def test_a_team_that_is_no_id_is_ignored_not_a_500(console, world):
    client = console("t1_member")
    client.post("/switch/", {"tenant": world.t1.tenant.slug, "team": "x", "next": "/"})
    assert client.get("/").status_code == 200
    session = client.session
    session["console_team"] = "not-a-uuid"  # an older session holding garbage
    session.save()
    assert client.get("/reservations/").status_code == 200


def test_gpus_in_use_are_the_active_ones_and_those_being_prepared_are_counted_apart(console, world):
    """Active GPUs are in use; scheduled (window open) and provisioning ones are being prepared; later ones booked."""
    from datetime import timedelta

    from django.utils import timezone

    from operations.dashboard import summary
    from tests.provisioning.factories import make_reservation, offering

    now = timezone.now()
    bare_metal = offering("bare_metal", 8)
    window = {"starts_at": now - timedelta(minutes=5), "ends_at": now + timedelta(hours=1)}
    make_reservation(world, units=1, state="active", offering=bare_metal, **window)  # 8 GPUs running
    make_reservation(world, units=2, state="provisioning", offering=bare_metal, **window)  # 16 being set up
    make_reservation(world, units=1, state="scheduled", offering=bare_metal, **window)  # 8 waiting for their nodes
    make_reservation(world, units=3, state="scheduled", offering=bare_metal, starts_at=now + timedelta(days=1),
                     ends_at=now + timedelta(days=2))  # 24 booked for tomorrow
    client = console("t1_owner")
    request = client.get("/").wsgi_request
    figures = summary(request, now=now)
    assert (figures["gpus_in_use"], figures["gpus_preparing"], figures["gpus_reserved"]) == (8, 24, 24)
    assert figures["gpus_by_team"]["Tenant-wide"] == {"in_use": 8, "preparing": 24, "reserved": 24}
    body = client.get("/").content.decode()
    assert '<p class="stat">8</p><p class="stat-label">GPUs in use</p>' in body
    assert '<p class="stat">24</p><p class="stat-label">GPUs being prepared' in body


def test_the_gpu_hours_chart_has_a_y_axis_of_round_ticks():
    from datetime import UTC, datetime

    from operations.dashboard import chart
    from web.charts import round_up

    assert [round_up(v) for v in (0, 0.3, 7, 13, 180, 999)] == [1.0, 0.5, 10, 20, 200, 1000]
    day = datetime(2026, 12, 1, tzinfo=UTC)
    drawn = chart([(day, 12.0), (day, 130.0), (day, 0.0)])
    assert [t["label"] for t in drawn["ticks"]] == ["0", "100", "200"]
    bottom, top = drawn["ticks"][0]["y"], drawn["ticks"][-1]["y"]
    tallest = max(drawn["bars"], key=lambda b: b["h"])
    assert abs(tallest["h"] - (bottom - top) * 130 / 200) < 0.2  # bars on the axis's scale
    assert all(b["x"] >= drawn["left"] for b in drawn["bars"])


def test_month_end_spend_goes_on_at_this_months_pace():
    from datetime import UTC, datetime
    from decimal import Decimal

    from operations.dashboard import month_end_projection
    from provisioning.usage import Spend

    spend = Spend(gpu_hours=10.0, amount=Decimal("100.00"), by_team={"ml": Decimal("60.00"), "infra": Decimal("40")})
    projected = month_end_projection(spend, datetime(2026, 11, 11, tzinfo=UTC))  # 10 of November's 30 days
    assert projected["amount"] == Decimal("300.00") and projected["by_team"]["ml"] == Decimal("180.00")
    assert projected["month"] == "November"
    assert month_end_projection(spend, datetime(2026, 11, 1, 0, 30, tzinfo=UTC)) == {}



def test_a_line_chart_says_each_lines_last_value_and_projection():
    from web.charts import line_chart

    svg = str(line_chart({"ml": [0, 10, 25.5], "infra": [5, 5, 5]}, x_labels=["1", "", "3", "", ""], x_total=5,
                         top=50, projection={"ml": 40.0}, label="Spend", unit_prefix="$"))
    assert "Spend: ml $25.50 (about $40 at the end); infra $5.00" in svg
    assert svg.count("<polyline") == 2 and 'stroke-dasharray="4 3"' in svg
    assert ">$0<" in svg and ">$25<" in svg and ">$50<" in svg  # the y-axis ticks


def test_the_dashboards_spend_is_the_ledgers_added_up_day_by_day_per_team_and_charted(console, world):
    from datetime import timedelta

    from django.utils import timezone

    from billing import budgets, invoices
    from billing.meter import meter_run
    from billing.models import UsageRollup
    from billing.spend import month_so_far
    from provisioning.usage import month_start
    from tests.billing.test_meter import ran

    now = timezone.now()
    start = month_start(now)
    ran(world, start=start, end=start + timedelta(hours=2), gpus=2)  # the month's first two hours
    ran(world, start=start + timedelta(hours=1), end=start + timedelta(hours=3), gpus=1)
    meter_run(now=start + timedelta(hours=4))
    month = month_so_far(UsageRollup.objects.filter(tenant=world.t1.tenant), now)
    assert month.days[0] == start and len(month.days) == (now - start).days + 1
    assert month.spend.gpu_hours == 6.0 and month.spend.amount == Decimal("14.94")  # 6 GPU-hours at 2.49
    assert month.spend.amount == budgets.spent(world.t1.tenant.pk, now=now)
    assert month.spend.amount == invoices.draft(world.t1.tenant.pk, now, now).invoice.subtotal
    assert {team: series[-1] for team, series in month.cumulative.items()} == month.spend.by_team
    for series in month.cumulative.values():
        assert all(a <= b for a, b in zip(series, series[1:], strict=False))  # never goes down
    page = console("t1_owner").get("/").content.decode()
    assert 'id="spend-chart"' in page and "Spend in " in page and "$14.94" in page
    assert "$14.94" not in console("t2_owner").get("/").content.decode()
