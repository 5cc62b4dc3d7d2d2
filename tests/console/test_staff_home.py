"""
The staff console's landing page: what needs a person now -- nodes, stuck and failed operations,
failed validations, open incidents, the queue's waits -- each linking to where to act; a 404
for tenants; a fixed number of queries however many problems there are.
"""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from cloud.choices import NodeState
from cloud.models import Node
from operations.problems import _percentile, queue_waits
from provisioning.models import Operation, Reservation
from security.models import Incident
from tests.provisioning.pipeline import reserve_on_small_fleet
from tests.world import small_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(world):
    return small_fleet(6)


def _break(fleet, now):
    faulty, suspect = fleet[0], fleet[1]
    Node.objects.filter(pk=faulty.pk).update(state=NodeState.FAULTY, state_reason="XID 79: GPU fell off the bus")
    Node.objects.filter(pk=suspect.pk).update(state=NodeState.SUSPECT, state_reason="no heartbeat for 95 s")
    reservation = Reservation.objects.filter(tenant__isnull=False).first()
    Operation.objects.create(kind="provision", state="failed", step="write_image", error="BMC refused: 401",
                             reservation=reservation, tenant=reservation.tenant, finished_at=now)
    Operation.objects.create(kind="validate", state="failed", step="burn_in", error="GPU memory is not clear",
                             node=fleet[2], finished_at=now)
    stuck = Operation.objects.create(kind="release", state="running", step="scrub", reservation=reservation,
                                     tenant=reservation.tenant)
    Operation.objects.filter(pk=stuck.pk).update(updated_at=now - timedelta(hours=2))
    Incident.objects.create(kind="gpu_lost", summary="GPU 3 lost on a node", node_id=faulty.pk, gpus_affected=1)
    Incident.objects.create(kind="gpu_lost", summary="long over", resolved_at=now)
    return faulty, suspect, reservation


def test_the_problems_page_lists_what_is_wrong_with_links_to_act(console, fleet):
    faulty, suspect, reservation = _break(fleet, timezone.now())
    page = console("platform_admin").get("/staff/").content.decode()
    nodes = page.split('id="nodes-title"')[1].split("</section>")[0]
    assert nodes.index(faulty.hostname) < nodes.index(suspect.hostname)  # the worst first
    assert reverse("staff-node", args=[faulty.pk]) in nodes and "XID 79" in nodes
    operations = page.split('id="ops-title"')[1].split("</section>")[0]
    assert "Stuck" in operations and "untouched 2" in operations
    assert "BMC refused: 401" in operations and reverse("reservation-detail", args=[reservation.pk]) in operations
    assert "Nodes failing validation" in operations and fleet[2].hostname in operations
    incidents = page.split('id="incidents-title"')[1].split("</section>")[0]
    assert "GPU 3 lost" in incidents and "long over" not in incidents and "ongoing" in incidents
    assert reverse("staff-node", args=[faulty.pk]) in incidents
    assert "Nothing needs a person" not in page
    assert console("platform_approver").get("/staff/").status_code == 200  # staff read it
    assert console("t1_owner").get("/staff/").status_code == 404


def test_the_worst_nodes_are_listed_first_however_many_wait(world):
    from operations.problems import LISTED, problems_now

    now = timezone.now()
    Node.objects.all().delete()
    nodes = small_fleet(LISTED * 4 + 5)  # many more waiting than the page lists
    Node.objects.update(state=NodeState.SUSPECT, state_changed_at=now - timedelta(days=3))  # older than the faulty one
    Node.objects.filter(pk=nodes[-1].pk).update(state=NodeState.FAULTY, state_changed_at=now)
    listed = problems_now(now).nodes
    assert len(listed) == LISTED and listed[0]["hostname"] == nodes[-1].hostname
    assert problems_now(now).nodes_total == len(nodes)  # the count is of them all, not of the list


def test_a_quiet_platform_says_so(console, fleet):
    Operation.objects.filter(state__in=["failed", "running", "pending"]).delete()
    Incident.objects.all().delete()
    Node.objects.exclude(state__in=[NodeState.AVAILABLE, NodeState.IN_SERVICE, NodeState.ALLOCATED]).update(
        state=NodeState.AVAILABLE)
    Node.objects.update(health="healthy")
    assert "Nothing needs a person" in console("platform_admin").get("/staff/").content.decode()


def test_queue_waits_are_nearest_rank_percentiles(world):
    assert _percentile([], 0.5) is None
    assert _percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0 and _percentile([1.0, 2.0, 3.0, 4.0], 0.95) == 4.0
    now = timezone.now()
    Reservation.objects.filter(pk=Reservation.objects.order_by("pk").values("pk")[:1]).update(state="queued")
    Reservation.objects.filter(state="queued").update(submitted_at=now - timedelta(minutes=30))
    waits = queue_waits(now)
    assert waits["depth"] == Reservation.objects.filter(state="queued").count() > 0
    assert 1799 <= waits["p50_s"] <= 1801 and 1799 <= waits["longest_s"] <= 1801


def test_the_page_reads_a_fixed_number_of_queries_however_many_problems(console, fleet):
    client = console("platform_admin")
    client.get("/staff/")  # warm the session and caches
    with CaptureQueriesContext(connection) as few:
        assert client.get("/staff/").status_code == 200
    _break(fleet, timezone.now())
    more = small_fleet(12)
    Node.objects.filter(pk__in=[n.pk for n in more]).update(state=NodeState.QUARANTINED)
    with CaptureQueriesContext(connection) as many:
        assert client.get("/staff/").status_code == 200
    assert len(many) == len(few), [q["sql"][:120] for q in many.captured_queries]


def test_staff_search_finds_nodes_reservations_tenants_gpus_and_who_held_an_address(console, world, steps):
    from provisioning.access_models import AddressAssignment
    from provisioning.models import Instance

    pk = reserve_on_small_fleet(world, name="needle-job")
    nodes = list(Node.objects.order_by("hostname"))
    steps.run()
    instance = Instance.objects.get(reservation_id=pk)
    client = console("platform_admin")

    def found(q):
        return client.get("/staff/search/", {"q": q}).content.decode()

    assert reverse("staff-node", args=[nodes[0].pk]) in found(nodes[0].hostname)
    assert reverse("reservation-detail", args=[pk]) in found("needle") and world.t1.tenant.name in found(pk)
    assert world.t1.tenant.slug in found(world.t1.tenant.name[:5])
    gpu = nodes[0].gpus.first()
    assert reverse("staff-node", args=[nodes[0].pk]) in found(gpu.uuid)
    private = AddressAssignment.objects.get(instance=instance, kind="private").address
    held = found(private)
    assert "Who held" in held and reverse("reservation-detail", args=[pk]) in held and "<strong>now</strong>" in held
    assert "Nothing matches" in found("no-such-thing-anywhere") and "at least two" in found("x")
    assert console("t1_owner").get("/staff/search/", {"q": "needle"}).status_code == 404
