"""
The fast path's hint (free_hint.py): a create within MERIDIAN_FAST_PATH_HINT_SECONDS of a read of
the pool reads only the nodes that read chose, and what it plans on is still exact -- GPUs taken
meanwhile, a node gone out of service or a quarantined GPU are never placed on, and when the hinted
nodes do not hold the request it reads the pool again.
"""

from datetime import timedelta
from unittest import mock

import pytest
from django.db import transaction
from django.utils import timezone

from cloud.fleet import FleetSpec, build_fleet
from cloud.models import GPU, Node, Region
from provisioning.allocations import allocation_bind
from provisioning.models import Allocation, Reservation
from provisioning.scheduling import free_hint
from provisioning.scheduling.plan_types import Assignment
from tenants.choices import QuotaResource
from tenants.models import Quota
from tests.provisioning.factories import make_reservation, offering
from tests.world import small_fleet, vm_offering

URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(8)


def create(world, gpus=1, *, nodes=None):
    size = {"offering": offering("bare_metal", 8).slug, "nodes": nodes} if nodes else {
        "offering": vm_offering(gpus).slug, "gpus": gpus}
    response = world.client("t1_member").post(URL, {
        "name": "now", **size, "regions": ["us-east-1"], "duration_hours": 1}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def gpus_of(reservation_id) -> set:
    return set(Allocation.objects.filter(reservation_id=reservation_id).values_list("gpu_id", flat=True))


def node_of(reservation_id):
    return Allocation.objects.filter(reservation_id=reservation_id).values_list("node_id", flat=True).first()


def take(world, gpus):
    """Another writer (the scheduler, another process) takes these GPUs: the hint does not know."""
    holder = make_reservation(world, state="scheduled")
    now = timezone.now()
    with transaction.atomic():
        allocation_bind(reservation=holder, starts_at=now, ends_at=now + timedelta(hours=2), assignments=[
            Assignment(node_id=g.node_id, gpu_id=g.pk, mem_lo=0, mem_hi=g.memory_mib) for g in gpus])


def reads(spy):
    """Per free_snapshot call: 'hinted' (only the hint's nodes) or 'pool'."""
    return ["hinted" if call.kwargs.get("nodes") is not None else "pool" for call in spy.call_args_list]


def test_a_create_after_a_read_of_the_pool_reads_only_the_hinted_nodes(world, fleet):
    with mock.patch.object(free_hint, "free_snapshot", wraps=free_hint.free_snapshot) as spy:
        first = create(world)
        second = create(world)
    assert first["state"] == second["state"] == "scheduled"
    assert reads(spy) == ["pool", "hinted"]
    assert node_of(first["id"]) == node_of(second["id"])  # best fit still: the host already in use
    assert not gpus_of(first["id"]) & gpus_of(second["id"])


def test_bare_metal_reads_a_few_whole_free_nodes_of_the_tightest_leaf(world, fleet):
    with mock.patch.object(free_hint, "free_snapshot", wraps=free_hint.free_snapshot) as spy:
        first = create(world, nodes=1)
        second = create(world, nodes=1)
    assert first["state"] == second["state"] == "scheduled"
    assert reads(spy) == ["pool", "hinted"]
    hinted = spy.call_args_list[1].kwargs["nodes"]
    assert 1 <= len(hinted) <= 3 and Node.objects.filter(pk__in=hinted).values("leaf_id").distinct().count() == 1
    leaves = Node.objects.filter(pk__in=[node_of(first["id"]), node_of(second["id"])]).values("leaf_id")
    assert leaves.distinct().count() == 1  # the second went where the first did: the tightest leaf


def test_bare_metal_creates_go_on_from_one_read_of_the_pool_leaf_by_leaf(world):
    """The read of the pool keeps whole-free nodes beyond the two smallest leaves: the creates after
    it read only hinted nodes, and fill the smallest leaf before they start on the next."""
    Reservation.objects.all().delete()
    small_fleet(96)  # three leaves of 32 nodes
    metal = Node.objects.filter(pool="bare_metal", is_spare=False).order_by("hostname")
    by_leaf = {}
    for node in metal:
        by_leaf.setdefault(node.leaf_id, []).append(node.pk)
    assert len(by_leaf) == 3
    kept = {leaf: nodes[:size] for (leaf, nodes), size in zip(by_leaf.items(), (4, 2, 3), strict=True)}
    metal.exclude(pk__in=[pk for nodes in kept.values() for pk in nodes]).update(state="maintenance")
    Quota.objects.update_or_create(tenant=world.t1.tenant, team=None, resource=QuotaResource.GPUS, gpu_model=None,
                                   defaults={"limit": 1000})
    with mock.patch.object(free_hint, "free_snapshot", wraps=free_hint.free_snapshot) as spy:
        made = [create(world, nodes=1) for _ in range(9)]
    assert reads(spy) == ["pool"] + ["hinted"] * 8
    assert len({node_of(r["id"]) for r in made}) == 9
    leaves = [Node.objects.get(pk=node_of(r["id"])).leaf_id for r in made]
    assert leaves == [leaf for leaf in sorted(kept, key=lambda leaf: len(kept[leaf])) for _ in kept[leaf]]


def test_gpus_taken_behind_the_hints_back_are_never_placed_on(world, fleet):
    first = create(world)
    host = Node.objects.get(pk=node_of(first["id"]))
    taken = list(host.gpus.exclude(pk__in=gpus_of(first["id"])))
    take(world, taken)  # the hinted best fit is now full
    with mock.patch.object(free_hint, "free_snapshot", wraps=free_hint.free_snapshot) as spy:
        second = create(world)
    assert second["state"] == "scheduled"
    assert not gpus_of(second["id"]) & ({g.pk for g in taken} | gpus_of(first["id"]))
    assert reads(spy)[0] == "hinted"


def test_a_node_out_of_service_or_a_quarantined_gpu_is_not_placed_on_though_hinted(world, fleet):
    first = create(world)
    host = Node.objects.get(pk=node_of(first["id"]))
    quarantined = host.gpus.exclude(pk__in=gpus_of(first["id"])).order_by("index").first()
    GPU.objects.filter(pk=quarantined.pk).update(state="quarantined")
    second = create(world)
    assert second["state"] == "scheduled" and quarantined.pk not in gpus_of(second["id"])
    Node.objects.filter(pk=host.pk).update(state="maintenance")
    third = create(world)
    assert third["state"] == "scheduled" and node_of(third["id"]) != host.pk


def test_when_the_hinted_nodes_do_not_hold_it_the_pool_is_read_again(world, fleet, monkeypatch):
    monkeypatch.setattr(free_hint, "HINT_SPARE", 0)  # the read of the pool hints one node only
    first = create(world)
    host = Node.objects.get(pk=node_of(first["id"]))
    take(world, host.gpus.exclude(pk__in=gpus_of(first["id"])))
    with mock.patch.object(free_hint, "free_snapshot", wraps=free_hint.free_snapshot) as spy:
        second = create(world)
    assert reads(spy) == ["hinted", "pool"]
    assert second["state"] == "scheduled" and node_of(second["id"]) != host.pk


def test_the_hint_is_off_at_zero_seconds(world, fleet, settings):
    settings.MERIDIAN_FAST_PATH_HINT_SECONDS = 0
    with mock.patch.object(free_hint, "free_snapshot", wraps=free_hint.free_snapshot) as spy:
        create(world)
        create(world)
    assert reads(spy) == ["pool", "pool"]


def test_an_old_hint_is_not_used(world, fleet, settings):
    create(world)
    with (mock.patch.object(free_hint.time, "monotonic", return_value=free_hint.time.monotonic() + 60),
          mock.patch.object(free_hint, "free_snapshot", wraps=free_hint.free_snapshot) as spy):
        create(world)
    assert reads(spy) == ["pool"]


def test_the_first_region_asked_is_filled_first_though_another_fits_tighter(world, monkeypatch):
    """Best fit never outranks the order of the regions asked: a host with two free GPUs in the second
    region does not take a one-GPU ask while the first region has room."""
    Reservation.objects.all().delete()
    small_fleet(8)  # us-east-1, H100
    build_fleet(FleetSpec(regions=1, first_region=4, nodes_per_fabric=8, spare_ratio=0.25, shared_ratio=0.25))
    second = Region.objects.get(slug="eu-north-1")
    assert GPU.objects.filter(node__region=second, model=vm_offering().gpu_model).exists()  # H100s there too
    tight = Node.objects.filter(region=second, pool="shared", is_spare=False).order_by("hostname").first()
    take(world, tight.gpus.order_by("index")[:6])
    for hint_spare in (free_hint.HINT_SPARE, 0):
        monkeypatch.setattr(free_hint, "HINT_SPARE", hint_spare)
        for _ in range(3):  # the pool read, then hinted reads
            response = world.client("t1_member").post(URL, {
                "name": "burst", "offering": vm_offering(1).slug, "gpus": 1, "regions": ["us-east-1", "eu-north-1"],
                "duration_hours": 1}, format="json").json()
            assert response["state"] == "scheduled" and response["region"] == "us-east-1", response
        free_hint.FREE_HINT.clear()
