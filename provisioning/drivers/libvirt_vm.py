"""
GPU VMs through libvirt: the domain XML (the allocated GPUs passed through as PCI hostdevs,
VFIO-managed) and a client for the host's hypervisor. ``libvirt-python`` is optional (it builds
against the system's libvirt); the XML builder needs nothing.
"""

from __future__ import annotations

import hashlib
import re
import xml.etree.ElementTree as ET
from urllib.parse import urlsplit

from django.conf import settings

from provisioning.drivers.base import DriverError, Target, VMDriver

PCI_BUS_ID = re.compile(r"^([0-9a-f]{4,8}):([0-9a-f]{2}):([01][0-9a-f])\.([0-7])$", re.IGNORECASE)


def pci_address(bus_id: str) -> dict[str, str]:
    """'00000000:18:00.0' (NVML) or '0000:18:00.0' -> libvirt's domain/bus/slot/function attributes."""
    match = PCI_BUS_ID.match(bus_id) if isinstance(bus_id, str) else None
    if not match:
        raise DriverError(f"'{bus_id}' is not a PCI bus id (domain:bus:slot.function).", transient=False)
    domain, bus, slot, function = (int(part, 16) for part in match.groups())
    return {"domain": f"0x{domain:04x}", "bus": f"0x{bus:02x}", "slot": f"0x{slot:02x}", "function": f"0x{function:x}"}


def vf_pci_address(pf_bus_id: str, index: int, *, offset: int = 1, stride: int = 1) -> str:
    """
    The PCI address of virtual function ``index`` of a physical function: SR-IOV puts VF n at the
    PF's routing ID (bus, device, function as 8+5+3 bits) + First VF Offset + n x VF Stride.
    """
    parts = pci_address(pf_bus_id)
    pf_rid = int(parts["bus"], 16) << 8 | int(parts["slot"], 16) << 3 | int(parts["function"], 16)
    rid = pf_rid + offset + index * stride
    if rid > 0xFFFF:
        raise DriverError(f"Virtual function {index} of {pf_bus_id} falls beyond the PCI bus range.", transient=False)
    domain = pf_bus_id.split(":")[0]
    return f"{domain}:{rid >> 8:02x}:{(rid >> 3) & 0x1F:02x}.{rid & 0x7}"


def mac_address(seed: str) -> str:
    """A stable locally administered MAC in QEMU's range (52:54:00), for the VM's NIC and its network config."""
    digest = hashlib.sha256(seed.encode()).digest()
    return "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])


