"""
Inventory and catalogue: building a fleet, BMC secrets at rest and in the API, sellable
availability, what tenants may see, node maintenance, the transition guard and catalogue writes.
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import connection

from cloud.choices import GPUState, Health, IsolationMode, NodePool, NodeState, OfferingKind, SwitchTier
from cloud.fleet import GPUS_PER_NODE, HGX_PCI_BUS_IDS, NODES_PER_LEAF, FleetSpec, build_fleet
from cloud.models import GPU, Fabric, GPUModel, Node, Offering, Switch
from cloud.transitions import NODE_TRANSITIONS
from core.errors import InvalidTransition
from core.transitions import compare_and_set
from provisioning.capacity import availability
from security.crypto import decrypt
from security.models import AuditEvent
from tests.world import h100, small_fleet, unique

REGION = "us-east-1"  # build_fleet's first region; it sells H100s


def offering(kind=OfferingKind.VM, gpus_per_unit=1, slots_per_gpu=1, isolation=IsolationMode.EXCLUSIVE,
             model=None) -> Offering:
    return Offering.objects.create(
        slug=unique("offering"), name=unique("Offering"), kind=kind, gpu_model=model or h100(),
        gpus_per_unit=gpus_per_unit, slots_per_gpu=slots_per_gpu, isolation_mode=isolation,
        price_per_gpu_hour="2.4900",
    )


def units(o: Offering) -> dict:
    return availability([o])[o.pk].get(REGION, {"units": 0, "gpus": 0})


def assert_error(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:600])
    body = response.json()
    assert set(body) == {"type", "errors"}, body
    if code is not None:
        assert code in [e["code"] for e in body["errors"]], body
    return body


#
# Building a fleet
#


@pytest.mark.django_db
def test_build_fleet_fills_leaves_of_32_nodes():
    """Nodes hang off leaf switches, 32 to a leaf, filled in order; the last leaf takes the rest."""
    report = build_fleet(FleetSpec(regions=1, nodes_per_fabric=72))

    fabric = Fabric.objects.get()
    leaves = Switch.objects.filter(fabric=fabric, tier=SwitchTier.LEAF)
    per_leaf = Counter(Node.objects.values_list("leaf__name", flat=True))
    assert report.nodes == 72 and report.fabrics == 1
    assert leaves.count() == 3
    assert sorted(per_leaf.values(), reverse=True) == [NODES_PER_LEAF, NODES_PER_LEAF, 8]
    assert NODES_PER_LEAF == 32
    assert not Node.objects.exclude(leaf__tier=SwitchTier.LEAF).exists()
    assert not Node.objects.exclude(leaf__fabric=fabric).exists()
    assert Switch.objects.filter(fabric=fabric, tier=SwitchTier.SPINE).exists()


@pytest.mark.django_db
def test_build_fleet_gives_every_node_eight_gpus_on_the_hgx_bus_ids():
    """Each node has GPUs 0-7 on the eight HGX PCI bus ids, of the region's GPU model."""
    build_fleet(FleetSpec(regions=1, nodes_per_fabric=40))

    assert GPUS_PER_NODE == 8 and len(HGX_PCI_BUS_IDS) == 8
    for node in Node.objects.prefetch_related("gpus"):
        gpus = sorted(node.gpus.all(), key=lambda g: g.index)
        assert [g.index for g in gpus] == list(range(8)), node
        assert [g.pci_bus_id for g in gpus] == HGX_PCI_BUS_IDS, node
        assert {g.model.slug for g in gpus} == {"h100-80gb-sxm"}
        assert {g.memory_mib for g in gpus} == {80 * 1024}
    assert GPU.objects.count() == 40 * 8
    assert HGX_PCI_BUS_IDS[0] == "00000000:18:00.0" and HGX_PCI_BUS_IDS[-1] == "00000000:DB:00.0"


