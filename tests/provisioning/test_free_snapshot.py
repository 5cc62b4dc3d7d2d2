"""
The fast path's one-statement read of free capacity (``free_snapshot``) gives what the ORM's
reading gives -- ``load_snapshot(free_only=True)`` on the nodes ``free_candidates`` picks, and
again when those nodes are named (the fast path's hint) -- for
every rule that keeps a node or a GPU out, on both pools, with and without a fabric -- and a
create placed at once writes each of its rows once (either database).
"""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from cloud.catalogue import load_gpu_catalogue
from cloud.choices import pool_of
from cloud.fleet import FleetSpec, build_fleet
from cloud.models import GPU, Fabric, GPUModel, Node
from provisioning.choices import OperationKind, OperationState
from provisioning.models import Operation, Reservation
from provisioning.scheduling.plan_types import Request
from provisioning.scheduling.snapshot import free_candidates, free_snapshot, load_snapshot, places_read
from tests.provisioning.factories import held, make_reservation
from tests.world import h100


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    load_gpu_catalogue(GPUModel)
    build_fleet(FleetSpec(regions=1, nodes_per_fabric=16, fabrics_per_region=3, spare_ratio=0.125, shared_ratio=0.5))
    return Node.objects.filter(is_spare=False)


def hold(world, gpus, *, start, end):
    held(make_reservation(world, state="scheduled"), gpus, start=start, end=end)


def ask(kind, units, gpus_per_unit, *, now, model=None, fabric=None, hours=2):
    return Request(reservation_id=uuid.uuid4(), kind=kind, gpu_model_ids=(model or h100().pk,),
                   regions=("us-east-1",), units=units, gpus_per_unit=gpus_per_unit, start=now,
                   end=now + timedelta(hours=hours), priority=0.5, fabric_id=fabric)