def domain_xml(*, name: str, vcpus: int, memory_mib: int, devices: list[dict], image: str,
               domain_type: str = "kvm", network: str | None = None, mac: str | None = None,
               config_drive: str | None = None, ib_functions: tuple[str, ...] = (),
               volumes: tuple[tuple[str, str, bool], ...] = (), numa_node: int | None = None,
               cpuset: str = "") -> str:
    """
    A VM with the given GPUs and InfiniBand virtual functions (``ib_functions``, PCI addresses)
    passed through (one hostdev each), its disk from ``image``, a virtio
    NIC on the libvirt ``network`` (with ``mac``), and its cloud-init config drive as a read-only
    CD-ROM that QEMU reads from the drive's HTTPS or HTTP URL (a network disk: nothing to copy
    onto the host first). Each of ``volumes`` -- (storage pool, volume, read-only) -- is a further
    virtio disk (vdb, vdc...) from the hosts' shared storage pool, with the volume's name's first 20
    characters as its serial: the guest finds it at /dev/disk/by-id/virtio-<serial>. With
    ``numa_node`` (its GPUs' NUMA node) its memory is taken from that node only, and with
    ``cpuset`` (that node's CPUs) its vCPUs run there: GPU transfers then never cross the CPUs' link.
    """
    domain = ET.Element("domain", type=domain_type)
    ET.SubElement(domain, "name").text = name
    ET.SubElement(domain, "memory", unit="MiB").text = str(memory_mib)
    ET.SubElement(domain, "vcpu", **({"placement": "static", "cpuset": cpuset} if cpuset else {})).text = str(vcpus)
    if numa_node is not None:
        ET.SubElement(ET.SubElement(domain, "numatune"), "memory", mode="strict", nodeset=str(numa_node))
    os_ = ET.SubElement(domain, "os")
    ET.SubElement(os_, "type", arch="x86_64", machine="q35").text = "hvm"
    features = ET.SubElement(domain, "features")
    ET.SubElement(features, "acpi")
    ET.SubElement(domain, "cpu", mode="host-passthrough")
    parts = ET.SubElement(domain, "devices")
    disk = ET.SubElement(parts, "disk", type="file", device="disk")
    ET.SubElement(disk, "driver", name="qemu", type="qcow2")
    ET.SubElement(disk, "source", file=image)
    ET.SubElement(disk, "target", dev="vda", bus="virtio")
    for n, (pool, volume, read_only) in enumerate(volumes):
        extra = ET.SubElement(parts, "disk", type="volume", device="disk")
        ET.SubElement(extra, "driver", name="qemu", type="raw", cache="none")
        ET.SubElement(extra, "source", pool=pool, volume=volume)
        ET.SubElement(extra, "target", dev=f"vd{chr(ord('b') + n)}", bus="virtio")
        ET.SubElement(extra, "serial").text = volume[:20]
        if read_only:
            ET.SubElement(extra, "readonly")
    if config_drive:
        url = urlsplit(config_drive)
        cdrom = ET.SubElement(parts, "disk", type="network", device="cdrom")
        ET.SubElement(cdrom, "driver", name="qemu", type="raw")
        source = ET.SubElement(cdrom, "source", protocol=url.scheme, name=url.path)
        ET.SubElement(source, "host", name=url.hostname or "", port=str(url.port or (443 if url.scheme == "https"
                                                                                     else 80)))
        ET.SubElement(cdrom, "target", dev="sda", bus="sata")
        ET.SubElement(cdrom, "readonly")
    if network:
        nic = ET.SubElement(parts, "interface", type="network")
        ET.SubElement(nic, "source", network=network)
        if mac:
            ET.SubElement(nic, "mac", address=mac)
        ET.SubElement(nic, "model", type="virtio")
    # The serial console cloud-init prints to (its host keys among it), kept in a log on the host.
    serial = ET.SubElement(parts, "serial", type="pty")
    ET.SubElement(serial, "target", port="0")
    ET.SubElement(serial, "log", file=f"/var/log/libvirt/qemu/{name}-console.log", append="off")
    for bus_id in [device["pci_bus_id"] for device in devices] + list(ib_functions):
        hostdev = ET.SubElement(parts, "hostdev", mode="subsystem", type="pci", managed="yes")
        ET.SubElement(hostdev, "driver", name="vfio")
        source = ET.SubElement(hostdev, "source")
        ET.SubElement(source, "address", **pci_address(bus_id))
    return ET.tostring(domain, encoding="unicode")