@pytest.mark.django_db
def test_build_fleet_keeps_spares_in_bare_metal_and_shared_hosts_in_service():
    """Spares exist only in the bare-metal pool; shared hosts start in_service, bare metal available."""
    build_fleet(FleetSpec(regions=1, nodes_per_fabric=64, spare_ratio=0.25, shared_ratio=0.5))

    spares = Node.objects.filter(is_spare=True)
    shared = Node.objects.filter(pool=NodePool.SHARED)
    bare = Node.objects.filter(pool=NodePool.BARE_METAL)
    assert spares.exists()
    assert set(spares.values_list("pool", flat=True)) == {NodePool.BARE_METAL}
    assert shared.count() == 32 and bare.count() == 32
    assert set(shared.values_list("state", flat=True)) == {NodeState.IN_SERVICE}
    assert set(bare.values_list("state", flat=True)) == {NodeState.AVAILABLE}
    assert set(Node.objects.values_list("health", flat=True)) == {Health.HEALTHY}


@pytest.mark.django_db
def test_build_fleet_gives_unique_gpu_uuids_and_serials():
    """Across two regions, no GPU UUID or serial repeats, and UUIDs have nvidia-smi's GPU- form."""
    build_fleet(FleetSpec(regions=2, nodes_per_fabric=48))

    uuids = list(GPU.objects.values_list("uuid", flat=True))
    serials = list(GPU.objects.values_list("serial", flat=True))
    assert len(uuids) == 2 * 48 * 8
    assert len(set(uuids)) == len(uuids)
    assert len(set(serials)) == len(serials)
    assert all(u.startswith("GPU-") for u in uuids)


@pytest.mark.django_db
def test_build_fleet_skips_fabrics_that_exist():
    """Building the same spec twice adds nothing the second time."""
    build_fleet(FleetSpec(regions=1, nodes_per_fabric=8))

    report = build_fleet(FleetSpec(regions=1, nodes_per_fabric=8))

    assert (report.fabrics, report.nodes, report.gpus) == (0, 0, 0)
    assert Node.objects.count() == 8


#
# BMC passwords
#


@pytest.mark.django_db
def test_bmc_password_is_encrypted_at_rest():
    """The column holds ciphertext that decrypts to the password; the model reads back the plaintext."""
    node = small_fleet(4)[0]
    node.bmc_password = "correct-horse-battery-staple"
    node.save()

    with connection.cursor() as cursor:
        cursor.execute("SELECT bmc_password FROM cloud_node WHERE id = %s", [node.pk])
        (stored,) = cursor.fetchone()
    assert stored != "correct-horse-battery-staple"
    assert "correct-horse" not in stored
    assert decrypt(stored) == "correct-horse-battery-staple"
    assert Node.objects.get(pk=node.pk).bmc_password == "correct-horse-battery-staple"


@pytest.mark.django_db
def test_fleet_bmc_passwords_are_all_encrypted_at_rest():
    """No node built by build_fleet has its password in the clear in the table."""
    nodes = small_fleet(8)
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, bmc_password FROM cloud_node")
        stored = dict(cursor.fetchall())
    for node in nodes:
        assert node.bmc_password
        assert stored[node.pk] != node.bmc_password
        assert node.bmc_password not in stored[node.pk]


def test_bmc_password_never_leaves_through_the_api(world):
    """Node list, detail and maintenance answers carry neither the password, its ciphertext, nor the key name."""
    nodes = small_fleet(8)
    with connection.cursor() as cursor:
        cursor.execute("SELECT bmc_password FROM cloud_node")
        ciphertexts = [row[0] for row in cursor.fetchall()]
    client = world.client("platform_admin")
    target = next(n for n in nodes if n.state == NodeState.AVAILABLE and not n.is_spare)
    responses = [
        client.get("/api/v1/nodes/", {"page_size": 200}),
        client.get(f"/api/v1/nodes/{target.pk}/"),
        client.post(f"/api/v1/nodes/{target.pk}/maintenance/", {"reason": "check"}, format="json"),
        client.delete(f"/api/v1/nodes/{target.pk}/maintenance/"),
    ]

    for response in responses:
        assert response.status_code == 200, response.content[:600]
        text = response.content.decode()
        assert "bmc_password" not in text
        assert "password" not in text
        for node in nodes:
            assert node.bmc_password not in text
        for ciphertext in ciphertexts:
            assert ciphertext not in text
    assert len(responses[0].json()["results"]) == 8


#
# Availability
#


