"""
Attestation in the pipeline, end to end with the simulated fleet's real device keys: a passing
node is handed over with a signed receipt the tenant verifies with the published JWKS; a node
whose evidence fails is quarantined with its reasons and an incident and never handed over (the
reservation is placed again); new firmware without reference values holds the node until staff
register them; a shared host's failing GPU is held alone; idle nodes are attested again.
"""

from __future__ import annotations

import jwt
import pytest
from django.test import Client

from cloud.models import GPU, Node
from provisioning.drivers import fabric_driver_for
from provisioning.drivers.simulated_devices import SIMULATED_DRIVER
from provisioning.lifecycle import tick as ticking
from provisioning.models import Allocation, Instance, Operation, PortMembership, Reservation
from provisioning.networks.ports import still_members
from provisioning.scheduling.scheduler import run_cycle
from security.models import AttestationReport, Incident
from security.receipts import receipt_verify
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY, reservation
from tests.world import small_fleet, vm_offering

URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(4)


@pytest.fixture
def misbehave(settings):
    def set_mode(hostname: str, mode: str):
        settings.MERIDIAN_SIMULATION = {**settings.MERIDIAN_SIMULATION, "attestation": {hostname: mode}}
    return set_mode


def create(world, chosen, persona="t1_member", **amount) -> str:
    response = world.client(persona).post(URL, {"name": "job", "offering": chosen.slug, "regions": ["us-east-1"],
                                                "duration_hours": 2, "ssh_public_key": SSH_KEY, **amount},
                                          format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def first_node(pk) -> Node:
    return Allocation.objects.filter(reservation_id=pk).order_by("node__hostname").first().node


def test_a_passing_server_is_handed_over_with_a_receipt_the_tenant_verifies(world, fleet, steps):
    pk = create(world, offering("bare_metal", 8), nodes=1)
    steps.run()
    assert reservation(pk).state == "active"
    node = Instance.objects.get(reservation_id=pk).node
    report = AttestationReport.objects.filter(node_id=node.pk).first()
    assert report.status == "pass" and len(report.gpus) == 8 and report.reasons == []

    receipts = world.client("t1_viewer").get(f"{URL}{pk}/receipts/").json()["results"]
    assert len(receipts) == 1 and len(receipts[0]["gpus"]) == 8
    keys = Client().get("/.well-known/jwks.json").json()
    claims = receipt_verify(receipts[0]["receipt"], jwks=keys, audience=str(world.t1.tenant.pk))
    assert claims["reservation"] == pk and claims["verdict"] == "pass" and claims["node"] == node.hostname
    assert {g["uuid"] for g in claims["gpus"]} == set(node.gpus.values_list("uuid", flat=True))
    assert all(g["driver"] == SIMULATED_DRIVER and len(g["measurements"]) == 10 for g in claims["gpus"])

    header, payload, signature = receipts[0]["receipt"].split(".")
    forged = ".".join([header, payload[:-4] + ("AAAA" if payload[-4:] != "AAAA" else "BBBB"), signature])
    with pytest.raises(jwt.InvalidTokenError):
        receipt_verify(forged, jwks=keys, audience=str(world.t1.tenant.pk))
    with pytest.raises(jwt.InvalidTokenError):  # another tenant cannot pass it off as its own
        receipt_verify(receipts[0]["receipt"], jwks=keys, audience=str(world.t2.tenant.pk))
    assert world.client("t2_member").get(f"{URL}{pk}/receipts/").status_code == 404


@pytest.mark.parametrize("mode, check", [("bad_measurement", "measurement_mismatch"), ("wrong_key", "bad_signature"),
                                         ("self_signed", "untrusted_root"), ("foreign_gpu", "foreign_gpu"),
                                         ("stale_nonce", "nonce_mismatch")])
def test_a_server_that_fails_attestation_is_quarantined_and_never_handed_over(world, fleet, steps, misbehave,
                                                                             mode, check):
    pk = create(world, offering("bare_metal", 8), nodes=1)
    bad = first_node(pk)
    misbehave(bad.hostname, mode)
    steps.run()
    bad.refresh_from_db()
    assert bad.state == "quarantined" and check in bad.state_reason
    assert AttestationReport.objects.get(node_id=bad.pk).status == "fail"
    incident = Incident.objects.get(kind="attestation_failed", node_id=bad.pk)
    assert any(r["check"] == check for r in incident.evidence["reasons"])
    failed = Instance.objects.get(reservation_id=pk, node=bad)
    assert failed.state == "failed" and not failed.ssh_user  # no access was ever given on it
    assert not failed.addresses.filter(released_at__isnull=True).exists()  # its addresses went back
    # Its ports left the tenant's network at once: a held node is on nobody's partition.
    assert not PortMembership.objects.filter(instance=failed, left_at__isnull=True).exists()
    guids = list(bad.ib_ports.values_list("guid", flat=True))
    assert still_members(fabric_driver_for(bad.fabric).read(), guids) == []
    assert not Allocation.objects.filter(reservation_id=pk, node=bad).exclude(attestation_receipt="").exists()
    # Placed again (the scheduler's next cycle) on a node that proves itself, and handed over there.
    assert reservation(pk).state == "queued"
    assert run_cycle().placed == 1
    steps.run()
    assert reservation(pk).state == "active"
    assert Instance.objects.get(reservation_id=pk, state="active").node != bad


def test_firmware_without_reference_values_holds_the_node_until_staff_register_them(world, fleet, steps, misbehave,
                                                                                  django_capture_on_commit_callbacks):
    pk = create(world, offering("bare_metal", 8), nodes=1)
    held = first_node(pk)
    misbehave(held.hostname, "unknown_vbios")
    steps.run()
    held.refresh_from_db()
    assert held.state == "reference_unavailable" and "reference_missing" in held.state_reason
    assert Incident.objects.filter(kind="reference_unavailable", node_id=held.pk).exists()
    run_cycle()
    steps.run()
    assert reservation(pk).state == "active"
    assert Instance.objects.get(reservation_id=pk, state="active").node != held  # the tenant is served elsewhere

    # Staff register the vendor's values for that firmware: the held node is validated and attested again.
    from security.device_pki import reference_measurements

    body = {"gpu_model": "h100-80gb-sxm", "vbios_version": "97.00.00.00.99", "driver_version": SIMULATED_DRIVER,
            "measurements": {str(i): d for i, d in reference_measurements(
                "h100-80gb-sxm", "97.00.00.00.99", SIMULATED_DRIVER).items()}}
    with django_capture_on_commit_callbacks(execute=True):
        response = world.client("platform_admin").post("/api/v1/reference-measurements/", body, format="json")
    assert response.status_code == 201, response.json()
    # The lifecycle tick finds the node held for values that now exist and validates it again.
    assert ticking.tick()["validations"] >= 1
    held.refresh_from_db()
    assert held.state == "validating"
    steps.run()
    held.refresh_from_db()
    assert held.state == "available"


def test_a_shared_hosts_failing_gpu_is_held_alone(world, fleet, steps, misbehave):
    host = Node.objects.get(pool="shared", is_spare=False)
    misbehave(host.hostname, "bad_measurement")
    pk = create(world, vm_offering(1), gpus=1)
    steps.run(settle=False, limit=60)
    host.refresh_from_db()
    assert host.state == "in_service"  # the other tenants' VMs on it go on
    quarantined = GPU.objects.filter(node=host, state="quarantined")
    assert quarantined.count() >= 1
    assert Incident.objects.filter(kind="attestation_failed", node_id=host.pk).exists()
    assert reservation(pk).state != "active"


def test_idle_nodes_are_attested_again_when_due(world, fleet, steps, misbehave, settings):
    from datetime import timedelta

    settings.MERIDIAN_ATTESTATION_IDLE_INTERVAL = timedelta(hours=1)
    idle = list(Node.objects.filter(pool="bare_metal", state="available", is_spare=False).order_by("hostname"))
    misbehave(idle[0].hostname, "wrong_key")
    report = ticking.tick()
    assert report["attestations"] == Node.objects.filter(state__in=["available", "in_service"]).count()
    steps.run()
    assert Node.objects.get(pk=idle[0].pk).state == "quarantined"
    assert Node.objects.get(pk=idle[1].pk).state == "available"
    assert Operation.objects.filter(kind="attest", state="succeeded").count() >= 2
    assert ticking.tick()["attestations"] == 0  # passed within the hour: not again yet


def test_a_revocation_names_its_issuer_as_the_verifier_compares_it(world):
    from security.services import certificate_revoke

    revoked = certificate_revoke(actor=None, issuer="CN=Vendor\\2C Inc GPU CA,O=Vendor", serial_number="0x00ff")
    assert (revoked.issuer, revoked.serial_number) == ("CN=Vendor\\, Inc GPU CA,O=Vendor", "ff")
