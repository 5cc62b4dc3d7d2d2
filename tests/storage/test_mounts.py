"""
Volumes reach the instances: a shared file system and a block volume attached to a bare-metal
reservation are in its config drive's cloud-config (mounted, the block one formatted once), a
container gets the file system as an NFS volume, each export limited to the tenant's own networks;
released, the reservation lets them go and the next one mounts the same data.
"""

from __future__ import annotations

import pytest
import yaml

from provisioning import cloud_init
from provisioning.drivers.pods import Limits, pod_spec
from provisioning.models import ConfigDrive, Instance
from provisioning.mounts import Mount, mounts_for
from storage.catalogue import default_storage_classes
from storage.drivers.simulated import SimulatedStorage
from storage.models import Volume
from storage.services import attachments_release_ended
from storage.steps import volume_converge
from tests.provisioning.pipeline import reservation, reserve_on_small_fleet
from tests.world import world_vpc

pytestmark = pytest.mark.django_db
URL = "/api/v1/volumes/"


def made(world, **body) -> Volume:
    from cloud.models import Region

    default_storage_classes(Region.objects.get(slug="us-east-1"))
    response = world.client("t1_member").post(URL, {"size_gib": 500, **body}, format="json")
    assert response.status_code == 201, response.content
    volume_converge(response.json()["id"])
    return Volume.objects.get(pk=response.json()["id"])


def attach(world, volume, reservation_id, **extra):
    answer = world.client("t1_member").post(f"{URL}{volume.pk}/attach/", {"reservation": reservation_id, **extra},
                                            format="json")
    assert answer.status_code == 200, answer.content


def test_bare_metal_mounts_both_and_the_data_outlives_the_reservation(world, steps):
    first = reserve_on_small_fleet(world, kind="bare_metal")
    vpc = world_vpc(world.t1.tenant)
    shared = made(world, name="datasets", storage_class="us-east-1-shared-fs")
    disk = made(world, name="scratch", storage_class="us-east-1-block", size_gib=100)
    attach(world, shared, first, read_only=True)
    attach(world, disk, first, mount_path="/data")
    steps.run()
    assert reservation(first).state == "active"
    instance = Instance.objects.get(reservation_id=first)
    vendor = yaml.safe_load(cloud_init.read_iso(bytes(ConfigDrive.objects.get(instance=instance).iso))["vendor-data"])
    assert vendor["mounts"] == [
        [f"/dev/disk/by-id/virtio-{disk.backend_ref[:20]}", "/data", "auto", "rw,nofail,x-systemd.device-timeout=30",
         "0", "2"],
        [f"sim-fs:/{shared.backend_ref}", "/mnt/datasets", "nfs", "ro,nofail,_netdev,hard", "0", "0"],
    ]
    assert vendor["fs_setup"] == [{"label": "scratch", "filesystem": "ext4", "device": vendor["mounts"][0][0],
                                   "partition": "none", "overwrite": False}]
    # The file system is exported to the tenant's own networks only.
    assert SimulatedStorage.state(shared.backend_ref)["clients"] == [vpc.cidr]

    assert world.client("t1_member").post(f"/api/v1/reservations/{first}/release/").status_code == 200
    steps.run()
    assert attachments_release_ended() == 2
    second = world.client("t1_member").post("/api/v1/reservations/", {
        "name": "next", "offering": reservation(first).offering.slug, "nodes": 1, "regions": ["us-east-1"],
        "duration_hours": 1}, format="json").json()["id"]
    attach(world, shared, second)
    attach(world, disk, second)  # the block volume is free again
    assert {m.volume for m in mounts_for(reservation(second))} == {"datasets", "scratch"}
    assert SimulatedStorage.state(disk.backend_ref)["size_gib"] == 100  # the same data, not a new volume
    assert SimulatedStorage.calls(disk.backend_ref)["storage_create"] == 1


def test_a_container_gets_its_file_system_as_an_nfs_volume_and_no_block_device(world):
    mounts = [Mount(volume="datasets", kind="shared_fs", source="fs01:/gpfs/vol-1", path="/datasets", read_only=True),
              Mount(volume="scratch", kind="block", source="/dev/disk/by-id/x", path="/data", read_only=False)]
    pod = pod_spec(name="pod-1", tenant_id="t1", node_name="n", image="img:1", devices=[{"gpu_id": "g"}],
                   limits=Limits(gpus=1, cpu_millicores=1000, memory_mib=1024), authorized_keys="k",
                   environment={}, labels={}, mounts=mounts).pod
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["vol-0"]["nfs"] == {"server": "fs01", "path": "/gpfs/vol-1", "readOnly": True}
    assert {"name": "vol-0", "mountPath": "/datasets", "readOnly": True} in pod["spec"]["containers"][0]["volumeMounts"]
    assert len(volumes) == 2  # the access secret and the file system: a block device is not a container's


