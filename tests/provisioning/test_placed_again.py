"""
A reservation placed again -- back to the queue after its provisioning failed on a node, or its
failed hardware replaced -- keeps the spend of the time it held: spend is what its allocations
held, never re-derived from where it stands now, and it never goes down. Why it was placed again
stays on it (the API's fields, a line on its console page) after its state has moved on.
"""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.db import transaction
from django.test import Client

from cloud.models import GPU, Node
from provisioning import usage
from provisioning.lifecycle import start as starting
from provisioning.lifecycle.replacement import node_failed
from provisioning.models import Reservation
from tests.provisioning.factories import held, make_reservation, offering
from tests.provisioning.test_replacement import activate
from tests.world import small_fleet
from web.console import SESSION_TENANT

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 10, 10, 0, tzinfo=UTC)
REASON = ("Provisioning failed on a node (The node agent of us-east-1-ib-a-n0000 has not been heard since 10:00:00 "
          "UTC); placing the reservation again, keeping its place in the queue.")


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(8)


def gpus_of(hostname: str) -> list:
    return list(GPU.objects.filter(node__hostname=hostname).order_by("index"))


def spend(world, at: datetime) -> Decimal:
    with time_machine.travel(at, tick=False):
        return usage.month_to_date(Reservation.objects.filter(tenant=world.t1.tenant), at).amount


def test_spend_keeps_the_hours_of_a_placement_given_up_and_never_goes_down(world, fleet):
    """8 GPUs at 2.00 an hour: an hour on n0000, given up, then 50 minutes on n0001 -- 16.00 + 13.33."""
    reservation = make_reservation(world, units=1, state="provisioning", offering=offering("bare_metal", 8),
                                   starts_at=T0, ends_at=T0 + timedelta(hours=4), scheduled_at=T0)
    held(reservation, gpus_of("us-east-1-ib-a-n0000"), start=T0, end=T0 + timedelta(hours=4))
    assert spend(world, T0 + timedelta(hours=1)) == Decimal("16.00")

    with time_machine.travel(T0 + timedelta(hours=1), tick=False), transaction.atomic():
        starting.requeue(Reservation.objects.select_for_update().get(pk=reservation.pk), REASON)
    queued = Reservation.objects.get(pk=reservation.pk)
    assert (queued.state, queued.starts_at) == ("queued", None)
    assert spend(world, T0 + timedelta(minutes=65)) == Decimal("16.00")  # what it held, not where it stands

    # The scheduler places it again at 10:10 on another node, its window starting then.
    again = T0 + timedelta(minutes=70)
    Reservation.objects.filter(pk=reservation.pk).update(state="provisioning", starts_at=again,
                                                         ends_at=again + timedelta(hours=4))
    held(reservation, gpus_of("us-east-1-ib-a-n0001"), start=again, end=again + timedelta(hours=4))
    amounts = [spend(world, T0 + timedelta(minutes=m)) for m in (60, 65, 70, 90, 120)]
    assert amounts == sorted(amounts)  # never down
    assert amounts[-1] == Decimal("16.00") + Decimal("13.33")

    placed = Reservation.objects.get(pk=reservation.pk)
    assert (placed.replacements, placed.replaced_at, placed.replacement_reason) == (1, T0 + timedelta(hours=1),
                                                                                    REASON)


def test_a_failed_node_leaves_the_spend_counted_so_far_as_it_was(world, fleet, steps):
    """Detected 5 minutes after its last heartbeat: the time billed until detection is not taken back."""
    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    node = Node.objects.get(instances__reservation_id=pk, instances__state="active")
    now = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    before = spend(world, now)
    with time_machine.travel(now, tick=False):
        node_failed(node=node, cause="heartbeat_lost", summary="no heartbeat for 3 periods", evidence={},
                    impact_started_at=now - timedelta(minutes=5), detected_at=now)
    assert spend(world, now) >= before
    replaced = Reservation.objects.get(pk=pk)
    assert replaced.replacements == 1 and replaced.replaced_at == now
    assert replaced.replacement_reason.startswith(f"Server {node.hostname} failed (heartbeat_lost) at ")
    assert "placed again on other hardware in the same network" in replaced.replacement_reason


def test_the_reason_of_the_last_replacement_is_in_the_api_and_on_the_console_page(world, fleet):
    reservation = make_reservation(world, units=1, state="provisioning", offering=offering("bare_metal", 8),
                                   starts_at=T0, ends_at=T0 + timedelta(hours=4))
    with time_machine.travel(T0 + timedelta(hours=1), tick=False), transaction.atomic():
        starting.requeue(Reservation.objects.select_for_update().get(pk=reservation.pk), REASON)
    Reservation.objects.filter(pk=reservation.pk).update(state="scheduled", state_reason="")  # placed again

    api = world.client("t1_viewer").get(f"/api/v1/reservations/{reservation.pk}/").json()
    assert (api["replacements"], api["replacement_reason"]) == (1, REASON)
    assert api["replaced_at"].startswith("2026-11-10T11:00:00")
    never = make_reservation(world, units=1, state="queued")
    assert world.client("t1_viewer").get(f"/api/v1/reservations/{never.pk}/").json()["replacements"] == 0

    console = Client()
    console.force_login(world.users["t1_viewer"])
    session = console.session
    session[SESSION_TENANT] = world.t1.tenant.slug
    session.save()
    page = console.get(f"/reservations/{reservation.pk}/").content.decode()
    assert 'id="replacement"' in page and "Placed again 1 time" in page and "Nov 10, 11:00 UTC" in page
    assert "The node agent of us-east-1-ib-a-n0000 has not been heard since 10:00:00 UTC" in page
    assert 'id="replacement"' not in console.get(f"/reservations/{never.pk}/").content.decode()