@pytest.mark.django_db
def test_bare_metal_availability_counts_whole_available_non_spare_nodes():
    """small_fleet(8): six bare-metal nodes, one of them a spare, so five sellable."""
    nodes = small_fleet(8)
    bare = [n for n in nodes if n.pool == NodePool.BARE_METAL]
    assert len(bare) == 6 and sum(n.is_spare for n in bare) == 1
    o = offering(OfferingKind.BARE_METAL, gpus_per_unit=8)

    assert units(o) == {"units": 5, "gpus": 40}


@pytest.mark.django_db
def test_bare_metal_node_in_maintenance_or_allocated_is_not_counted():
    """A node held for maintenance or sold to a tenant is not available."""
    nodes = [n for n in small_fleet(8) if n.pool == NodePool.BARE_METAL and not n.is_spare]
    o = offering(OfferingKind.BARE_METAL, gpus_per_unit=8)
    Node.objects.filter(pk=nodes[0].pk).update(state=NodeState.MAINTENANCE)
    Node.objects.filter(pk=nodes[1].pk).update(state=NodeState.ALLOCATED)
    Node.objects.filter(pk=nodes[2].pk).update(health=Health.FAILED)

    assert units(o) == {"units": 2, "gpus": 16}


@pytest.mark.django_db
def test_vm_of_eight_gpus_needs_a_host_with_eight_free():
    """A unit cannot span hosts: a shared host with one allocated GPU offers no 8-GPU VM."""
    small_fleet(8)  # two shared hosts of 8 GPUs
    o = offering(OfferingKind.VM, gpus_per_unit=8)
    assert units(o) == {"units": 2, "gpus": 16}

    host = Node.objects.filter(pool=NodePool.SHARED).order_by("hostname").first()
    GPU.objects.filter(node=host, index=3).update(state=GPUState.ALLOCATED)

    assert units(o) == {"units": 1, "gpus": 15}


@pytest.mark.django_db
def test_vm_units_count_free_gpus_per_host():
    """Single-GPU VMs count every free GPU of in-service shared hosts, and nothing else."""
    small_fleet(8)
    hosts = list(Node.objects.filter(pool=NodePool.SHARED).order_by("hostname"))
    o1, o4 = offering(OfferingKind.VM, gpus_per_unit=1), offering(OfferingKind.VM, gpus_per_unit=4)
    GPU.objects.filter(node=hosts[0], index__in=[0, 1]).update(state=GPUState.ALLOCATED)
    GPU.objects.filter(node=hosts[0], index=2).update(state=GPUState.SCRUBBING)
    GPU.objects.filter(node=hosts[0], index=3).update(health=Health.FAILED)

    assert units(o1) == {"units": 12, "gpus": 12}  # 4 + 8
    assert units(o4) == {"units": 3, "gpus": 12}  # 4 // 4 + 8 // 4


@pytest.mark.django_db
def test_hosts_with_as_many_free_gpus_each_count():
    """Hosts are counted by how many GPUs they have free: two hosts with 5 free are two hosts' worth of units."""
    small_fleet(8)  # two shared hosts of 8 GPUs
    o2 = offering(OfferingKind.VM, gpus_per_unit=2)
    GPU.objects.filter(node__pool=NodePool.SHARED, index__in=[0, 1, 2]).update(state=GPUState.ALLOCATED)

    assert units(o2) == {"units": 4, "gpus": 10}  # 5 // 2 on each of the two hosts


@pytest.mark.django_db
def test_shared_host_in_maintenance_is_not_counted():
    """A shared host held for maintenance offers no GPUs, however many are free."""
    small_fleet(8)
    host = Node.objects.filter(pool=NodePool.SHARED).order_by("hostname").first()
    o = offering(OfferingKind.VM, gpus_per_unit=1)
    Node.objects.filter(pk=host.pk).update(state=NodeState.MAINTENANCE)

    assert units(o) == {"units": 8, "gpus": 8}