def test_a_block_volume_is_refused_for_a_container_reservation(world):
    pk = reserve_on_small_fleet(world, kind="container")
    disk = made(world, name="scratch", storage_class="us-east-1-block", size_gib=100)
    answer = world.client("t1_member").post(f"{URL}{disk.pk}/attach/", {"reservation": pk}, format="json")
    assert answer.status_code == 400 and answer.json()["errors"][0]["code"] == "not_attachable"


def test_a_vm_gets_its_block_volume_as_a_disk_with_the_serial_cloud_init_mounts(world, steps, settings):
    import xml.etree.ElementTree as ET

    from provisioning.models import SimulatedDevice

    pk = reserve_on_small_fleet(world, kind="vm")
    disk = made(world, name="scratch", storage_class="us-east-1-block", size_gib=100)
    attach(world, disk, pk, mount_path="/data")
    steps.run()
    assert reservation(pk).state == "active"
    instance = Instance.objects.get(reservation_id=pk)
    xml = SimulatedDevice.objects.get(key=f"hypervisor:{instance.node.hostname}").state["domains"][instance.name]["xml"]
    [extra] = ET.fromstring(xml).findall("devices/disk[@type='volume']")  # noqa: S314 -- our own XML
    assert extra.find("source").attrib == {"pool": settings.MERIDIAN_STORAGE_LIBVIRT_POOL, "volume": disk.backend_ref}
    assert extra.find("target").attrib == {"dev": "vdb", "bus": "virtio"}
    serial = extra.find("serial").text
    vendor = yaml.safe_load(cloud_init.read_iso(bytes(ConfigDrive.objects.get(instance=instance).iso))["vendor-data"])
    assert vendor["mounts"][0][:2] == [f"/dev/disk/by-id/virtio-{serial}", "/data"]


def test_a_step_asks_the_backend_for_the_mounts_once_for_all_its_instances(world, steps):
    pk = reserve_on_small_fleet(world, kind="bare_metal", nodes=2)
    shared = made(world, name="datasets", storage_class="us-east-1-shared-fs")
    attach(world, shared, pk)
    steps.run()
    assert reservation(pk).state == "active" and Instance.objects.filter(reservation_id=pk).count() == 2
    assert SimulatedStorage.calls(shared.backend_ref)["storage_export"] == 1  # one step made both drives


def test_the_isolation_report_checks_who_each_export_lets_in_without_naming_others(world):
    from provisioning.models import SimulatedDevice

    vpc = world_vpc(world.t1.tenant)
    shared = made(world, name="datasets", storage_class="us-east-1-shared-fs")
    made(world, name="archive", storage_class="us-east-1-object", size_gib=100)
    theirs = Volume.objects.create(tenant=world.t2.tenant, name="theirs", storage_class=shared.storage_class,
                                   size_gib=100, target_gib=100, state="available")
    SimulatedStorage().create(ref=theirs.backend_ref, kind="shared_fs", size_gib=100)
    report = world.client("t1_viewer").get(f"/api/v1/vpcs/{vpc.pk}/isolation-report/").json()
    rows = {row["name"]: row for row in report["storage_exports"]}
    assert set(rows) == {"datasets", "archive"}  # never another tenant's
    assert rows["archive"]["tenant_networks"] == 1 and rows["archive"]["ok"] is True  # limited when made
    assert rows["datasets"]["foreign_clients"] == 0 and rows["datasets"]["ok"] is True  # not exported yet

    key = f"storage:{shared.backend_ref}"  # someone widened the export on the backend by hand
    device = SimulatedDevice.objects.get(key=key)
    SimulatedDevice.objects.filter(key=key).update(state={**device.state, "clients": ["10.20.0.0/24", "10.99.0.0/24"]})
    report = world.client("t1_viewer").get(f"/api/v1/vpcs/{vpc.pk}/isolation-report/").json()
    datasets = next(row for row in report["storage_exports"] if row["name"] == "datasets")
    assert (datasets["tenant_networks"], datasets["foreign_clients"], datasets["ok"]) == (1, 1, False)
    assert "10.99.0.0" not in str(report)  # counted, not named
