"""
Replacement of failed hardware (provisioning.lifecycle.replacement): a reservation whose node failed gets
a spare of the same fabric (same leaf first), joined to the same VPC and attested before the
hand-over; the tenant is told and its incident measures time to detect and to restore; the
failed node is only sold again after repair and validation. Nothing overlaps, nothing leaks.
"""

import secrets
import uuid
from datetime import timedelta

import pytest
import time_machine
from django.conf import settings
from django.db import connection
from django.utils import timezone

from cloud.fleet import HGX_PCI_BUS_IDS, NVIDIA_OUI
from cloud.models import GPU, Fabric, HCAPort, Node, Switch
from cloud.services import node_repair_start, node_transition
from core.errors import Conflict
from operations.nodes import node_repair_done
from provisioning.allocations import unallocatable
from provisioning.drivers import fabric_driver_for
from provisioning.lifecycle import start as starting
from provisioning.lifecycle import tick as ticking
from provisioning.lifecycle.replacement import NODE_FAILURE, gpus_failed, node_failed
from provisioning.models import Allocation, Instance, Operation, PortMembership, Reservation
from provisioning.networks.ports import still_members
from security.models import AttestationReport, Incident
from tenants.models import Notification
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY, reservation
from tests.world import h100, small_fleet, vm_offering

URL = "/api/v1/reservations/"
# small_fleet(8): one fabric (us-east-1/ib-a), one leaf; n0000-n0005 bare metal with n0003 the
# spare, n0006-n0007 shared hosts.
SPARE = "us-east-1-ib-a-n0003"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()  # the world's own queued work would compete
    return small_fleet(8)


def add_node(hostname: str, leaf: Switch, *, pool="bare_metal", spare=False) -> Node:
    """A node of 8 H100s with its ports, as the fleet builder makes them, on ``leaf``."""
    fabric = leaf.fabric
    node = Node.objects.create(
        hostname=hostname, region=fabric.region, fabric=fabric, leaf=leaf, pool=pool, is_spare=spare,
        bmc_address=f"https://{hostname}-bmc.oob.internal/redfish/v1", bmc_username="meridian", bmc_password="pw",
        cpu_cores=112, ram_gib=2048, nvme_tb="30.72", state="in_service" if pool == "shared" else "available",
        state_changed_at=timezone.now(), health="healthy", gpus_installed=8)
    GPU.objects.bulk_create([GPU(node=node, index=i, uuid=f"GPU-{uuid.uuid4()}", serial=f"{secrets.randbelow(10**13)}",
                                 pci_bus_id=HGX_PCI_BUS_IDS[i], model=h100(), memory_mib=80 * 1024, state="available",
                                 health="healthy") for i in range(8)])
    HCAPort.objects.bulk_create([HCAPort(node=node, index=i, guid=f"{NVIDIA_OUI}{secrets.token_hex(5)}")
                                 for i in range(8)])
    return node


def leaf(fabric: Fabric, name: str, pod: int = 0) -> Switch:
    return Switch.objects.create(fabric=fabric, name=name, tier="leaf", pod=pod)


def other_fabric() -> Fabric:
    first = Fabric.objects.get(slug="ib-a")
    return Fabric.objects.create(region=first.region, name="us-east-1 fabric ib-b", slug="ib-b")