@pytest.mark.django_db
def test_mig_and_fractional_offerings_count_slots():
    """A MIG container with 7 slots per GPU sells 7 units per free GPU; a fractional one likewise per slot."""
    small_fleet(8)  # 16 free GPUs on shared hosts
    mig = offering(OfferingKind.CONTAINER, slots_per_gpu=7, isolation=IsolationMode.MIG)
    half = offering(OfferingKind.CONTAINER, slots_per_gpu=2, isolation=IsolationMode.SHARED)
    GPU.objects.filter(node__pool=NodePool.SHARED, index=0).update(state=GPUState.ALLOCATED)

    assert units(mig) == {"units": 14 * 7, "gpus": 14}
    assert units(half) == {"units": 14 * 2, "gpus": 14}


@pytest.mark.django_db
def test_bare_metal_node_sells_only_whole_and_free_now(world):
    """A node with one failed or unknown GPU is not sold whole; one held now is not free; a later hold is."""
    from datetime import timedelta

    from django.utils import timezone

    from provisioning.models import Allocation
    from tests.provisioning.factories import make_reservation

    nodes = [n for n in small_fleet(8) if n.pool == NodePool.BARE_METAL and not n.is_spare]
    o = offering(OfferingKind.BARE_METAL, gpus_per_unit=8)
    assert units(o) == {"units": 5, "gpus": 40}
    GPU.objects.filter(node=nodes[0], index=7).update(health=Health.FAILED)
    GPU.objects.filter(node=nodes[1], index=0).update(health=Health.UNKNOWN)
    GPU.objects.filter(node=nodes[2], index=0).update(health=Health.DEGRADED)  # still sold
    assert units(o) == {"units": 3, "gpus": 24}
    now = timezone.now()
    holder = make_reservation(world, state="scheduled")
    first = nodes[3].gpus.first()
    Allocation.objects.create(reservation=holder, gpu=first, node=nodes[3], mem_lo=0, mem_hi=first.memory_mib,
                              starts_at=now - timedelta(minutes=5), ends_at=now + timedelta(hours=1))
    later = nodes[4].gpus.first()
    Allocation.objects.create(reservation=holder, gpu=later, node=nodes[4], mem_lo=0, mem_hi=later.memory_mib,
                              starts_at=now + timedelta(hours=2), ends_at=now + timedelta(hours=3))
    assert units(o) == {"units": 2, "gpus": 16}


@pytest.mark.django_db
def test_availability_is_per_gpu_model_and_region():
    """An offering counts only its own GPU model: the H200 region does not lend its nodes to H100s."""
    build_fleet(FleetSpec(regions=2, nodes_per_fabric=8, spare_ratio=0.25, shared_ratio=0.25))
    h100_bm = offering(OfferingKind.BARE_METAL, gpus_per_unit=8)
    h200_bm = offering(OfferingKind.BARE_METAL, gpus_per_unit=8, model=GPUModel.objects.get(slug="h200-141gb-sxm"))

    result = availability([h100_bm, h200_bm])

    assert result[h100_bm.pk] == {"us-east-1": {"units": 5, "gpus": 40}}
    assert result[h200_bm.pk] == {"eu-west-1": {"units": 5, "gpus": 40}}


#
# What tenants see
#


def test_tenant_sees_offerings_with_availability_and_prices(world):
    """A member lists offerings with prices and per-region counts."""
    small_fleet(8)
    bm = offering(OfferingKind.BARE_METAL, gpus_per_unit=8)

    response = world.client("t1_member").get("/api/v1/offerings/", {"kind": "bare_metal"})

    assert response.status_code == 200, response.content[:600]
    [row] = response.json()["results"]
    assert row["slug"] == bm.slug
    assert row["price_per_gpu_hour"] == "2.4900"
    assert "reserved_price_per_gpu_hour" in row
    assert row["availability"] == [{"region": REGION, "units": 5, "gpus": 40}]
    detail = world.client("t1_member").get(f"/api/v1/offerings/{bm.pk}/")
    assert detail.status_code == 200
    assert detail.json()["availability"] == [{"region": REGION, "units": 5, "gpus": 40}]


@pytest.mark.parametrize("path", ["/api/v1/nodes/", "/api/v1/gpus/", "/api/v1/fabrics/"])
@pytest.mark.parametrize("persona", ["t1_viewer", "t1_member", "t1_owner"])
def test_tenants_cannot_list_the_fleet(world, persona, path):
    """Nodes, GPUs and fabrics are staff-only: a tenant, even its owner, gets 403."""
    small_fleet(4)

    response = world.client(persona).get(path)

    assert_error(response, 403, "permission_denied")


