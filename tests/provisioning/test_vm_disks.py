"""
A VM's devices. Its disk: a copy-on-write volume in the host's pool over the image's base volume, named in its
domain, and gone with the domain on release -- nothing of the tenant's is left in the pool. A driver
failure mid-provisioning gives back the address and the config drive; where the host is not at
fault its VM is cleaned like any other, volume included. Its InfiniBand virtual function is passed
through by PCI address beside its GPUs, and is the port that joins the tenant's VPC.
"""

import xml.etree.ElementTree as ET

import pytest

from provisioning.lifecycle import guest_steps
from provisioning.lifecycle import steps as lifecycle_steps
from provisioning.lifecycle.steps import NodeFault
from provisioning.models import AddressAssignment, ConfigDrive, Instance, Reservation, SimulatedDevice
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY, reservation
from tests.world import small_fleet

URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(4)


def reserve(world, **extra):
    response = world.client("t1_member").post(URL, {
        "name": "vm", "offering": offering("vm", 1).slug, "regions": ["us-east-1"], "duration_hours": 2,
        "ssh_public_key": SSH_KEY, "gpus": 1, **extra}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def hypervisor(instance) -> dict:
    return SimulatedDevice.objects.get(key=f"hypervisor:{instance.node.hostname}").state


def test_a_vm_boots_a_clone_of_its_image_and_release_leaves_no_volume(world, fleet, steps, settings):
    pk = reserve(world)
    steps.run()
    assert reservation(pk).state == "active"
    instance = Instance.objects.get(reservation_id=pk)
    volume = hypervisor(instance)["volumes"][f"{settings.MERIDIAN_LIBVIRT_POOL}/{instance.name}.qcow2"]
    assert volume["base"] == f"{settings.MERIDIAN_OS_IMAGE}.qcow2"
    assert volume["size_gib"] == settings.MERIDIAN_VM_DISK_GIB
    domain = ET.fromstring(hypervisor(instance)["domains"][instance.name]["xml"])  # noqa: S314 -- our own XML
    assert domain.find("devices/disk[@device='disk']/source").get("file") == volume["path"]
    assert world.client("t1_member").post(f"{URL}{pk}/release/").status_code == 200
    steps.run()
    assert reservation(pk).state == "released"
    assert hypervisor(instance)["volumes"] == {} and hypervisor(instance)["domains"] == {}


def test_a_vm_gets_its_ib_virtual_function_passed_through_and_joined(world, fleet, steps, settings):
    from cloud.models import HCAPort
    from provisioning.drivers.libvirt_vm import vf_pci_address
    from provisioning.models import PortMembership, VirtualFunction

    pk = reserve(world)
    steps.run()
    assert reservation(pk).state == "active"
    instance = Instance.objects.get(reservation_id=pk)
    vf = VirtualFunction.objects.select_related("port").get(instance=instance)
    domain = ET.fromstring(hypervisor(instance)["domains"][instance.name]["xml"])  # noqa: S314 -- our own XML
    addresses = [h.find("source/address").attrib for h in domain.findall("devices/hostdev")]
    assert len(addresses) == 2  # its GPU, then its virtual function
    expected = vf_pci_address(vf.port.pci_bus_id, vf.index)
    bus, slot_function = expected.split(":")[1:]
    assert (addresses[1]["bus"], addresses[1]["slot"], addresses[1]["function"]) == (
        f"0x{bus}", f"0x{slot_function[:2]}", f"0x{slot_function[3]}")
    assert PortMembership.objects.filter(instance=instance, guid=vf.guid, left_at__isnull=True).exists()
    # A host whose ports' PCI addresses were never recorded cannot pass a function through: it says so.
    HCAPort.objects.filter(node=instance.node).update(pci_bus_id="")
    with pytest.raises(lifecycle_steps.DriverError, match="ib_port_pci_bus_ids"):
        guest_steps.ib_function(instance)


def test_virtual_functions_sit_after_their_physical_function_on_the_bus():
    from provisioning.drivers.libvirt_vm import vf_pci_address

    assert vf_pci_address("00000000:1a:00.0", 0) == "00000000:1a:00.1"
    assert vf_pci_address("00000000:1a:00.0", 7) == "00000000:1a:01.0"
    assert vf_pci_address("0000:1a:00.1", 0, offset=7, stride=2) == "0000:1a:01.0"
    with pytest.raises(lifecycle_steps.DriverError, match="beyond"):
        vf_pci_address("0000:ff:1f.7", 0)


@pytest.mark.parametrize("action", ["create_volume", "define", "start"])
def test_a_vm_whose_host_fails_mid_provisioning_gives_back_everything(world, fleet, steps, settings, action):
    """The host's driver refuses for good at each of its calls: the host is held, and nothing of the VM stays."""
    from provisioning.models import VirtualFunction

    settings.MERIDIAN_PROVISION_FAILURES = 1
    settings.MERIDIAN_SIMULATION = {"seed": 0, "latency_s": {}, "failure_rate": {}, "broken_rate": {action: 1.0}}
    pk = reserve(world)
    steps.run()
    assert reservation(pk).state == "failed"
    instance = Instance.objects.get(reservation_id=pk)
    assert instance.state == "failed"
    assert not AddressAssignment.objects.filter(instance=instance, released_at__isnull=True).exists()
    assert not ConfigDrive.objects.filter(instance=instance).exists()
    assert not VirtualFunction.objects.filter(instance=instance).exists()
    assert hypervisor(instance).get("volumes", {}) == {} and hypervisor(instance).get("domains", {}) == {}


def test_a_vm_cleaned_after_a_fault_not_its_hosts_leaves_no_volume(world, fleet, steps, monkeypatch):
    def refused(ctx):
        raise NodeFault(ctx.instances[0].node, "the tenant's network cannot be made", transient=False, blame=False)

    pipeline = lifecycle_steps.PIPELINES[("provision", "vm")]
    monkeypatch.setitem(lifecycle_steps.PIPELINES, ("provision", "vm"), [
        step if step.name != "join_network" else lifecycle_steps.Step("join_network", refused) for step in pipeline])
    pk = reserve(world)
    steps.run()
    instance = Instance.objects.get(reservation_id=pk)
    assert instance.state == "released"
    assert hypervisor(instance)["volumes"] == {} and hypervisor(instance)["domains"] == {}
    assert not AddressAssignment.objects.filter(instance=instance, released_at__isnull=True).exists()
    assert not ConfigDrive.objects.filter(instance=instance).exists()
