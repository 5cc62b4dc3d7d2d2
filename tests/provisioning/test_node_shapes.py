"""
Node shapes: nodes of 1 to 16 GPUs (4-GPU trays, 8-GPU HGX boards, 16-GPU servers). A bare-metal
offering of N GPUs sells whole nodes of N GPUs, never a part of a bigger one; gangs still prefer
one leaf.
"""

from __future__ import annotations

import uuid

import pytest

from cloud.models import GPUModel, Node, Offering
from provisioning.models import Allocation, Reservation
from provisioning.scheduling.plan_types import GPUCapacity, NodeCapacity, Snapshot
from provisioning.scheduling.snapshot import _whole_only, choose_nodes
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY
from tests.world import small_fleet, unique

URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(4)


def enrol(world, gpus: int) -> Node:
    leaf = Node.objects.order_by("hostname").first().leaf
    body = {"hostname": unique(f"shape{gpus}"), "region": "us-east-1", "fabric": leaf.fabric.slug, "leaf": leaf.name,
            "pool": "bare_metal", "bmc_address": "https://shape-bmc.oob.internal/redfish/v1", "bmc_username": "m",
            "bmc_password": "pw", "cpu_cores": 64, "ram_gib": 1024, "nvme_tb": "15.36", "gpu_model": "h100-80gb-sxm",
            "gpus": [{"index": i, "uuid": f"GPU-{uuid.uuid4()}", "serial": f"SN{uuid.uuid4().hex[:10]}",
                      "pci_bus_id": f"00000000:{0x18 + i:02x}:00.0"} for i in range(gpus)],
            "ib_port_guids": [f"b83fd2{uuid.uuid4().hex[:10]}" for _ in range(max(1, gpus // 2))]}
    answer = world.client("platform_admin").post("/api/v1/nodes/", body, format="json")
    assert answer.status_code == 201, answer.json()
    return Node.objects.get(pk=answer.json()["id"])


def bare_metal(gpus: int) -> Offering:
    model = GPUModel.objects.get(slug="h100-80gb-sxm")
    return Offering.objects.get_or_create(slug=f"bm-h100-{gpus}", defaults={
        "name": f"Bare metal {gpus}x H100", "kind": "bare_metal", "gpu_model": model, "gpus_per_unit": gpus,
        "price_per_gpu_hour": "2.50"})[0]


def reserve(world, chosen, nodes=1):
    answer = world.client("t1_member").post(URL, {"name": "job", "offering": chosen.slug, "regions": ["us-east-1"],
                                                  "nodes": nodes, "duration_hours": 2, "ssh_public_key": SSH_KEY},
                                            format="json")
    assert answer.status_code == 201, answer.json()
    return answer.json()["id"]


def test_enrolled_trays_and_big_servers_sell_whole_by_their_shape(world, fleet, steps):
    tray, big = enrol(world, 4), enrol(world, 16)
    steps.run()  # validation (burn-in, acceptance, attestation) before they are sold
    assert (Node.objects.get(pk=tray.pk).state, Node.objects.get(pk=big.pk).state) == ("available", "available")
    assert (tray.gpus_installed, big.gpus_installed) == (4, 16)

    four, sixteen = reserve(world, bare_metal(4)), reserve(world, bare_metal(16))
    steps.run()

    assert set(Allocation.objects.filter(reservation_id=four).values_list("node_id", flat=True)) == {tray.pk}
    assert Allocation.objects.filter(reservation_id=sixteen, node=big).count() == 16
    assert Reservation.objects.get(pk=four).state == Reservation.objects.get(pk=sixteen).state == "active"


def test_an_eight_gpu_offering_never_takes_a_tray_or_part_of_a_big_server(world, fleet, steps):
    tray, big = enrol(world, 4), enrol(world, 16)
    steps.run()
    eights = Node.objects.filter(pool="bare_metal", is_spare=False, gpus_installed=8, state="available",
                                 gpus__model__slug="h100-80gb-sxm", region__slug="us-east-1").distinct().count()

    made = [reserve(world, offering("bare_metal", 8)) for _ in range(eights + 1)]
    steps.run()

    assert not Allocation.objects.filter(reservation_id__in=made, node__in=[tray, big]).exists()
    assert Reservation.objects.filter(pk__in=made, state="queued").count() == 1


def test_a_bare_metal_offering_is_one_to_sixteen_gpus_and_never_slots(world, fleet):
    admin = world.client("platform_admin")
    base = {"kind": "bare_metal", "gpu_model": "h100-80gb-sxm", "price_per_gpu_hour": "2.00"}

    too_big = admin.post("/api/v1/offerings/", {**base, "slug": "bm17", "name": "17", "gpus_per_unit": 17},
                         format="json")
    slots = admin.post("/api/v1/offerings/", {**base, "slug": "bm-slots", "name": "s", "gpus_per_unit": 4,
                                              "slots_per_gpu": 2}, format="json")
    tray = admin.post("/api/v1/offerings/", {**base, "slug": "bm4", "name": "4x", "gpus_per_unit": 4}, format="json")

    assert too_big.status_code == slots.status_code == 400
    assert tray.status_code == 201, tray.json()


def capacity(node_id, free: int, installed: int) -> NodeCapacity:
    return NodeCapacity(node_id=node_id, region="r", fabric_id=uuid.uuid4(), leaf_id=uuid.uuid4(), pod=0,
                        pool="bare_metal", gpu_model_id=uuid.uuid4(), installed=installed,
                        gpus=[GPUCapacity(gpu_id=uuid.uuid4(), index=i, memory_mib=81920) for i in range(free)])


def test_half_a_free_sixteen_gpu_server_is_not_a_whole_eight_gpu_node():
    class Ask:
        kind, gpus_per_unit, units = "bare_metal", 8, 1

    half, whole = capacity("half", 8, 16), capacity("whole", 8, 8)
    kept = _whole_only(Snapshot(now=None, nodes=[half, whole]), Ask())
    leaf = uuid.uuid4()

    assert [node.node_id for node in kept.nodes] == ["whole"]
    assert choose_nodes([("half", leaf, 8, 16), ("whole", leaf, 8, 8)], Ask(), spare=0) == ["whole"]