@pytest.mark.parametrize("kind", ["nodes", "gpus", "fabrics"])
def test_tenants_cannot_read_a_fleet_object(world, kind):
    """Even with a valid id, a tenant cannot read a node, GPU or fabric."""
    small_fleet(4)
    obj = {"nodes": Node, "gpus": GPU, "fabrics": Fabric}[kind].objects.first()

    response = world.client("t1_member").get(f"/api/v1/{kind}/{obj.pk}/")

    assert response.status_code in (403, 404), response.content[:600]
    assert_error(response, response.status_code)


def test_offerings_never_reveal_hostnames_or_gpu_identities(world):
    """No hostname, GPU UUID, serial or BMC address appears in any offering answer a tenant gets."""
    small_fleet(8)
    offerings = [
        offering(OfferingKind.BARE_METAL, gpus_per_unit=8),
        offering(OfferingKind.VM, gpus_per_unit=8),
        offering(OfferingKind.CONTAINER, slots_per_gpu=7, isolation=IsolationMode.MIG),
    ]
    client = world.client("t1_member")
    responses = [
        client.get("/api/v1/offerings/"),
        client.get("/api/v1/offerings/", {"fields": "hostname,gpu_uuid,node", "expand": "nodes"}),
        client.get("/api/v1/offerings/", {"ordering": "gpu_model__gpus__uuid"}),
        *[client.get(f"/api/v1/offerings/{o.pk}/") for o in offerings],
    ]
    secrets = set()
    for node in Node.objects.all():
        secrets |= {node.hostname, node.bmc_address, str(node.pk)}
    for gpu in GPU.objects.all():
        secrets |= {gpu.uuid, gpu.serial, str(gpu.pk)}

    for response in responses:
        assert response.status_code == 200, response.content[:600]
        text = response.content.decode()
        assert not [s for s in secrets if s in text]
        assert "hostname" not in text and "uuid" not in text
    assert all(row["availability"] for row in responses[0].json()["results"])


#
# Node maintenance through the API
#


def _node(pool=NodePool.BARE_METAL) -> Node:
    small_fleet(8)
    return Node.objects.filter(pool=pool, is_spare=False).order_by("hostname").first()


def test_maintenance_holds_a_node_and_audits_the_move(world):
    """POST with a reason moves an available node to maintenance and records before and after."""
    node = _node()

    response = world.client("platform_admin").post(f"/api/v1/nodes/{node.pk}/maintenance/",
                                                   {"reason": "PSU swap"}, format="json")

    assert response.status_code == 200, response.content[:600]
    assert response.json()["state"] == NodeState.MAINTENANCE
    assert response.json()["state_reason"] == "PSU swap"
    node.refresh_from_db()
    assert node.state == NodeState.MAINTENANCE and node.state_changed_at is not None
    event = AuditEvent.objects.get(action="node.transition", target_id=str(node.pk))
    assert event.target_type == "cloud.node"
    assert event.before == {"state": NodeState.AVAILABLE}
    assert event.after == {"state": NodeState.MAINTENANCE, "reason": "PSU swap"}
    assert event.actor_id == world.users["platform_admin"].pk


@pytest.mark.parametrize(("pool", "home"), [(NodePool.BARE_METAL, NodeState.AVAILABLE),
                                            (NodePool.SHARED, NodeState.IN_SERVICE)])
def test_ending_maintenance_returns_the_node_to_its_pool(world, pool, home):
    """DELETE brings bare metal back to available and a shared host back to in_service."""
    node = _node(pool)
    client = world.client("platform_admin")
    assert client.post(f"/api/v1/nodes/{node.pk}/maintenance/", {"reason": "x"}, format="json").status_code == 200

    response = client.delete(f"/api/v1/nodes/{node.pk}/maintenance/")

    assert response.status_code == 200, response.content[:600]
    assert response.json()["state"] == home
    node.refresh_from_db()
    assert node.state == home
    events = AuditEvent.objects.filter(action="node.transition", target_id=str(node.pk)).order_by("id")
    assert [(e.before["state"], e.after["state"]) for e in events] == [
        (home, NodeState.MAINTENANCE), (NodeState.MAINTENANCE, home),
    ]