def reference(request, now):
    """What the ORM reads for the same request (the embedded default's path)."""
    candidates = free_candidates(request, now=now)
    if not candidates:
        return None
    snapshot = load_snapshot(now=now, until=request.end, regions=request.regions,
                             gpu_model_ids=request.gpu_model_ids, pool=pool_of(request.kind), free_only=True,
                             node_ids=candidates)
    if not places_read(request):  # no link to choose: the statement leaves where each GPU sits out
        for gpu in (gpu for node in snapshot.nodes for gpu in node.gpus):
            gpu.nvlink_domain = gpu.pcie_switch = gpu.numa_node = None
    return snapshot


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one statement is PostgreSQL's")
def test_one_statement_reads_what_the_orm_reads(world, fleet, django_assert_num_queries):
    now = timezone.now()
    shared = list(fleet.filter(pool="shared").order_by("hostname"))
    metal = list(fleet.filter(pool="bare_metal").order_by("hostname"))
    assert len(shared) >= 8 and len(metal) >= 8
    # Every rule that keeps capacity out: a node out of service, one under attestation, an
    # unhealthy node, a quarantined and a failed GPU, GPUs busy now, busy later in the window,
    # busy only after it, and whole nodes taken.
    Node.objects.filter(pk__in=[shared[0].pk, metal[0].pk]).update(state="maintenance")
    Node.objects.filter(pk=metal[1].pk).update(health="failed")
    Operation.objects.create(node=shared[1], kind=OperationKind.ATTEST, state=OperationState.RUNNING)
    Operation.objects.create(node=metal[2], kind=OperationKind.ATTEST, state=OperationState.PENDING)
    Operation.objects.create(node=metal[3], kind=OperationKind.ATTEST, state=OperationState.SUCCEEDED)
    GPU.objects.filter(pk=shared[2].gpus.first().pk).update(state="quarantined")
    GPU.objects.filter(pk=metal[4].gpus.last().pk).update(health="failed")
    hold(world, shared[3].gpus.all()[:6], start=now - timedelta(hours=1), end=now + timedelta(hours=1))
    hold(world, shared[4].gpus.all()[:3], start=now + timedelta(hours=1), end=now + timedelta(hours=4))
    hold(world, shared[5].gpus.all()[:7], start=now + timedelta(hours=5), end=now + timedelta(hours=6))
    hold(world, shared[6].gpus.all()[:1], start=now - timedelta(hours=3), end=now - timedelta(hours=2))
    hold(world, metal[5].gpus.all()[:1], start=now, end=now + timedelta(hours=1))
    hold(world, metal[6].gpus.all(), start=now + timedelta(hours=1), end=now + timedelta(hours=2))
    fabric = Fabric.objects.order_by("slug").last().pk
    # Leaves with different numbers of whole free nodes, so the choice of leaves is seen.
    hold(world, GPU.objects.filter(node__in=[n for n in metal if n.fabric_id == fabric][:2]), start=now,
         end=now + timedelta(hours=1))
    other_model = GPUModel.objects.exclude(pk=h100().pk).first().pk

    requests = [
        ask("vm", 1, 1, now=now), ask("vm", 3, 2, now=now), ask("vm", 2, 8, now=now), ask("container", 5, 1, now=now),
        ask("vm", 1, 1, now=now, hours=8), ask("vm", 4, 4, now=now, fabric=fabric), ask("vm", 500, 8, now=now),
        ask("vm", 1, 1, now=now, model=other_model),
        ask("bare_metal", 1, 8, now=now), ask("bare_metal", 3, 8, now=now), ask("bare_metal", 2, 8, now=now, hours=1),
        ask("bare_metal", 2, 8, now=now, fabric=fabric), ask("bare_metal", 40, 8, now=now),
    ]
    settled = 0
    for request in requests:
        expected = reference(request, now)
        with django_assert_num_queries(1):
            got = free_snapshot(request, now=now)
        assert got == expected, request
        settled += got is not None
        if expected is not None:  # the same nodes read again by id (the fast path's hint) read the same
            with django_assert_num_queries(1):
                assert free_snapshot(request, now=now, nodes=[n.node_id for n in expected.nodes]) == expected
    assert settled == 10  # the three that cannot be settled from free capacity say so (None)
    # and what is kept out is never read
    read = {n.node_id for r in requests if (s := free_snapshot(r, now=now)) for n in s.nodes}
    assert not read & {shared[0].pk, shared[1].pk, metal[0].pk, metal[1].pk, metal[2].pk}
    # nor when asked for by id: only the sellable node's free GPUs come back
    by_id = free_snapshot(ask("vm", 1, 1, now=now), now=now, nodes=[shared[0].pk, shared[1].pk, shared[7].pk])
    assert [n.node_id for n in by_id.nodes] == [shared[7].pk]


def test_a_create_placed_at_once_writes_each_row_once(world, fleet):
    """Scored and placed before the INSERT, its operation opened already succeeded: no UPDATE comes back to them."""
    from django.test.utils import CaptureQueriesContext

    from tests.world import vm_offering

    body = {"name": "now", "offering": vm_offering(1).slug, "gpus": 1, "regions": ["us-east-1"], "duration_hours": 1}
    client = world.client("t1_member")
    with CaptureQueriesContext(connection) as queries:
        response = client.post("/api/v1/reservations/", body, format="json")
    assert response.json()["state"] == "scheduled", response.json()
    statements = [q["sql"] for q in queries.captured_queries]
    assert not [s for s in statements if s.startswith('UPDATE "provisioning_operation"')]
    assert not [s for s in statements if s.startswith('UPDATE "provisioning_reservation"')]  # born scheduled
    # once (on PostgreSQL, in the statement that stores the placed create with all that goes with it)
    assert len([s for s in statements if 'INSERT INTO "provisioning_reservation"' in s]) == 1
    assert len([s for s in statements if s.startswith('SELECT "cloud_region"')]) <= 1  # the ask's, not again
    reservation = Reservation.objects.get(pk=response.json()["id"])
    stored = reservation.score
    assert stored > 0 and reservation.score_breakdown["total"] == stored
    age = next(f for f in reservation.score_breakdown["factors"] if f["name"] == "age")
    assert age["contribution"] == 0  # scored as it was stored: it had waited nothing
    operation = Operation.objects.get(reservation=reservation, kind="place")
    assert (operation.state, operation.progress) == ("succeeded", 100)
