"""The console's billing pages: the month's draft, invoices issued, one printable, its CSV; admins and owners."""

from datetime import timedelta

import pytest
from django.utils import timezone

from billing import invoices
from billing.meter import meter_run
from billing.models import Commitment, CreditGrant
from tests.billing.test_meter import ran
from tests.world import small_fleet, vm_offering

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


def test_an_admin_commits_on_the_billing_page_and_cancels_one_not_started(console, world):
    small_fleet(4)
    client = console("t1_admin")
    body = client.get("/billing/").content.decode()
    assert "No commitment yet" in body and vm_offering().name in body and "USD/GPU-h" in body
    later = (timezone.now() + timedelta(days=5)).strftime("%Y-%m-%d")
    body = client.post("/billing/commitments/", {"name": "year-one", "offering": vm_offering().slug,
                                                 "region": "us-east-1", "gpus": "2", "months": "12",
                                                 "starts_at": later}, follow=True).content.decode()
    assert "year-one: 2 GPUs of" in body and "for 12 months at" in body and "Cancel</button>" in body
    body = client.post("/billing/commitments/", {"name": "huge", "offering": vm_offering().slug,
                                                 "region": "us-east-1", "gpus": "9999", "months": "1"},
                       follow=True).content.decode()
    assert "a commitment holds at most that many" in body
    body = client.post("/billing/commitments/", {"name": "x", "offering": "nope", "region": "us-east-1",
                                                 "gpus": "2", "months": "1"}, follow=True).content.decode()
    assert "Choose an offering and a region" in body
    made = Commitment.objects.get(name="year-one")
    assert console("t2_owner").post(f"/billing/commitments/{made.pk}/cancel/").status_code == 404
    body = client.post(f"/billing/commitments/{made.pk}/cancel/", follow=True).content.decode()
    assert "year-one is cancelled" in body
    assert console("t1_member").post("/billing/commitments/", {"name": "m"}).status_code == 403


def test_the_billing_page_shows_the_prepaid_credit_left(console, world):
    assert "Prepaid credit" not in console("t1_admin").get("/billing/").content.decode()
    CreditGrant.objects.create(tenant=world.t1.tenant, amount="250.00", note="Prepayment", granted_at=timezone.now())
    body = console("t1_admin").get("/billing/").content.decode()
    assert "Prepaid credit" in body and "250.00 USD left" in body
    assert "Prepaid credit" not in console("t2_owner").get("/billing/").content.decode()