@pytest.mark.parametrize("state", [NodeState.AVAILABLE, NodeState.ENROLLED, NodeState.FAULTY])
def test_ending_maintenance_of_a_node_not_in_maintenance_is_409(world, state):
    """DELETE on a node that is not held is a 409 invalid_transition naming its current state."""
    node = _node()
    Node.objects.filter(pk=node.pk).update(state=state)
    before = AuditEvent.objects.count()

    response = world.client("platform_admin").delete(f"/api/v1/nodes/{node.pk}/maintenance/")

    body = assert_error(response, 409, "invalid_transition")
    error = body["errors"][0]
    assert f"'{state}'" in error["detail"]
    assert error["meta"]["current_state"] == state
    node.refresh_from_db()
    assert node.state == state
    assert AuditEvent.objects.count() == before


@pytest.mark.parametrize("state", [NodeState.ALLOCATED, NodeState.RELEASING, NodeState.REPAIR,
                                   NodeState.MAINTENANCE])
def test_holding_a_node_that_cannot_be_held_is_409(world, state):
    """A node a tenant holds (or one being released, repaired or already held) cannot go to maintenance."""
    node = _node()
    Node.objects.filter(pk=node.pk).update(state=state, state_reason="before")

    response = world.client("platform_admin").post(f"/api/v1/nodes/{node.pk}/maintenance/",
                                                   {"reason": "grab"}, format="json")

    body = assert_error(response, 409, "invalid_transition")
    assert body["errors"][0]["meta"]["current_state"] == state
    node.refresh_from_db()
    assert (node.state, node.state_reason) == (state, "before")
    assert not AuditEvent.objects.filter(action="node.transition", target_id=str(node.pk)).exists()


@pytest.mark.parametrize("persona", ["platform_approver", "t1_owner"])
def test_only_platform_admins_hold_nodes(world, persona):
    """An approver (staff, read-only) and a tenant owner get 403; the node is unchanged."""
    node = _node()

    response = world.client(persona).post(f"/api/v1/nodes/{node.pk}/maintenance/", {"reason": "x"}, format="json")

    assert_error(response, 403)
    node.refresh_from_db()
    assert node.state == NodeState.AVAILABLE


#
# compare_and_set
#


@pytest.mark.django_db
def test_compare_and_set_makes_a_legal_move_and_returns_the_previous_state():
    node = _node()

    previous = compare_and_set(Node.objects.all(), node.pk, table=NODE_TRANSITIONS, target=NodeState.MAINTENANCE)

    assert previous == NodeState.AVAILABLE
    assert Node.objects.get(pk=node.pk).state == NodeState.MAINTENANCE


@pytest.mark.django_db
@pytest.mark.parametrize(("current", "target"), [
    (NodeState.AVAILABLE, NodeState.REPAIR),
    (NodeState.ALLOCATED, NodeState.MAINTENANCE),
    (NodeState.ENROLLED, NodeState.ALLOCATED),
    (NodeState.REPAIR, NodeState.AVAILABLE),
])
def test_compare_and_set_refuses_an_illegal_move(current, target):
    """A move the table forbids raises InvalidTransition naming the current state; the row is unchanged."""
    node = _node()
    Node.objects.filter(pk=node.pk).update(state=current)

    with pytest.raises(InvalidTransition) as caught:
        compare_and_set(Node.objects.all(), node.pk, table=NODE_TRANSITIONS, target=target)

    assert caught.value.meta == {"current_state": current, "target_state": target}
    assert caught.value.status_code == 409
    assert Node.objects.get(pk=node.pk).state == current


@pytest.mark.django_db
def test_compare_and_set_refuses_the_second_of_two_identical_moves():
    """The loser of two moves to maintenance finds the node already there and is refused."""
    node = _node()
    compare_and_set(Node.objects.all(), node.pk, table=NODE_TRANSITIONS, target=NodeState.MAINTENANCE)

    with pytest.raises(InvalidTransition) as caught:
        compare_and_set(Node.objects.all(), node.pk, table=NODE_TRANSITIONS, target=NodeState.MAINTENANCE)

    assert caught.value.meta["current_state"] == NodeState.MAINTENANCE


