"""
Prepaid credit (billing.credits): platform admins grant it; each month's invoice draws on what is
left after its SLA credit as a negative line; the balance burns down in real time with the ledger;
bad grants are refused with nothing written; a tenant reads only its own.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import invoices
from billing.meter import meter_run
from billing.models import CreditGrant, InvoiceLine
from billing.reconcile import reconcile
from tests.billing.test_meter import ran

pytestmark = pytest.mark.django_db
URL = "/api/v1/credits/"


def code(answer) -> str:
    return answer.json()["errors"][0]["code"]


def test_invoices_draw_on_the_credit_until_it_is_spent_and_the_balance_burns_down(world):
    this = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last = (this - timedelta(days=1)).replace(day=1)
    answer = world.client("platform_admin").post(URL, {"tenant": world.t1.tenant.slug, "amount": "30.00",
                                                       "note": "Prepayment, order 118"}, format="json")
    assert answer.status_code == 201, answer.content
    CreditGrant.objects.update(granted_at=last)  # granted at the start of last month
    ran(world, start=last + timedelta(days=1), end=last + timedelta(days=1, hours=5))  # 10 GPU-hours: 24.90
    ran(world, start=this, end=this + timedelta(hours=1))  # this month: 2 GPU-hours, 4.98
    meter_run(now=this + timedelta(hours=2))
    invoice = invoices.finalize(world.t1.tenant.pk, last, now=this + timedelta(hours=2))
    prepaid = invoice.lines.get(kind="prepaid")
    assert prepaid.amount == Decimal("-24.90") and invoice.total == Decimal("0.00")
    assert "5.10 left after this" in prepaid.description
    now = this + timedelta(hours=2)
    left = invoices.credit_balance(world.t1.tenant.pk, now)
    assert (left.granted, left.taken, left.pending, left.remaining) == (
        Decimal("30.00"), Decimal("24.90"), Decimal("4.98"), Decimal("0.12"))
    draft = invoices.draft(world.t1.tenant.pk, this, now)
    assert draft.invoice.total == Decimal("0.00")  # this month so far, paid from what is left
    assert reconcile(last, this) == []


def test_a_tenant_admin_reads_its_balance_and_grants_and_never_anothers(world):
    CreditGrant.objects.create(tenant=world.t2.tenant, amount="99.00", note="theirs", granted_at=timezone.now())
    world.client("platform_admin").post(URL, {"tenant": world.t1.tenant.slug, "amount": "100.00",
                                              "note": "Goodwill"}, format="json")
    mine = world.client("t1_admin").get(URL).json()["results"]
    assert [g["amount"] for g in mine] == ["100.00"]
    balance = world.client("t1_admin").get(f"{URL}balance/").json()
    assert balance["remaining"] == "100.00" and balance["granted"] == "100.00"


@pytest.mark.parametrize(("change", "error"), [
    ({"amount": "-5.00"}, "min_value"),
    ({"amount": 5.0}, "invalid"),
    ({"amount": "lots"}, "invalid"),
    ({"note": ""}, "blank"),
    ({"tenant": "no-such-tenant"}, "does_not_exist"),
])
def test_bad_grants_are_refused_and_nothing_is_written(world, change, error):
    body = {"tenant": world.t1.tenant.slug, "amount": "10.00", "note": "Prepayment", **change}
    answer = world.client("platform_admin").post(URL, body, format="json")
    assert answer.status_code == 400 and code(answer) == error, answer.content
    assert not CreditGrant.objects.exists() and not InvoiceLine.objects.filter(kind="prepaid").exists()
