"""
The drivers against real counterparts where one runs locally: RedfishPower against the sushy-tools
Redfish emulator (fake driver, one system, basic auth), LibvirtVM against libvirt's test driver;
the pure builders (pci_address, domain_xml); the drivers_for registry; and the simulated drivers' fault injection.
"""

from __future__ import annotations

import functools
import http.server
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import types
import urllib.request
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import bcrypt
import pytest
import sushy
import sushy.connector

from provisioning.drivers import DriverError, Target, drivers_for
from provisioning.drivers.libvirt_vm import LibvirtVM, domain_xml, pci_address
from provisioning.drivers.redfish import RedfishPower
from provisioning.drivers.simulated import (
    Simulated,
    SimulatedContainers,
    SimulatedHost,
    SimulatedImage,
    SimulatedPower,
    SimulatedVM,
)
from provisioning.models import SimulatedDevice

PASSWORD = "bmc-Pa55-correct-9f3k"  # distinctive, so a leak into a message or a log is unmistakable
WRONG_PASSWORD = "bmc-Pa55-wrong-7q2z"
GPUS = [{"gpu_id": "gpu-a", "pci_bus_id": "00000000:18:00.0"}, {"gpu_id": "gpu-b", "pci_bus_id": "00000000:2a:00.0"}]

#
# Redfish, against the sushy-tools emulator
#