@pytest.mark.django_db
def test_compare_and_set_only_from_narrows_the_sources():
    """available -> in_service is legal in the table, but not when only maintenance may be the source."""
    node = _node()

    with pytest.raises(InvalidTransition) as caught:
        compare_and_set(Node.objects.all(), node.pk, table=NODE_TRANSITIONS, target=NodeState.IN_SERVICE,
                        only_from=frozenset({NodeState.MAINTENANCE}))

    assert caught.value.meta["current_state"] == NodeState.AVAILABLE
    assert Node.objects.get(pk=node.pk).state == NodeState.AVAILABLE


@pytest.mark.django_db
def test_compare_and_set_on_a_missing_row_is_does_not_exist():
    import uuid

    with pytest.raises(Node.DoesNotExist):
        compare_and_set(Node.objects.all(), uuid.uuid4(), table=NODE_TRANSITIONS, target=NodeState.MAINTENANCE)


#
# Catalogue writes
#


def _offering_body(**overrides) -> dict:
    return {"slug": "h100-vm-8x", "name": "H100 VM 8x", "kind": "vm", "gpu_model": "h100-80gb-sxm",
            "gpus_per_unit": 8, "price_per_gpu_hour": "2.9900", "reserved_discount_pct": "20.00"} | overrides


def test_platform_admin_creates_an_offering(world):
    """A valid offering is 201, stored as sent, and audited."""
    response = world.client("platform_admin").post("/api/v1/offerings/", _offering_body(), format="json")

    assert response.status_code == 201, response.content[:600]
    body = response.json()
    assert body["slug"] == "h100-vm-8x" and body["gpu_model"] == "h100-80gb-sxm"
    assert body["reserved_price_per_gpu_hour"] == "2.3920"
    stored = Offering.objects.get(slug="h100-vm-8x")
    assert (stored.kind, stored.gpus_per_unit, str(stored.price_per_gpu_hour)) == ("vm", 8, "2.9900")
    assert AuditEvent.objects.filter(action="offering.create", target_id=str(stored.pk)).exists()


def test_duplicate_offering_slug_is_409(world):
    """A second offering with the same slug is a 409 conflict; the first one stays as it was."""
    client = world.client("platform_admin")
    existing = Offering.objects.count()
    assert client.post("/api/v1/offerings/", _offering_body(), format="json").status_code == 201

    response = client.post("/api/v1/offerings/", _offering_body(name="Other", gpus_per_unit=1), format="json")

    assert_error(response, 409, "duplicate")
    assert Offering.objects.get(slug="h100-vm-8x").name == "H100 VM 8x"
    assert Offering.objects.count() == existing + 1


@pytest.mark.parametrize(("path", "body"), [
    ("/api/v1/regions/", {"slug": "eu-central-9", "name": "EU Central 9"}),
    ("/api/v1/gpu-models/", {"slug": "l40s-48gb", "name": "NVIDIA L40S", "memory_gib": 48,
                             "memory_bandwidth_tbs": "0.86", "fp16_tflops": "362.0", "tdp_watts": 350}),
])
def test_duplicate_region_or_gpu_model_slug_is_409(world, path, body):
    """Regions and GPU models refuse a duplicate slug with a 409 too."""
    client = world.client("platform_admin")
    assert client.post(path, body, format="json").status_code == 201

    response = client.post(path, body | {"name": "Again"}, format="json")

    assert_error(response, 409, "duplicate")


def test_mig_offering_on_a_model_without_mig_is_400(world):
    """MIG isolation needs a GPU model that supports MIG; nothing is stored."""
    GPUModel.objects.create(slug="l40s-48gb", name="NVIDIA L40S", memory_gib=48, memory_bandwidth_tbs="0.86",
                            fp16_tflops="362.0", tdp_watts=350, mig_max_instances=0)
    body = _offering_body(slug="l40s-mig", kind="container", gpu_model="l40s-48gb", gpus_per_unit=1,
                          slots_per_gpu=4, isolation_mode="mig")

    response = world.client("platform_admin").post("/api/v1/offerings/", body, format="json")

    body = assert_error(response, 400)
    assert "isolation_mode" in [e["attr"] for e in body["errors"]]
    assert not Offering.objects.filter(slug="l40s-mig").exists()


