"""
The price book and usage through the API: platform admins add future prices (a past start, a
negative or non-decimal amount, a start taken are refused, nothing written); everyone reads them;
a tenant reads its own metered usage by day, never another's.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing import invoices
from billing.meter import hour_floor, meter_run
from billing.models import Price
from cloud.models import Region
from security.models import AuditEvent
from tests.billing.test_meter import ran
from tests.world import vm_offering

pytestmark = pytest.mark.django_db
URL = "/api/v1/prices/"


def body(**extra):
    return {"offering": vm_offering().slug, "term": "on_demand", "per_gpu_hour": "2.150000",
            "effective_from": (timezone.now() + timedelta(days=2)).isoformat(), **extra}


def code(answer) -> str:
    return answer.json()["errors"][0]["code"]


def test_a_platform_admin_adds_a_future_price_and_everyone_reads_it(world):
    Region.objects.get_or_create(slug="us-east-1", defaults={"name": "US East"})
    answer = world.client("platform_admin").post(URL, body(region="us-east-1"), format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["per_gpu_hour"] == "2.150000" and answer.json()["region"] == "us-east-1"
    assert AuditEvent.objects.filter(action="price.add").count() == 1
    listed = world.client("t1_viewer").get(URL, {"offering": vm_offering().slug}).json()["results"]
    assert [p["per_gpu_hour"] for p in listed] == ["2.150000"]


@pytest.mark.parametrize(("change", "status", "error"), [
    ({"effective_from": "2020-01-01T00:00:00Z"}, 400, "effective_in_past"),
    ({"per_gpu_hour": "-1.00"}, 400, "min_value"),
    ({"per_gpu_hour": 2.15}, 400, "invalid"),
    ({"per_gpu_hour": "two"}, 400, "invalid"),
    ({"currency": "usd"}, 400, "invalid"),
    ({"term": "forever"}, 400, "invalid_choice"),
])
def test_bad_prices_are_refused_and_nothing_is_written(world, change, status, error):
    answer = world.client("platform_admin").post(URL, body(**change), format="json")
    assert answer.status_code == status and code(answer) == error, answer.content
    assert not Price.objects.exists()


def test_a_price_starting_when_another_does_is_a_conflict(world):
    when = (timezone.now() + timedelta(days=3)).isoformat()
    assert world.client("platform_admin").post(URL, body(effective_from=when), format="json").status_code == 201
    again = world.client("platform_admin").post(URL, body(effective_from=when, per_gpu_hour="3.00"), format="json")
    assert again.status_code == 409 and code(again) == "price_period_taken"
    assert Price.objects.count() == 1


def test_a_tenant_reads_its_metered_usage_by_day_and_never_anothers(world):
    now = hour_floor(timezone.now())
    ran(world, start=now - timedelta(hours=2), end=now)
    meter_run(now=now)
    mine = world.client("t1_member").get("/api/v1/usage/", {"period": "day"}).json()["results"]
    assert mine and all(row["resource"] == "gpu" for row in mine)
    assert sum(float(row["quantity"]) for row in mine) == 2 * 2 * 3600
    assert world.client("t2_member").get("/api/v1/usage/", {"period": "day"}).json()["results"] == []


def test_invoices_through_the_api_draft_final_csv_credit_note_and_no_edit(world):
    this = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last = (this - timedelta(days=1)).replace(day=1)
    ran(world, start=last + timedelta(days=1), end=last + timedelta(days=1, hours=3))
    meter_run(now=this)
    admin = world.client("t1_admin")
    draft = admin.get("/api/v1/invoices/current/", {"month": f"{last:%Y-%m}"}).json()
    assert draft["state"] == "draft" and draft["number"] == "" and draft["id"] is None and len(draft["lines"]) == 1
    assert admin.get("/api/v1/invoices/current/", {"month": "2026-13"}).status_code == 400
    assert world.client("t1_member").get("/api/v1/invoices/").status_code == 403  # admins and owners read invoices

    invoice = invoices.finalize(world.t1.tenant.pk, last)
    shown = admin.get(f"/api/v1/invoices/{invoice.pk}/").json()
    assert shown["number"] == invoice.number and shown["total"] == draft["total"]
    sheet = admin.get(f"/api/v1/invoices/{invoice.pk}/csv/")
    assert sheet["Content-Type"].startswith("text/csv") and invoice.number in sheet.content.decode()
    assert sheet.content.decode().splitlines()[-1].endswith(f",{invoice.total},USD")
    edit = admin.patch(f"/api/v1/invoices/{invoice.pk}/", {"total": "0.00"}, format="json")
    assert edit.status_code == 409 and code(edit) == "invoice_final"
    assert world.client("t2_owner").get(f"/api/v1/invoices/{invoice.pk}/").status_code == 404
    assert admin.post(f"/api/v1/invoices/{invoice.pk}/credit-notes/", {"amount": "1.00", "reason": "x"},
                      format="json").status_code == 403
    note = world.client("platform_admin").post(f"/api/v1/invoices/{invoice.pk}/credit-notes/",
                                               {"amount": "1.00", "reason": "Goodwill"}, format="json")
    assert note.status_code == 201 and note.json()["total"] == "-1.00" and note.json()["corrects"] == invoice.number