def create(world, chosen, *, persona="t1_member", **amount) -> str:
    response = world.client(persona).post(URL, {"name": "job", "offering": chosen.slug, "regions": ["us-east-1"],
                                                    "duration_hours": 2, "ssh_public_key": SSH_KEY, **amount},
                                              format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["state"] == "scheduled"
    return response.json()["id"]


def activate(world, steps, chosen, *, persona="t1_member", **amount) -> str:
    """A reservation made and provisioned five minutes ago (a failure then comes after its hand-over)."""
    with time_machine.travel(timezone.now() - timedelta(minutes=5)):
        pk = create(world, chosen, persona=persona, **amount)
        steps.run()
    assert reservation(pk).state == "active"
    return pk


def active_instance(pk) -> Instance:
    return Instance.objects.select_related("node").get(reservation_id=pk, state="active")


def fail(node: Node, *, seconds_ago: float = 30.0, cause: str = "heartbeat_lost") -> Incident:
    """What detection does: the node's last heartbeat was ``seconds_ago``."""
    now = timezone.now()
    return node_failed(node=node, cause=cause, summary="no heartbeat for 3 periods",
                       evidence={"last_seen": (now - timedelta(seconds=seconds_ago)).isoformat()},
                       impact_started_at=now - timedelta(seconds=seconds_ago), detected_at=now)


def assert_no_overlap() -> None:
    """The database's rule, checked from the rows: no two allocations of one GPU's memory overlap in time."""
    rows = list(Allocation.objects.values_list("gpu_id", "mem_lo", "mem_hi", "starts_at", "ends_at", "pk"))
    for i, (gpu, lo, hi, start, end, pk) in enumerate(rows):
        for other, olo, ohi, ostart, oend, opk in rows[i + 1:]:
            assert not (gpu == other and lo < ohi and olo < hi and start < oend and ostart < end), (pk, opk)


def notifications(world, kind: str) -> list[Notification]:
    return list(Notification.objects.filter(tenant=world.t1.tenant, kind=kind))


#
# Bare metal
#


def test_a_server_on_a_failed_node_is_replaced_by_the_spare_on_its_leaf_in_the_same_vpc(world, fleet, steps):
    """
    The spare on the failed node's leaf takes over (not one on another leaf or fabric), joins the
    same VPC, is attested before the hand-over and the tenant gets its new access details; the
    failed node's allocations end at the failure, its ports leave; the incident says how long
    detection and restoration took.
    """
    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    old = active_instance(pk)
    failed = old.node
    assert failed.hostname != SPARE
    vpcs = set(PortMembership.objects.filter(instance=old).values_list("vpc_id", flat=True))
    assert len(vpcs) == 1
    far = add_node("us-east-1-ib-a-n0100", leaf(failed.fabric, "us-east-1-ib-a-p00-leaf001"), spare=True)
    foreign = add_node("us-east-1-ib-b-n0000", leaf(other_fabric(), "us-east-1-ib-b-p00-leaf000"), spare=True)

    platform = fail(failed, seconds_ago=30)
    tenant = Incident.objects.get(kind=NODE_FAILURE, reservation_id=pk)
    assert reservation(pk).state == "provisioning"  # active -> provisioning on the replacement
    assert notifications(world, "reservation.hardware_failed")
    ran_before = len(steps.ran)
    steps.run()

    assert reservation(pk).state == "active"
    new = active_instance(pk)
    assert new.node.hostname == SPARE and new.node.state == "allocated"
    assert new.address == f"{SPARE}.{world.t1.tenant.slug}.us-east-1.{settings.MERIDIAN_DNS_ZONE}"
    assert new.ssh_user == "ubuntu" and new.private_ip  # the failed server's address went back; any is fine
    assert not old.addresses.filter(released_at__isnull=True).exists()
    assert Instance.objects.get(pk=old.pk).state == "failed"
    assert [step for _, step, _ in steps.ran[ran_before:]] == ["power_on_deploy", "write_image", "boot_from_disk",
                                                               "join_network", "verify", "hand_over"]
    # The same network: the spare's ports are live members of the reservation's VPC, the failed node's left it.
    joined = PortMembership.objects.filter(instance=new, left_at__isnull=True)
    assert joined.count() == 8 and set(joined.values_list("vpc_id", flat=True)) == vpcs
    assert not PortMembership.objects.filter(instance=old, left_at__isnull=True).exists()
    assert still_members(fabric_driver_for(failed.fabric).read(), list(failed.ib_ports.values_list("guid", flat=True)))\
        == []
    # Attested before the hand-over, with the receipt kept on its allocations.
    assert AttestationReport.objects.get(node_id=new.node_id).status == "pass"
    spare_rows = Allocation.objects.filter(reservation_id=pk, node=new.node)
    assert spare_rows.count() == 8 and all(row.attestation_receipt for row in spare_rows)
    assert all(row.ends_at == reservation(pk).ends_at for row in spare_rows)
    # Nothing on the failed node is held any more: its allocations ended when the failure was handled,
    # not back at the impact (spend already counted is never taken back; the SLA credits the outage).
    # Nothing overlaps; far and foreign spares untouched.
    assert not Allocation.objects.filter(node=failed, ends_at__gt=timezone.now()).exists()
    assert not Allocation.objects.filter(node=failed, ends_at__lt=tenant.impact_started_at).exists()
    assert Allocation.objects.filter(node=failed).count() == 8  # history kept
    assert not Allocation.objects.filter(node__in=[far, foreign]).exists()
    assert_no_overlap()
    # The incidents: time to detect (30 s) and to restore; the tenant was told the new access details.
    tenant.refresh_from_db()
    assert tenant.tenant_id == world.t1.tenant.pk and tenant.gpus_affected == 8 and len(tenant.gpu_ids) == 8
    assert tenant.time_to_detect_s == pytest.approx(30, abs=0.01)
    assert tenant.restored_at is not None and 0 <= tenant.time_to_restore_s < 60
    platform.refresh_from_db()
    assert platform.tenant_id is None and platform.evidence["cause"] == "heartbeat_lost"
    assert platform.evidence["replacements"] == [{"reservation": pk, "nodes": [SPARE], "spares": 1, "same_leaf": 1}]
    ready = notifications(world, "reservation.hardware_replaced")
    assert len(ready) == 1 and new.address in ready[0].body and ready[0].link.endswith(f"/reservations/{pk}/")
    failed.refresh_from_db()
    assert failed.state == "faulty" and failed.health == "failed"
    assert set(unallocatable(failed.gpus.values_list("pk", flat=True))) == set(failed.gpus.values_list("pk",
                                                                                                        flat=True))


def test_of_two_servers_only_the_failed_one_is_replaced_the_other_serves_on(world, fleet, steps):
    pk = activate(world, steps, offering("bare_metal", 8), nodes=2)
    healthy, lost = Instance.objects.filter(reservation_id=pk).select_related("node").order_by("index")
    fail(lost.node)
    assert Instance.objects.get(pk=healthy.pk).state == "active"  # never touched
    steps.run()
    assert reservation(pk).state == "active"
    serving = Instance.objects.filter(reservation_id=pk, state="active").select_related("node")
    assert {i.node.hostname for i in serving} == {healthy.node.hostname, SPARE}
    assert Allocation.objects.filter(reservation_id=pk, node=healthy.node, ends_at=reservation(pk).ends_at).count() \
        == 8
    assert Operation.objects.filter(reservation_id=pk, kind="release").count() == 0  # nothing was cleaned
    assert_no_overlap()


def test_without_a_spare_on_its_leaf_a_spare_of_another_leaf_of_the_fabric_is_taken(world, fleet, steps):
    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    failed = active_instance(pk).node
    node_transition(actor=None, node=Node.objects.get(hostname=SPARE), target="maintenance")
    foreign = add_node("us-east-1-ib-b-n0000", leaf(other_fabric(), "us-east-1-ib-b-p00-leaf000"), spare=True)
    other_pod = add_node("us-east-1-ib-a-n0200", leaf(failed.fabric, "us-east-1-ib-a-p01-leaf008", pod=1), spare=True)
    same_pod = add_node("us-east-1-ib-a-n0100", leaf(failed.fabric, "us-east-1-ib-a-p00-leaf001"), spare=True)

    fail(failed)
    steps.run()
    assert reservation(pk).state == "active"
    assert active_instance(pk).node == same_pod  # its pod before the rest of the fabric
    assert not Allocation.objects.filter(node__in=[foreign, other_pod]).exists()
    assert_no_overlap()


def test_a_spare_of_another_fabric_is_never_taken_the_reservation_waits_then_gets_capacity(world, fleet, steps,
                                                                                          settings):
    """
    Same fabric always (the tenant's VPC is there). With no spare there and the ordinary pool not
    to be used, the reservation waits in provisioning and the tenant is told; capacity that frees
    up is taken by the tick.
    """
    settings.MERIDIAN_REPLACEMENT_FROM_POOL = False
    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    failed = active_instance(pk).node
    spare = Node.objects.get(hostname=SPARE)
    node_transition(actor=None, node=spare, target="maintenance")
    foreign = add_node("us-east-1-ib-b-n0000", leaf(other_fabric(), "us-east-1-ib-b-p00-leaf000"), spare=True)

    fail(failed)
    waiting = reservation(pk)
    assert waiting.state == "provisioning" and "no replacement is free" in waiting.state_reason
    assert len(notifications(world, "reservation.replacement_waiting")) == 1
    assert not Allocation.objects.filter(node=foreign).exists()
    assert not Instance.objects.filter(reservation_id=pk, state__in=["provisioning", "active"]).exists()
    assert ticking.tick()["replacements"] == 0  # still nothing: it waits, told once
    assert len(notifications(world, "reservation.replacement_waiting")) == 1

    node_transition(actor=None, node=spare, target="available")
    assert ticking.tick()["replacements"] == 1
    steps.run()
    assert reservation(pk).state == "active" and active_instance(pk).node == spare
    assert Incident.objects.get(reservation_id=pk).restored_at is not None
    assert not Allocation.objects.filter(node=foreign).exists()


def test_with_no_spare_ordinary_capacity_of_the_fabric_is_taken_and_the_incident_says_so(world, fleet, steps):
    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    failed = active_instance(pk).node
    node_transition(actor=None, node=Node.objects.get(hostname=SPARE), target="maintenance")

    platform = fail(failed)
    steps.run()
    new = active_instance(pk).node
    assert reservation(pk).state == "active" and not new.is_spare and new.fabric_id == failed.fabric_id
    platform.refresh_from_db()
    (record,) = platform.evidence["replacements"]
    assert record["spares"] == 0 and "no spare fitted" in record["note"]


def test_a_reservation_that_waits_too_long_fails_with_the_reason_and_gives_everything_back(world, fleet, steps,
                                                                                           settings):
    settings.MERIDIAN_REPLACEMENT_FROM_POOL = False
    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    failed = active_instance(pk).node
    node_transition(actor=None, node=Node.objects.get(hostname=SPARE), target="maintenance")
    fail(failed)
    assert reservation(pk).state == "provisioning"

    with time_machine.travel(timezone.now() + settings.MERIDIAN_REPLACEMENT_WAIT + timedelta(seconds=1)):
        assert ticking.tick()["replacements"] == 1
    gone = reservation(pk)
    assert gone.state == "failed" and "No replacement hardware became free" in gone.state_reason
    assert notifications(world, "reservation.replacement_failed")
    assert not Allocation.objects.filter(reservation_id=pk, ends_at__gt=timezone.now() + timedelta(minutes=1)).exists()
    assert Incident.objects.get(reservation_id=pk).resolved_at is not None


def test_a_spare_that_fails_attestation_is_held_and_the_next_spare_takes_over(world, fleet, steps, settings):
    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    failed = active_instance(pk).node
    next_spare = add_node("us-east-1-ib-a-n0100", leaf(failed.fabric, "us-east-1-ib-a-p00-leaf001"), spare=True)
    settings.MERIDIAN_SIMULATION = {**settings.MERIDIAN_SIMULATION, "attestation": {SPARE: "bad_measurement"}}

    fail(failed)
    steps.run()
    assert reservation(pk).state == "active"
    new = active_instance(pk)
    assert new.node == next_spare
    bad = Node.objects.get(hostname=SPARE)
    assert bad.state == "quarantined"
    never = Instance.objects.get(reservation_id=pk, node=bad)
    assert never.state == "failed" and not never.ssh_user  # never handed over (its name and address went back)
    assert not Allocation.objects.filter(node=bad, ends_at__gt=timezone.now()).exists()
    assert Incident.objects.get(reservation_id=pk).restored_at is not None
    assert len(notifications(world, "reservation.hardware_replaced")) == 1
    assert_no_overlap()


def test_a_node_failing_during_provisioning_is_replaced_before_the_hand_over(world, fleet, steps):
    pk = create(world, offering("bare_metal", 8), nodes=1)
    starting.reservation_provision_start(pk)
    first = Operation.objects.get(reservation_id=pk, kind="provision")
    failed = Instance.objects.get(reservation_id=pk).node
    fail(failed)
    first.refresh_from_db()
    assert first.state == "failed"  # all its work was on the failed node: the replacement takes over
    steps.run()
    assert reservation(pk).state == "active" and active_instance(pk).node.hostname == SPARE
    assert Incident.objects.get(reservation_id=pk).restored_at is not None


def test_reporting_the_same_failure_twice_opens_and_starts_nothing_twice(world, fleet, steps):
    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    failed = active_instance(pk).node
    first = fail(failed)
    again = fail(failed)
    assert again.pk == first.pk
    assert Incident.objects.filter(kind=NODE_FAILURE).count() == 2  # the platform's and the tenant's
    assert Operation.objects.filter(reservation_id=pk, kind="provision").count() == 2  # the first and one replacement
    assert len(notifications(world, "reservation.hardware_failed")) == 1
    steps.run()
    fail(failed)
    assert Incident.objects.filter(kind=NODE_FAILURE).count() == 2
    assert Operation.objects.filter(reservation_id=pk, kind="provision").count() == 2
    assert reservation(pk).state == "active"


def test_the_task_detection_sends_takes_ids_and_iso_times(world, fleet, steps):
    from provisioning.tasks import node_failed as node_failed_task

    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    failed = active_instance(pk).node
    impact = timezone.now() - timedelta(seconds=12)
    incident = Incident.objects.get(pk=node_failed_task(str(failed.pk), "heartbeat_lost", "3 heartbeats missed",
                                                        {"missed": 3}, impact.isoformat()))
    assert incident.impact_started_at == impact and incident.evidence["missed"] == 3
    assert incident.evidence["cause"] == "heartbeat_lost"
    assert node_failed_task(str(uuid.uuid4()), "heartbeat_lost", "gone", {}, None) is None  # a vanished node
    steps.run()
    assert active_instance(pk).node.hostname == SPARE


#
# Shared hosts: VMs and containers
#


def test_a_vm_on_a_failed_shared_host_moves_to_a_healthy_host(world, fleet, steps):
    pk = activate(world, steps, vm_offering(2), gpus=2)
    old = active_instance(pk)
    failed = old.node
    vpcs = set(PortMembership.objects.filter(instance=old).values_list("vpc_id", flat=True))
    old_gpus = [d["gpu_id"] for d in old.devices]

    fail(failed)
    steps.run()
    assert reservation(pk).state == "active"
    new = active_instance(pk)
    assert new.node != failed and new.node.pool == "shared" and new.node.fabric_id == failed.fabric_id
    assert new.name != old.name
    assert new.address == f"{new.name}.{world.t1.tenant.slug}.us-east-1.{settings.MERIDIAN_DNS_ZONE}"
    assert set(PortMembership.objects.filter(instance=new, left_at__isnull=True).values_list("vpc_id", flat=True)) \
        == vpcs
    assert set(GPU.objects.filter(pk__in=[d["gpu_id"] for d in new.devices]).values_list("state", flat=True)) == {
        "allocated"}
    # The failed host's GPUs that held the tenant's memory are held until it is repaired and validated.
    assert set(GPU.objects.filter(pk__in=old_gpus).values_list("state", flat=True)) == {"quarantined"}
    incident = Incident.objects.get(reservation_id=pk)
    assert failed.hostname not in incident.summary  # a shared host's name is not the tenant's to read
    assert sorted(incident.gpu_ids) == sorted(old_gpus) and incident.gpus_affected == 2
    assert AttestationReport.objects.filter(node_id=new.node_id, status="pass").exists()
    assert not Allocation.objects.filter(node=failed, ends_at__gt=timezone.now()).exists()  # ended when handled
    assert_no_overlap()


def test_container_slots_on_a_failed_host_are_placed_again_on_healthy_gpus(world, fleet, steps):
    chosen = offering("container", 1, slots_per_gpu=8)
    pk = activate(world, steps, chosen, slots=2)
    old = list(Instance.objects.filter(reservation_id=pk, state="active").select_related("node"))
    assert len(old) == 2 and len({i.node_id for i in old}) == 1
    failed = old[0].node

    fail(failed)
    steps.run()
    assert reservation(pk).state == "active"
    new = list(Instance.objects.filter(reservation_id=pk, state="active"))
    assert len(new) == 2 and all(i.node_id != failed.pk for i in new)
    for instance in new:
        (device,) = instance.devices
        assert device["mem_hi"] - device["mem_lo"] == 80 * 1024 // 8  # a slot of the offering's layout
    assert Allocation.objects.filter(reservation_id=pk, ends_at__gt=timezone.now()).count() == 2
    assert_no_overlap()


def test_a_step_failing_a_shared_host_for_good_replaces_the_other_tenants_work_on_it(world, fleet, steps,
                                                                                    monkeypatch):
    """
    The lifecycle marks a host faulty when a step fails on it for good: that reservation is
    placed again as before, and another tenant's VM on that host is replaced (on the next tick).
    """
    from provisioning.drivers.simulated import SimulatedVM

    theirs = activate(world, steps, vm_offering(1), persona="t2_member", gpus=1)
    host = active_instance(theirs).node
    mine = create(world, vm_offering(1), gpus=1)
    assert Allocation.objects.get(reservation_id=mine).node_id == host.pk  # best fit: the host already in use
    real = SimulatedVM.define

    def broken(self, target, name, xml):
        if target.hostname == host.hostname:
            from provisioning.drivers import DriverError
            raise DriverError("the hypervisor is gone", transient=False)
        return real(self, target, name, xml)

    monkeypatch.setattr(SimulatedVM, "define", broken)
    steps.run()
    assert Node.objects.get(pk=host.pk).state == "faulty"
    assert reservation(mine).state in ("queued", "scheduled", "provisioning", "active")  # placed again as before
    assert reservation(theirs).state == "active"  # until the tick replaces it
    assert Incident.objects.get(reservation_id=theirs).tenant_id == world.t2.tenant.pk
    assert ticking.tick()["replacements"] == 1
    steps.run()
    assert reservation(theirs).state == "active" and active_instance(theirs).node != host
    assert Incident.objects.get(reservation_id=theirs).restored_at is not None
    assert_no_overlap()


def test_a_failed_gpu_of_a_shared_host_moves_only_the_work_on_it(world, fleet, steps):
    """
    The host goes on: the failed GPU is held, the VM using it is cleaned (its healthy GPU scrubbed
    and freed) and provisioned again on healthy GPUs; another tenant's VM on the host is untouched.
    """
    pk = activate(world, steps, vm_offering(2), gpus=2)
    old = active_instance(pk)
    host = old.node
    bad, good = (d["gpu_id"] for d in old.devices)
    theirs = activate(world, steps, vm_offering(1), persona="t2_member", gpus=1)
    untouched = active_instance(theirs)
    assert untouched.node_id == host.pk  # best fit: the host already in use

    now = timezone.now()
    gpus_failed(node=host, gpu_ids=[bad], cause="xid_79", summary="GPU fell off the bus", evidence={"xid": 79},
                impact_started_at=now - timedelta(seconds=5), detected_at=now)
    steps.run()
    assert reservation(pk).state == "active"
    new = active_instance(pk)
    assert bad not in {d["gpu_id"] for d in new.devices}
    assert Instance.objects.get(pk=old.pk).state == "released"  # cleaned by the release pipeline, not abandoned
    assert GPU.objects.get(pk=bad).state == "quarantined"
    assert GPU.objects.get(pk=good).state in ("available", "allocated")  # scrubbed, free again (or taken anew)
    assert Node.objects.get(pk=host.pk).state == "in_service"
    assert Instance.objects.get(pk=untouched.pk).state == "active" and reservation(theirs).state == "active"
    assert not Incident.objects.filter(reservation_id=theirs).exists()
    incident = Incident.objects.get(reservation_id=pk)
    assert sorted(incident.gpu_ids) == sorted([bad, good]) and incident.gpus_affected == 2
    assert incident.evidence["failed_gpus"] == [bad] and incident.restored_at is not None
    assert not Allocation.objects.filter(gpu_id=bad, ends_at__gt=timezone.now()).exists()  # ended when handled
    assert_no_overlap()
    again = gpus_failed(node=host, gpu_ids=[bad], cause="xid_79", summary="GPU fell off the bus", evidence={},
                        impact_started_at=now)
    assert again.pk == Incident.objects.get(kind=NODE_FAILURE, tenant_id__isnull=True).pk  # nothing twice


def test_a_failed_gpu_of_a_server_fails_the_whole_server(world, fleet, steps):
    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    failed = active_instance(pk).node
    gpus_failed(node=failed, gpu_ids=[failed.gpus.first().pk], cause="xid_79", summary="GPU fell off the bus",
                evidence={}, impact_started_at=timezone.now())
    steps.run()
    assert Node.objects.get(pk=failed.pk).state == "faulty"
    assert active_instance(pk).node.hostname == SPARE


#
# The failed node: repair, then validation, then sold again
#


def test_a_failed_node_is_sold_again_only_after_repair_and_validation(world, fleet, steps):
    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    failed = active_instance(pk).node
    platform = fail(failed)
    steps.run()
    with pytest.raises(Conflict):
        node_repair_done(actor=None, node=failed)  # not in repair yet
    node_repair_start(actor=None, node=failed, reason="replace the HGX baseboard")
    assert Node.objects.get(pk=failed.pk).state == "repair"
    assert unallocatable(failed.gpus.values_list("pk", flat=True))

    node = node_repair_done(actor=None, node=failed)
    assert node.state == "validating"
    assert Operation.objects.filter(node=node, kind="validate", state="pending").exists()
    assert unallocatable(failed.gpus.values_list("pk", flat=True))  # validating: still not sold
    steps.run()
    node.refresh_from_db()
    assert node.state == "available" and node.health == "healthy"
    assert not unallocatable(node.gpus.values_list("pk", flat=True))
    platform.refresh_from_db()
    assert platform.resolved_at is not None


def test_a_node_detected_after_three_missed_heartbeats_has_its_times_recorded(world, fleet, steps):
    """The watchdog's model: detection at the first check after three missed periods; impact from the last heartbeat."""
    from cloud.health import FailurePolicy, heartbeat_state

    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    failed = active_instance(pk).node
    policy = FailurePolicy(heartbeat_interval_s=10)
    last_seen = timezone.now()
    assert heartbeat_state(last_seen, last_seen + timedelta(seconds=29), policy) != "faulty"
    detected = last_seen + timedelta(seconds=30)
    assert heartbeat_state(last_seen, detected, policy) == "faulty"
    with time_machine.travel(detected, tick=False):
        node_failed(node=failed, cause="heartbeat_lost", summary="3 heartbeats missed", evidence={},
                    impact_started_at=last_seen)
    steps.run()
    incident = Incident.objects.get(reservation_id=pk)
    assert incident.time_to_detect_s == pytest.approx(30, abs=0.01)
    assert incident.time_to_restore_s is not None and reservation(pk).state == "active"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the exclusion constraint is PostgreSQL's")
def test_the_database_refuses_a_replacement_that_would_overlap(world, fleet, steps):
    """A spare someone holds already is never bound twice: the exclusion constraint has the last word."""
    from django.db import IntegrityError, transaction

    pk = activate(world, steps, offering("bare_metal", 8), nodes=1)
    fail(active_instance(pk).node)
    steps.run()
    row = Allocation.objects.filter(reservation_id=pk, node__hostname=SPARE).first()
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(reservation_id=pk, gpu_id=row.gpu_id, node_id=row.node_id, mem_lo=0, mem_hi=1,
                                  starts_at=row.starts_at, ends_at=row.ends_at)
