"""
Confidential-computing offerings: placed only on nodes whose verified evidence shows every GPU in
CC mode (and, for VMs, hosts that run confidential VMs); such nodes sell nothing else; the
receipt states it; evidence that shows CC off at hand-over takes the node out of the
confidential pool and the reservation is not handed over there.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from cloud.models import GPUModel, Node, Offering
from provisioning.drivers.simulated import SimulatedHost
from provisioning.lifecycle import validate as validating
from provisioning.lifecycle.replacement_picks import pick
from provisioning.lifecycle.steps import target_of
from provisioning.models import Allocation, Reservation
from security.receipts import receipt_verify
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY
from tests.world import small_fleet

URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(4)


@pytest.fixture
def confidential_offering(fleet):
    return Offering.objects.create(slug="cc-bare-metal-h100", name="Confidential 8x H100", kind="bare_metal",
                                   gpu_model=GPUModel.objects.get(slug="h100-80gb-sxm"), gpus_per_unit=8,
                                   price_per_gpu_hour="3.10", confidential=True)


def bare_metal_nodes():
    return list(Node.objects.filter(pool="bare_metal", is_spare=False, gpus__model__slug="h100-80gb-sxm",
                                    region__slug="us-east-1").distinct().order_by("hostname"))


def make_confidential(node, steps, mode="on"):
    """The operator turns CC on (nvidia-smi conf-compute) and validates the node again: its evidence decides."""
    SimulatedHost().set_cc_mode(target_of(node), mode)
    Node.objects.filter(pk=node.pk).update(state="maintenance")
    validating.node_validate(actor=None, node=Node.objects.get(pk=node.pk))
    steps.run()
    return Node.objects.get(pk=node.pk)


def reserve(world, chosen, persona="t1_member"):
    return world.client(persona).post(URL, {"name": "job", "offering": chosen.slug, "regions": ["us-east-1"],
                                            "nodes": 1, "duration_hours": 2, "ssh_public_key": SSH_KEY},
                                      format="json")


def test_a_node_whose_evidence_shows_cc_on_becomes_confidential_capacity(world, fleet, steps):
    node = make_confidential(bare_metal_nodes()[0], steps)

    assert (node.state, node.gpu_cc_mode, node.confidential) == ("available", "on", True)


def test_a_confidential_reservation_lands_only_on_cc_nodes_and_its_receipt_says_so(
        world, fleet, steps, confidential_offering, client):
    node = make_confidential(bare_metal_nodes()[1], steps)

    answer = reserve(world, confidential_offering)
    assert answer.status_code == 201, answer.json()
    steps.run()

    reservation = Reservation.objects.get(pk=answer.json()["id"])
    assert reservation.state == "active"
    allocation = Allocation.objects.filter(reservation=reservation).first()
    assert allocation.node_id == node.pk
    jwks = client.get("/.well-known/jwks.json").json()
    claims = receipt_verify(allocation.attestation_receipt, jwks=jwks, audience=str(reservation.tenant_id))
    assert claims["confidential"] is True
    assert {gpu["cc_mode"] for gpu in claims["gpus"]} == {"on"}


def test_ordinary_work_never_lands_on_a_confidential_node(world, fleet, steps):
    nodes = bare_metal_nodes()
    cc_node = make_confidential(nodes[0], steps)
    ordinary = offering("bare_metal", 8)
    made = [reserve(world, ordinary).json()["id"] for _ in range(len(nodes))]
    steps.run()

    on_cc = Allocation.objects.filter(reservation_id__in=made, node=cc_node)
    assert not on_cc.exists()
    assert Reservation.objects.filter(pk__in=made, state="queued").count() >= 1  # the CC node was not taken


def test_no_confidential_capacity_is_a_clear_400(world, fleet, confidential_offering):
    answer = reserve(world, confidential_offering)

    assert answer.status_code == 400
    assert answer.json()["errors"][0]["code"] == "not_sold_in_region"


def test_cc_off_at_hand_over_takes_the_node_out_and_hands_nothing_over(world, fleet, steps, confidential_offering):
    node = make_confidential(bare_metal_nodes()[2], steps)
    SimulatedHost().set_cc_mode(target_of(node), "off")  # turned off behind Meridian's back

    answer = reserve(world, confidential_offering)
    steps.run()

    node.refresh_from_db()
    assert (node.gpu_cc_mode, node.confidential) == ("off", False)
    reservation = Reservation.objects.get(pk=answer.json()["id"])
    assert reservation.state != "active"
    assert not Allocation.objects.filter(reservation=reservation, node=node).exclude(attestation_receipt="").exists()


def test_a_container_offering_cannot_be_confidential(world, fleet):
    answer = world.client("platform_admin").post("/api/v1/offerings/", {
        "slug": "cc-ct", "name": "CC container", "kind": "container", "gpu_model": "h100-80gb-sxm",
        "gpus_per_unit": 1, "price_per_gpu_hour": "1.00", "confidential": True}, format="json")

    assert answer.status_code == 400
    assert "TEE" in str(answer.json())


def test_a_replacement_stays_in_its_kind_of_capacity(world, fleet, steps, settings):
    settings.MERIDIAN_REPLACEMENT_FROM_POOL = True
    pk = reserve(world, offering("bare_metal", 8)).json()["id"]
    steps.run()
    ordinary = Reservation.objects.select_related("offering").get(pk=pk)
    failed = Allocation.objects.filter(reservation=ordinary).first().node
    others = Node.objects.filter(fabric=failed.fabric, pool="bare_metal").exclude(pk=failed.pk)
    now = timezone.now()

    others.update(confidential=True)
    none_ordinary = pick(ordinary, failed, 1, start=now, end=now + timedelta(hours=1))
    others.update(confidential=False)
    some = pick(ordinary, failed, 1, start=now, end=now + timedelta(hours=1))

    assert none_ordinary == []
    assert len(some) == 1 and not some[0].node.confidential
