"""The console's billing pages: the month's draft, invoices issued, one printable, its CSV; admins and owners."""

from datetime import timedelta

import pytest
from django.utils import timezone

from billing import invoices
from billing.meter import meter_run
from tests.billing.test_meter import ran

pytestmark = pytest.mark.django_db


def test_an_admin_sees_the_draft_the_invoices_and_prints_one(console, world):
    this = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last = (this - timedelta(days=1)).replace(day=1)
    ran(world, start=last + timedelta(days=1), end=last + timedelta(days=1, hours=10))
    meter_run(now=this)
    client = console("t1_admin")
    body = client.get("/billing/", {"month": f"{last:%Y-%m}"}).content.decode()
    assert "so far" not in body and "20.000 GPU-hours" in body and 'href="/billing/" aria-current="page"' in body
    invoice = invoices.finalize(world.t1.tenant.pk, last)
    body = client.get("/billing/").content.decode()
    assert invoice.number in body and "so far" in body
    page = client.get(f"/billing/invoices/{invoice.pk}/").content.decode()
    assert f"Invoice {invoice.number}" in page and invoice.digest in page and "window.print()" in page
    sheet = client.get(f"/billing/invoices/{invoice.pk}/csv/")
    assert sheet["Content-Type"].startswith("text/csv") and invoice.number in sheet.content.decode()
    assert console("t1_member").get("/billing/").status_code == 403
    assert "/billing/" not in console("t1_member").get("/").content.decode()
    assert console("t2_owner").get(f"/billing/invoices/{invoice.pk}/").status_code == 404


def test_an_admin_sets_a_budget_on_the_billing_page(console, world):
    client = console("t1_admin")
    body = client.post("/billing/budgets/", {"team": world.t1.team.pk, "amount": "750.00", "thresholds": "50, 90",
                                             "hard_stop": "on"}, follow=True).content.decode()
    assert "budget is 750.00 a month" in body and "hard stop" in body and "Told at 50, 90 %" in body
    body = client.post("/billing/budgets/", {"team": world.t1.team.pk, "amount": "lots"}, follow=True).content.decode()
    assert "give the amount as a number" in body
    body = client.post("/billing/budgets/", {"team": "not-a-team", "amount": "5"}, follow=True).content.decode()
    assert "Choose whose budget it is" in body
    body = client.post("/billing/budgets/", {"amount": "-5"}, follow=True).content.decode()
    assert "more than zero" in body
    assert console("t1_member").post("/billing/budgets/", {"amount": "1"}).status_code == 403