def test_mig_offering_on_a_model_with_mig_is_accepted(world):
    """The control: the same MIG offering on an H100 is created."""
    body = _offering_body(slug="h100-mig", kind="container", gpus_per_unit=1, slots_per_gpu=7, isolation_mode="mig")

    response = world.client("platform_admin").post("/api/v1/offerings/", body, format="json")

    assert response.status_code == 201, response.content[:600]


@pytest.mark.parametrize(("path", "body"), [
    ("/api/v1/offerings/", _offering_body()),
    ("/api/v1/regions/", {"slug": "eu-central-9", "name": "EU Central 9"}),
    ("/api/v1/gpu-models/", {"slug": "l40s-48gb", "name": "NVIDIA L40S", "memory_gib": 48,
                             "memory_bandwidth_tbs": "0.86", "fp16_tflops": "362.0", "tdp_watts": 350}),
])
@pytest.mark.parametrize("persona", ["t1_owner", "platform_approver"])
def test_catalogue_writes_need_a_platform_admin(world, persona, path, body):
    """A tenant owner and a platform approver cannot change the catalogue (403, nothing stored)."""
    before = (Offering.objects.count(), GPUModel.objects.count(), AuditEvent.objects.count())

    response = world.client(persona).post(path, body, format="json")

    assert_error(response, 403)
    assert (Offering.objects.count(), GPUModel.objects.count(), AuditEvent.objects.count()) == before


def test_tenant_cannot_change_an_offering_price(world):
    """PATCH by a tenant owner is 403 and the price stays."""
    o = offering()

    response = world.client("t1_owner").patch(f"/api/v1/offerings/{o.pk}/", {"price_per_gpu_hour": "0.0100"},
                                              format="json")

    assert_error(response, 403)
    o.refresh_from_db()
    assert str(o.price_per_gpu_hour) == "2.4900"


#
# The seeded GPU catalogue
#


@pytest.mark.django_db
def test_migration_seeds_the_gpu_catalogue():
    """A100, H100, H200 and B200 are there with 80, 80, 141 and 180 GiB."""
    memory = dict(GPUModel.objects.values_list("slug", "memory_gib"))

    assert memory == {"a100-80gb-sxm": 80, "h100-80gb-sxm": 80, "h200-141gb-sxm": 141, "b200-180gb-sxm": 180}
    assert all(m.supports_mig for m in GPUModel.objects.all())


def test_tenant_reads_the_gpu_catalogue(world):
    """Any signed-in tenant member can read the seeded catalogue through the API."""
    response = world.client("t1_viewer").get("/api/v1/gpu-models/")

    assert response.status_code == 200, response.content[:600]
    rows = {row["slug"]: row for row in response.json()["results"]}
    assert {slug: row["memory_gib"] for slug, row in rows.items()} == {
        "a100-80gb-sxm": 80, "h100-80gb-sxm": 80, "h200-141gb-sxm": 141, "b200-180gb-sxm": 180,
    }


def test_availability_goes_down_when_reservations_hold_gpus(world):
    """Placing a reservation takes its GPUs (and a bare-metal node) out of the live counts."""
    from provisioning.models import Reservation

    Reservation.objects.all().delete()
    small_fleet(8)
    vm = offering(OfferingKind.VM, gpus_per_unit=1)
    client = world.client("t1_member")
    before = client.get(f"/api/v1/offerings/{vm.pk}/").json()["availability"][0]["gpus"]
    placed = client.post("/api/v1/reservations/", {"name": "x", "offering": vm.slug, "gpus": 3,
                                                   "regions": [REGION], "duration_hours": 1}, format="json")
    assert placed.json()["state"] == "scheduled", placed.content
    after = client.get(f"/api/v1/offerings/{vm.pk}/").json()["availability"][0]["gpus"]
    assert after == before - 3
