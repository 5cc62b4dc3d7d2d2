"""
Block volumes in a libvirt storage pool, against libvirt's own test driver (test:///default and
its default-pool): made once however often asked, found, exported by serial, listed, deleted once;
a pool missing or a call the host's libvirt cannot do is an error for good that says what to do.
"""

import uuid

import pytest

from storage.drivers import StorageDriverError, driver_for
from storage.drivers.libvirt_pool import LibvirtPoolStorage


@pytest.fixture
def pool(settings):
    """test:///default, held open (its state lives only while some connection to it does)."""
    libvirt = pytest.importorskip("libvirt")
    settings.MERIDIAN_STORAGE_LIBVIRT_URI = "test:///default"
    settings.MERIDIAN_STORAGE_LIBVIRT_POOL = "default-pool"
    conn = libvirt.open("test:///default")
    yield conn.storagePoolLookupByName("default-pool")
    conn.close()


def ref() -> str:
    return f"vol-{uuid.uuid4()}"


def test_a_volume_is_made_once_found_exported_and_deleted_once(pool):
    driver, name = driver_for("libvirt"), ref()
    assert isinstance(driver, LibvirtPoolStorage)
    driver.create(ref=name, kind="block", size_gib=10)
    driver.create(ref=name, kind="block", size_gib=10)  # a retried step: already made
    assert pool.listVolumes().count(name) == 1
    assert pool.storageVolLookupByName(name).info()[1] == 10 * 1024**3
    assert name in driver.refs()
    assert driver.export(ref=name, clients=()).target == f"/dev/disk/by-id/virtio-{name[:20]}"
    driver.delete(ref=name)
    driver.delete(ref=name)  # already gone: done
    assert name not in pool.listVolumes()


def test_a_file_system_is_not_a_pool_volume(pool):
    with pytest.raises(StorageDriverError, match="serves block volumes, not shared_fs") as refused:
        driver_for("libvirt").create(ref=ref(), kind="shared_fs", size_gib=100)
    assert refused.value.transient is False


def test_a_grow_the_host_cannot_do_is_refused_for_good_and_a_volume_big_enough_is_left_alone(pool):
    driver, name = driver_for("libvirt"), ref()
    driver.create(ref=name, kind="block", size_gib=10)
    try:
        driver.resize(ref=name, size_gib=10)  # as large already: nothing asked of libvirt
        with pytest.raises(StorageDriverError) as refused:  # the test driver has no volume resize
            driver.resize(ref=name, size_gib=20)
        assert refused.value.transient is False and "not supported" in str(refused.value)
    finally:
        driver.delete(ref=name)


def test_a_missing_pool_says_which_setting_names_it(pool, settings):
    settings.MERIDIAN_STORAGE_LIBVIRT_POOL = "no-such-pool"
    with pytest.raises(StorageDriverError, match="MERIDIAN_STORAGE_LIBVIRT_POOL") as refused:
        driver_for("libvirt").refs()
    assert refused.value.transient is False


def test_an_unknown_backend_is_named():
    with pytest.raises(StorageDriverError, match="No storage driver 'ceph' is installed"):
        driver_for("ceph")


def test_a_domain_with_a_pool_volume_disk_is_accepted_by_libvirt(pool):
    import xml.etree.ElementTree as ET

    from provisioning.drivers.libvirt_vm import domain_xml

    driver, name = driver_for("libvirt"), ref()
    driver.create(ref=name, kind="block", size_gib=10)
    conn = pool.connect()
    vm = f"vm-{uuid.uuid4().hex[:12]}"
    domain = conn.defineXML(domain_xml(name=vm, vcpus=2, memory_mib=2048, devices=[], image="/default-pool/base.qcow2",
                                       volumes=(("default-pool", name, True),)))
    try:
        disk = ET.fromstring(domain.XMLDesc()).find("devices/disk[@type='volume']")  # noqa: S314 -- the test host's
        assert disk.find("source").attrib == {"pool": "default-pool", "volume": name}
        assert disk.find("serial").text == name[:20] and disk.find("readonly") is not None
    finally:
        domain.undefine()
        driver.delete(ref=name)
