"""
Block volumes as volumes of a libvirt storage pool on the storage hosts (an iSCSI, RBD, LVM or
directory pool that the GPU hosts reach): ``MERIDIAN_STORAGE_LIBVIRT_URI`` names the storage
host's libvirt (``qemu+ssh://root@storage-01/system``), ``MERIDIAN_STORAGE_LIBVIRT_POOL`` the pool.
Each volume is named by its backend reference, so every call is idempotent: a volume that exists
is made already, one that is gone is deleted already. The instance sees it by its virtio serial
(the reference's first 20 characters), as the VM's disk is defined with it.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from django.conf import settings

from provisioning.drivers.libvirt_vm import pool_volume
from storage.drivers.base import Export, StorageDriverError

GIB = 1024**3


class LibvirtPoolStorage:
    def create(self, *, ref: str, kind: str, size_gib: int, source: tuple[str, str] | None = None) -> None:
        if kind != "block":
            raise StorageDriverError(f"A libvirt storage pool serves block volumes, not {kind}: give the storage "
                                     "class another backend.", transient=False)

        def make(libvirt, pool):
            if pool_volume(libvirt, pool, ref) is not None:
                return
            if source is None:
                pool.createXML(volume_xml(ref, size_gib), 0)
                return
            taken = pool_volume(libvirt, pool, source[1])
            if taken is None:
                raise StorageDriverError(f"The pool has no snapshot {source[1]} to restore from.", transient=False)
            pool.createXMLFrom(volume_xml(ref, size_gib), taken, 0)
        self._on_pool(make)

    def snapshot(self, *, ref: str, snapshot: str) -> None:
        """A snapshot is a clone in the same pool (``snap-<id>``): the pool copies it, thin where it can."""
        def take(libvirt, pool):
            if pool_volume(libvirt, pool, snapshot) is not None:
                return
            volume = pool_volume(libvirt, pool, ref)
            if volume is None:
                raise StorageDriverError(f"The pool has no volume {ref} to snapshot.", transient=False)
            pool.createXMLFrom(volume_xml(snapshot, volume.info()[1] // GIB), volume, 0)
        self._on_pool(take)

    def snapshot_delete(self, *, ref: str, snapshot: str) -> None:
        self.delete(ref=snapshot)

    def resize(self, *, ref: str, size_gib: int) -> None:
        def grow(libvirt, pool):
            volume = pool_volume(libvirt, pool, ref)
            if volume is None:
                raise StorageDriverError(f"The pool has no volume {ref} to grow.", transient=False)
            if volume.info()[1] < size_gib * GIB:
                volume.resize(size_gib * GIB, 0)
        self._on_pool(grow)

    def delete(self, *, ref: str) -> None:
        def remove(libvirt, pool):
            volume = pool_volume(libvirt, pool, ref)
            if volume is None:
                return
            try:
                volume.wipe(0)  # where the pool can; the destroyed data key leaves the rest unreadable anyway
            except libvirt.libvirtError as exc:
                if exc.get_error_code() != libvirt.VIR_ERR_NO_SUPPORT:
                    raise
            volume.delete(0)
        self._on_pool(remove)

    def export(self, *, ref: str, clients: tuple[str, ...]) -> Export:
        def find(libvirt, pool):
            if pool_volume(libvirt, pool, ref) is None:
                raise StorageDriverError(f"The pool has no volume {ref} to export.", transient=False)
        self._on_pool(find)
        return Export(target=f"/dev/disk/by-id/virtio-{ref[:20]}")

    def refs(self) -> set[str]:
        return self._on_pool(lambda libvirt, pool: {name for name in pool.listVolumes() if name.startswith("vol-")})

    def exports(self, *, refs: set[str]) -> dict[str, tuple[str, ...]]:
        return {}  # block devices reach only the hosts of the pool, never a network of clients

    def _on_pool(self, action):
        try:
            import libvirt
        except ImportError as exc:
            raise StorageDriverError("libvirt-python is not installed on this worker (pip install -r "
                                     "requirements-vm.txt).", transient=False) from exc
        libvirt.registerErrorHandler(lambda *_: None, None)
        uri, name = settings.MERIDIAN_STORAGE_LIBVIRT_URI, settings.MERIDIAN_STORAGE_LIBVIRT_POOL
        try:
            conn = libvirt.open(uri)
        except libvirt.libvirtError as exc:
            raise StorageDriverError(f"Cannot reach the storage host's libvirt ({uri}): {exc}.") from exc
        try:
            try:
                pool = conn.storagePoolLookupByName(name)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_POOL:
                    raise StorageDriverError(f"The storage host has no pool '{name}': define it "
                                             "(MERIDIAN_STORAGE_LIBVIRT_POOL names it).", transient=False) from exc
                raise
            return action(libvirt, pool)
        except libvirt.libvirtError as exc:
            unsupported = exc.get_error_code() == libvirt.VIR_ERR_NO_SUPPORT
            raise StorageDriverError(f"libvirt storage ({name}): {exc}.", transient=not unsupported) from exc
        finally:
            conn.close()


def volume_xml(name: str, size_gib: int) -> str:
    """A raw volume of ``size_gib``, allocated as written (thin)."""
    volume = ET.Element("volume", type="file")
    ET.SubElement(volume, "name").text = name
    ET.SubElement(volume, "capacity", unit="GiB").text = str(size_gib)
    ET.SubElement(volume, "allocation", unit="GiB").text = "0"
    target = ET.SubElement(volume, "target")
    ET.SubElement(target, "format", type="raw")
    return ET.tostring(volume, encoding="unicode")