class LibvirtVM(VMDriver):
    """``settings.MERIDIAN_LIBVIRT_URI`` names the host's hypervisor, e.g. ``qemu+ssh://root@{host}/system``."""

    def _open(self, target: Target):
        try:
            import libvirt
        except ImportError as exc:
            raise DriverError("libvirt-python is not installed on this worker (pip install -r "
                              "requirements-vm.txt).", transient=False) from exc
        libvirt.registerErrorHandler(lambda *_: None, None)  # errors come back as exceptions
        try:
            return libvirt, libvirt.open(settings.MERIDIAN_LIBVIRT_URI.format(host=target.hostname))
        except libvirt.libvirtError as exc:
            raise DriverError(f"Cannot reach the hypervisor of {target.hostname}: {exc}.") from exc

    def _on_domain(self, target, name, action, *, missing=None):
        libvirt, conn = self._open(target)
        try:
            try:
                domain = conn.lookupByName(name)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    return missing
                raise
            return action(libvirt, domain)
        except libvirt.libvirtError as exc:
            raise DriverError(f"libvirt on {target.hostname}: {exc}.") from exc
        finally:
            conn.close()

    def domain_state(self, target, name):
        def state(libvirt, domain):
            return "running" if domain.state()[0] == libvirt.VIR_DOMAIN_RUNNING else "defined"
        return self._on_domain(target, name, state, missing="absent")

    def define(self, target, name, xml):
        libvirt, conn = self._open(target)
        try:
            conn.defineXML(xml)
        except libvirt.libvirtError as exc:
            # A refused definition stays refused; only a lost connection is worth another try.
            transient = exc.get_error_code() in (libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_ERR_RPC,
                                                 libvirt.VIR_ERR_NO_CONNECT)
            raise DriverError(f"libvirt on {target.hostname} refused domain {name}: {exc}.",
                              transient=transient) from exc
        finally:
            conn.close()

    def start(self, target, name):
        if self._on_domain(target, name, lambda lv, d: d.create(), missing="absent") == "absent":
            raise DriverError(f"No domain {name} on {target.hostname}.", transient=False)

    def stop(self, target, name):
        self._on_domain(target, name, lambda lv, d: d.destroy() if d.isActive() else None)

    def undefine(self, target, name):
        self._on_domain(target, name, lambda lv, d: d.undefine())

    def _on_pool(self, target, pool, action):
        libvirt, conn = self._open(target)
        try:
            try:
                found = conn.storagePoolLookupByName(pool)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_POOL:
                    raise DriverError(f"{target.hostname} has no storage pool '{pool}': define it "
                                      "(MERIDIAN_LIBVIRT_POOL names it).", transient=False) from exc
                raise
            return action(libvirt, found)
        except libvirt.libvirtError as exc:
            raise DriverError(f"libvirt storage on {target.hostname}: {exc}.") from exc
        finally:
            conn.close()

    def volume(self, target, pool, name):
        def read(libvirt, found):
            volume = pool_volume(libvirt, found, name)
            return volume.path() if volume is not None else None
        return self._on_pool(target, pool, read)

    def create_volume(self, target, pool, name, *, base, size_gib):
        def create(libvirt, found):
            backing = pool_volume(libvirt, found, base)
            if backing is None:
                raise DriverError(f"The image volume '{base}' is not in pool '{pool}' on {target.hostname}: "
                                  "import the image onto the host first.", transient=False)
            return found.createXML(volume_xml(name=name, size_gib=size_gib, base_path=backing.path()), 0).path()
        return self._on_pool(target, pool, create)

    def delete_volume(self, target, pool, name):
        def delete(libvirt, found):
            volume = pool_volume(libvirt, found, name)
            if volume is not None:
                volume.delete(0)
        self._on_pool(target, pool, delete)


def pool_volume(libvirt, pool, name: str):
    """The volume ``name`` of a libvirt storage pool, or None when it has none by that name."""
    try:
        return pool.storageVolLookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL:
            return None
        raise


def volume_xml(*, name: str, size_gib: int, base_path: str) -> str:
    """A qcow2 volume whose reads fall through to ``base_path`` until written (copy-on-write)."""
    volume = ET.Element("volume", type="file")
    ET.SubElement(volume, "name").text = name
    ET.SubElement(volume, "capacity", unit="GiB").text = str(size_gib)
    target = ET.SubElement(volume, "target")
    ET.SubElement(target, "format", type="qcow2")
    backing = ET.SubElement(volume, "backingStore")
    ET.SubElement(backing, "path").text = base_path
    ET.SubElement(backing, "format", type="qcow2")
    return ET.tostring(volume, encoding="unicode")


def disk_volume(instance_name: str) -> str:
    return f"{instance_name}.qcow2"


def volume_names(instance_name: str, source: str) -> tuple[str, str]:
    """The instance's disk volume and the image's base volume in the pool (the source's file name)."""
    base = source.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0] or "image"
    return disk_volume(instance_name), base if base.endswith((".qcow2", ".img", ".raw")) else f"{base}.qcow2"