LAUNCHER = """\
import sys, types
from sushy_tools.emulator.resources.systems import fakedriver
fakedriver.random = types.SimpleNamespace(randint=lambda a, b: 0)  # power changes at once, not after 1-11 s
from sushy_tools.emulator.main import main
sys.exit(main())
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def bmc(tmp_path_factory):
    """A Redfish emulator with one system behind basic auth (admin / PASSWORD); yields its service root."""
    root = tmp_path_factory.mktemp("redfish")
    (root / "state").mkdir()
    (root / "tmp").mkdir()
    (root / "htpasswd").write_text(f"admin:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
    port = _free_port()
    (root / "emulator.conf").write_text(
        f"SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n"
        f"SUSHY_EMULATOR_LISTEN_PORT = {port}\n"
        f"SUSHY_EMULATOR_STATE_DIR = {str(root / 'state')!r}\n"
        f"SUSHY_EMULATOR_AUTH_FILE = {str(root / 'htpasswd')!r}\n"
        "SUSHY_EMULATOR_FAKE_DRIVER = True\n"
        "SUSHY_EMULATOR_FAKE_SYSTEMS = [{'uuid': '11111111-2222-3333-4444-555555555501', 'name': 'gpu-node-01', "
        "'power_state': 'Off', 'external_notifier': False, "
        "'nics': [{'mac': '52:54:00:00:00:01', 'ip': '127.0.0.101'}]}]\n"
    )
    (root / "launch.py").write_text(LAUNCHER)
    service_root = f"http://127.0.0.1:{port}/redfish/v1"
    with (root / "emulator.log").open("w") as log:
        environment = {**os.environ, "TMPDIR": str(root / "tmp")}  # where it downloads inserted media
        emulator = subprocess.Popen([sys.executable, root / "launch.py", "--config", root / "emulator.conf"],
                                    stdout=log, stderr=subprocess.STDOUT, env=environment)
        try:
            deadline = time.monotonic() + 20
            while not _answers(service_root + "/"):
                if emulator.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"The Redfish emulator did not start:\n{(root / 'emulator.log').read_text()}")
                time.sleep(0.05)
            yield service_root
        finally:
            emulator.terminate()
            try:
                emulator.wait(timeout=10)
            except subprocess.TimeoutExpired:
                emulator.kill()
                emulator.wait()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_url(tmp_path_factory):
    """The URL of a small boot.iso served over http: the emulator really downloads what is inserted."""
    served = tmp_path_factory.mktemp("images")
    (served / "boot.iso").write_bytes(b"MERIDIAN-DEPLOY-IMAGE")
    (served / "config-drive.iso").write_bytes(b"MERIDIAN-CONFIG-DRIVE")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=served))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/boot.iso"
    server.shutdown()
    server.server_close()


def _node(service_root: str, password: str = PASSWORD) -> Target:
    return Target(node_id="1", hostname="gpu-node-01", bmc_address=service_root, bmc_username="admin",
                  bmc_password=password)


def test_redfish_power_on_and_off(bmc):
    power, node = RedfishPower(), _node(bmc)
    assert power.power_state(node) == "off"
    power.set_power(node, True)
    assert power.power_state(node) == "on"
    power.set_power(node, False)
    assert power.power_state(node) == "off"


def test_redfish_boot_device_reads_back(bmc):
    power, node = RedfishPower(), _node(bmc)
    for device in ("pxe", "cd", "hdd"):
        power.set_boot_device(node, device)
        assert power.boot_device(node) == device


def test_redfish_refusals_of_the_bmc_fail_for_good_instead_of_escaping(bmc):
    """An unknown device is refused before the call; a refusal of the BMC (this one cannot clear the override) too."""
    power, node = RedfishPower(), _node(bmc)
    with pytest.raises(DriverError) as raised:
        power.set_boot_device(node, "bogus")
    assert raised.value.transient is False and "pxe" in str(raised.value)
    with pytest.raises(DriverError) as refused:
        power.set_boot_device(node, "none")
    assert refused.value.transient is False and "400" in str(refused.value)


def test_redfish_virtual_media_insert_and_eject(bmc, image_url):
    power, node = RedfishPower(), _node(bmc)
    assert power.media(node) is None
    power.insert_media(node, image_url)
    assert power.media(node) == image_url  # the CD's Image is the URL as inserted
    power.eject_media(node)
    assert power.media(node) is None


def test_bare_metal_steps_deploy_boot_the_os_and_release_through_the_emulator(bmc, image_url, monkeypatch, settings):
    """
    The bare-metal steps with the Redfish driver: the deploy image from the virtual CD (one-time
    boot), then off, the config drive in its place, boot from disk, on; a retry changes nothing;
    release powers off and ejects.
    """
    from types import SimpleNamespace

    from provisioning.drivers import Drivers
    from provisioning.lifecycle import steps as lifecycle_steps

    drive = image_url.replace("boot.iso", "config-drive.iso")
    monkeypatch.setattr(lifecycle_steps.cloud_init, "drive_for", lambda instance, **kw: "drive")
    monkeypatch.setattr(lifecycle_steps.cloud_init, "drive_url", lambda _drive: drive)
    monkeypatch.setattr(lifecycle_steps, "keys_of", lambda reservation: [])
    monkeypatch.setattr(lifecycle_steps, "mounts_for", lambda reservation: [])
    settings.MERIDIAN_DEPLOY_IMAGE_URL = image_url
    target = _node(bmc)
    server = SimpleNamespace(pk=target.node_id, hostname=target.hostname, bmc_address=target.bmc_address,
                             bmc_username=target.bmc_username, bmc_password=target.bmc_password)
    power = RedfishPower()
    ctx = lifecycle_steps.Context(operation=None, drivers=Drivers(power=power, image=None, vm=None, container=None,
                                                                  host=None),
                                  reservation=None, instances=[SimpleNamespace(node=server)])
    if power.power_state(target) == "on":
        power.set_power(target, False)

    lifecycle_steps.power_on_deploy(ctx)
    assert (power.media(target), power.boot_device(target), power.power_state(target)) == (image_url, "cd", "on")
    lifecycle_steps.boot_from_disk(ctx)
    assert (power.media(target), power.boot_device(target), power.power_state(target)) == (drive, "hdd", "on")
    calls = []
    monkeypatch.setattr(power, "_call", lambda tgt, what, act, _real=power._call: calls.append(what)
                        or _real(tgt, what, act))
    lifecycle_steps.boot_from_disk(ctx)  # a retry after the worker died: reads only
    assert all(what.startswith("read") for what in calls), calls
    lifecycle_steps.power_off(ctx)
    assert (power.media(target), power.power_state(target)) == (None, "off")


def test_redfish_unreachable_bmc_is_transient_and_keeps_the_password_out(monkeypatch, caplog):
    """Nothing listens on the port (a bound socket that never listens refuses): retry later, say nothing secret."""
    monkeypatch.setattr(sushy.connector, "time", types.SimpleNamespace(sleep=lambda _s: None))  # sushy's 9 x 3 s
    caplog.set_level(logging.DEBUG)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        node = _node(f"http://127.0.0.1:{closed.getsockname()[1]}/redfish/v1")
        with pytest.raises(DriverError) as raised:
            RedfishPower().power_state(node)
    assert raised.value.transient is True
    assert "did not answer" in str(raised.value)
    assert PASSWORD not in str(raised.value) + str(raised.value.__cause__) + caplog.text


def test_redfish_wrong_password_is_permanent_and_keeps_the_password_out(bmc, caplog):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(DriverError) as raised:
        RedfishPower().power_state(_node(bmc, WRONG_PASSWORD))
    assert raised.value.transient is False
    assert "update the node's BMC username and password" in str(raised.value)
    assert WRONG_PASSWORD not in str(raised.value) + str(raised.value.__cause__) + caplog.text


def test_redfish_readings_come_from_the_systems_chassis(bmc):
    """
    The emulator's chassis has a Thermal resource (its CPU at 41 °C, the intake at 25 °C) and no
    Power resource: temperatures and health are read, the power is None, nothing fails.
    """
    readings = RedfishPower().readings(_node(bmc))
    assert readings["health"] == "ok"
    assert {(t["context"], t["celsius"]) for t in readings["temperatures"]} == {("CPU", 41), ("Intake", 25)}
    assert readings["power_w"] is None


def test_redfish_power_reading_follows_the_power_schema():
    """
    PowerControl[0].PowerConsumedWatts when the BMC reports it (DMTF schema Power.v1_x: the first
    PowerControl is the chassis' total); else the supplies' LastPowerOutputWatts, as in sushy's own
    sample document (two supplies at 650 W and 635 W, no PowerControl).
    """
    import json as json_module

    from provisioning.drivers.redfish import power_watts

    sample = json_module.loads((Path(sushy.__file__).parent / "tests/unit/json_samples/power.json").read_text())
    assert power_watts(sample) == 1285.0
    assert power_watts({"PowerControl": [{"PowerConsumedWatts": 344}, {"PowerConsumedWatts": 120}]}) == 344.0
    assert power_watts({"PowerControl": [{"PowerConsumedWatts": None}]}) is None
    assert power_watts(None) is None


#
# libvirt, against its test driver
#


@pytest.fixture
def hypervisor(settings):
    """libvirt's test:///default, held open: its state lives only while some connection to it does."""
    libvirt = pytest.importorskip("libvirt")
    settings.MERIDIAN_LIBVIRT_URI = "test:///default"
    conn = libvirt.open("test:///default")
    yield conn
    conn.close()


def _xml(text: str) -> ET.Element:
    return ET.fromstring(text)  # noqa: S314 -- XML built here or returned by the local test hypervisor


def _vm_xml(name: str) -> str:
    return domain_xml(name=name, vcpus=4, memory_mib=2048, devices=GPUS, image=f"/var/lib/meridian/{name}.qcow2")


def test_libvirt_domain_lifecycle(hypervisor):
    vms, host, name = LibvirtVM(), Target(node_id="1", hostname="gpu-host-01"), f"vm-{uuid.uuid4().hex[:12]}"
    assert vms.domain_state(host, name) == "absent"
    vms.define(host, name, _vm_xml(name))
    assert vms.domain_state(host, name) == "defined"
    vms.start(host, name)
    assert vms.domain_state(host, name) == "running"
    vms.stop(host, name)
    assert vms.domain_state(host, name) == "defined"
    vms.undefine(host, name)
    assert vms.domain_state(host, name) == "absent"


def test_libvirt_defined_domain_passes_both_gpus_through(hypervisor):
    vms, host, name = LibvirtVM(), Target(node_id="1", hostname="gpu-host-01"), f"vm-{uuid.uuid4().hex[:12]}"
    vms.define(host, name, _vm_xml(name))
    try:
        hostdevs = _xml(hypervisor.lookupByName(name).XMLDesc()).findall("devices/hostdev")
        assert [dict(h.find("source/address").attrib) for h in hostdevs] == [
            {"domain": "0x0000", "bus": "0x18", "slot": "0x00", "function": "0x0"},
            {"domain": "0x0000", "bus": "0x2a", "slot": "0x00", "function": "0x0"},
        ]
        assert all(h.get("managed") == "yes" and h.find("driver").get("name") == "vfio" for h in hostdevs)
    finally:
        vms.undefine(host, name)


def test_libvirt_unknown_domain_is_absent(hypervisor):
    assert LibvirtVM().domain_state(Target(node_id="1", hostname="gpu-host-01"), f"vm-{uuid.uuid4().hex}") == "absent"


def test_libvirt_malformed_xml_is_refused_for_good(hypervisor):
    with pytest.raises(DriverError) as raised:
        LibvirtVM().define(Target(node_id="1", hostname="gpu-host-01"), "vm-broken", "<domain><name>vm-broken")
    assert raised.value.transient is False


def test_libvirt_a_domain_without_a_name_is_refused_for_good(hypervisor):
    with pytest.raises(DriverError) as raised:
        LibvirtVM().define(Target(node_id="1", hostname="gpu-host-01"), "vm-nameless",
                           "<domain type='kvm'><memory>1024</memory></domain>")
    assert raised.value.transient is False


def test_libvirt_start_of_missing_domain_fails_for_good(hypervisor):
    with pytest.raises(DriverError) as raised:
        LibvirtVM().start(Target(node_id="1", hostname="gpu-host-01"), f"vm-{uuid.uuid4().hex}")
    assert raised.value.transient is False


#
# Pure builders
#


@pytest.mark.parametrize("bus_id", ["00000000:18:00.0", "0000:18:00.0"])
def test_pci_address_parses_nvml_and_short_bus_ids(bus_id):
    assert pci_address(bus_id) == {"domain": "0x0000", "bus": "0x18", "slot": "0x00", "function": "0x0"}


@pytest.mark.parametrize("bus_id", ["garbage", "", "0000:18:00", "0000:zz:00.0", "18:00.0.1", "0000:-1:00.0",
                                    "0000:1ff:00.0", "0000:18:00.8", "0000:18:20.0", " 0000:18:00.0", None])
def test_pci_address_rejects_garbage_for_good(bus_id):
    with pytest.raises(DriverError) as raised:
        pci_address(bus_id)
    assert raised.value.transient is False


def test_domain_xml_has_one_vfio_managed_hostdev_per_gpu():
    domain = _xml(domain_xml(name="vm-1", vcpus=8, memory_mib=4096, devices=GPUS, image="/img/vm-1.qcow2"))
    assert (domain.get("type"), domain.findtext("name"), domain.findtext("vcpu")) == ("kvm", "vm-1", "8")
    hostdevs = domain.findall("devices/hostdev")
    assert len(hostdevs) == 2
    assert all((h.get("mode"), h.get("type"), h.get("managed")) == ("subsystem", "pci", "yes") for h in hostdevs)
    assert [h.find("driver").get("name") for h in hostdevs] == ["vfio", "vfio"]
    assert [h.find("source/address").get("bus") for h in hostdevs] == ["0x18", "0x2a"]


#
# The registry
#


def test_drivers_for_defaults_to_simulated(settings):
    settings.MERIDIAN_DRIVERS = {"default": {}}
    drivers = drivers_for("us-east-1")
    assert [type(d) for d in (drivers.power, drivers.image, drivers.vm, drivers.container, drivers.host)] == [
        SimulatedPower, SimulatedImage, SimulatedVM, SimulatedContainers, SimulatedHost]


def test_drivers_for_region_override(settings):
    settings.MERIDIAN_DRIVERS = {"default": {}, "us-east-1": {"power": "redfish"}}
    assert isinstance(drivers_for("us-east-1").power, RedfishPower)
    assert isinstance(drivers_for("eu-west-1").power, SimulatedPower)
    assert isinstance(drivers_for("us-east-1").image, SimulatedImage)


def test_drivers_for_unknown_implementation_names_the_known_ones(settings):
    settings.MERIDIAN_DRIVERS = {"default": {"vm": "vmware"}}
    with pytest.raises(DriverError, match="No vm driver 'vmware' \\(known: simulated, libvirt\\)") as raised:
        drivers_for("us-east-1")
    assert raised.value.transient is False


#
# Simulated fault injection
#


def _simulate(settings, **knobs):
    settings.MERIDIAN_SIMULATION = {"seed": 1, "latency_s": {}, "failure_rate": {}, "broken_rate": {}, **knobs}


@pytest.mark.django_db
def test_simulated_failure_is_transient_counted_and_changes_nothing(settings):
    _simulate(settings, failure_rate={"write_image": 1.0})
    node = Target(node_id="1", hostname="sim-node-1")
    with pytest.raises(DriverError) as raised:
        SimulatedImage().write_image(node, "ubuntu-24.04", "ssh-ed25519 AAAA", "instance-1")
    assert raised.value.transient is True
    assert SimulatedImage().image(node) is None
    assert SimulatedDevice.objects.get(key="disk:sim-node-1").state == {}
    assert Simulated.calls("disk", "sim-node-1") == {"write_image": 1}


@pytest.mark.django_db
def test_simulated_start_of_a_missing_domain_fails_for_good_and_starts_nothing(settings):
    _simulate(settings)
    vms, node = SimulatedVM(), Target(node_id="1", hostname="sim-host-1")
    with pytest.raises(DriverError, match="No domain vm-1 on sim-host-1") as raised:
        vms.start(node, "vm-1")
    assert raised.value.transient is False
    assert vms.domain_state(node, "vm-1") == "absent"
    vms.define(node, "vm-1", "<domain/>")
    vms.start(node, "vm-1")
    assert vms.domain_state(node, "vm-1") == "running"
    assert Simulated.calls("hypervisor", "sim-host-1") == {"define": 1, "start": 1}  # the refused start undone


@pytest.mark.django_db
def test_simulated_broken_hardware_fails_for_good(settings):
    _simulate(settings, broken_rate={"write_image": 1.0})
    with pytest.raises(DriverError) as raised:
        SimulatedImage().write_image(Target(node_id="1", hostname="sim-node-1"), "ubuntu-24.04", "ssh-ed25519 AAAA",
                                     "instance-1")
    assert raised.value.transient is False


def _outcomes(hostname: str, calls: int = 20) -> str:
    """'.' for each write that succeeded, 'x' for each that failed."""
    disks, node, seen = SimulatedImage(), Target(node_id="1", hostname=hostname), []
    for _ in range(calls):
        try:
            disks.write_image(node, "ubuntu-24.04", "ssh-ed25519 AAAA", "instance-1")
            seen.append(".")
        except DriverError:
            seen.append("x")
    return "".join(seen)


@pytest.mark.django_db
def test_simulated_faults_are_deterministic_under_the_seed(settings):
    _simulate(settings, failure_rate={"write_image": 0.5})
    first = _outcomes("sim-node-1")
    SimulatedDevice.objects.all().delete()
    assert _outcomes("sim-node-1") == first
    assert "." in first and "x" in first
    assert _outcomes("sim-node-2") != first  # each device rolls its own dice (the key is in the seed)


#
# Out-of-band readings of the simulated BMC and fabric
#


@pytest.mark.django_db
def test_simulated_bmc_readings_follow_the_power_and_the_knobs():
    bmc, node = SimulatedPower(), Target(node_id="1", hostname="sim-node-1")
    off = bmc.readings(node)
    assert (off["power_w"], off["health"]) == (12.0, "ok")
    assert {t["context"] for t in off["temperatures"]} == {"CPU", "Intake"}  # no enrolled node: no GPU sensor
    bmc.set_power(node, True)
    bmc.set_readings(node, power_w=4800.0, health="critical")
    on = bmc.readings(node)
    assert (on["power_w"], on["health"]) == (4800.0, "critical")
    assert bmc.readings(node) == on  # deterministic


@pytest.mark.django_db
def test_simulated_fabric_keeps_port_states():
    from provisioning.drivers.simulated import SimulatedFabric

    fabric = SimulatedFabric(name="us-east-1/ib-a")
    ports = ["0xB83FD20300000001", "b83fd20300000002"]
    assert fabric.port_states(ports) == {"b83fd20300000001": "up", "b83fd20300000002": "up"}
    fabric.set_port_state(ports[0], "down")
    assert fabric.port_states(ports)["b83fd20300000001"] == "down"
    fabric.set_port_state(ports[0], "up")
    assert set(fabric.port_states(ports).values()) == {"up"}


def test_libvirt_a_vm_disk_is_a_copy_on_write_volume_over_the_image_and_is_deleted(hypervisor):
    """In the test driver's own pool: the clone is backed by the image's volume; deleting it leaves only the image."""
    vms, host, pool = LibvirtVM(), Target(node_id="1", hostname="gpu-host-01"), "default-pool"
    base = f"img-{uuid.uuid4().hex[:8]}.qcow2"
    hypervisor.storagePoolLookupByName(pool).createXML(
        f"<volume><name>{base}</name><capacity unit='GiB'>8</capacity><target><format type='qcow2'/></target>"
        "</volume>", 0)
    disk = f"vm-{uuid.uuid4().hex[:12]}.qcow2"
    assert vms.volume(host, pool, disk) is None
    path = vms.create_volume(host, pool, disk, base=base, size_gib=20)
    assert vms.volume(host, pool, disk) == path
    described = _xml(hypervisor.storagePoolLookupByName(pool).storageVolLookupByName(disk).XMLDesc())
    assert described.find("backingStore/path").text == vms.volume(host, pool, base)
    vms.delete_volume(host, pool, disk)
    vms.delete_volume(host, pool, disk)  # a retried delete finds it gone
    names = hypervisor.storagePoolLookupByName(pool).listVolumes()
    assert disk not in names and base in names
    hypervisor.storagePoolLookupByName(pool).storageVolLookupByName(base).delete(0)


def test_libvirt_a_missing_image_volume_or_pool_fails_for_good_naming_it(hypervisor):
    vms, host = LibvirtVM(), Target(node_id="1", hostname="gpu-host-01")
    with pytest.raises(DriverError, match="'no-such-image.qcow2' is not in pool") as raised:
        vms.create_volume(host, "default-pool", "vm-x.qcow2", base="no-such-image.qcow2", size_gib=10)
    assert raised.value.transient is False
    with pytest.raises(DriverError, match="no storage pool 'nowhere'") as raised:
        vms.volume(host, "nowhere", "vm-x.qcow2")
    assert raised.value.transient is False


def test_libvirt_accepts_a_domain_with_its_config_drive_nic_and_serial_console(hypervisor):
    vms, host, name = LibvirtVM(), Target(node_id="1", hostname="gpu-host-01"), f"vm-{uuid.uuid4().hex[:12]}"
    xml = domain_xml(name=name, vcpus=4, memory_mib=2048, devices=GPUS, image=f"/default-pool/{name}.qcow2",
                     network="default", mac="52:54:00:12:34:56",
                     config_drive="https://meridian.example:8443/instance-data/x/secret/config-drive.iso")
    vms.define(host, name, xml)
    try:
        described = _xml(hypervisor.lookupByName(name).XMLDesc())
        cdrom = described.find("devices/disk[@device='cdrom']")
        assert cdrom.find("source").get("protocol") == "https"
        assert cdrom.find("source").get("name") == "/instance-data/x/secret/config-drive.iso"
        assert cdrom.find("source/host").attrib == {"name": "meridian.example", "port": "8443"}
        assert described.find("devices/interface/mac").get("address") == "52:54:00:12:34:56"
        assert described.find("devices/serial") is not None
    finally:
        vms.undefine(host, name)
