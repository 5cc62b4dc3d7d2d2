"""
Snapshots (storage.services, storage.steps): taken by their step, restored into a new volume that
holds what the volume held then, counted against quotas, deleted; refused with a clear 4xx for a
bucket, a volume busy or gone, another tenant's snapshot, a restore smaller than it, a volume that
still has snapshots. On Storage Scale (fileset snapshots, restored byte for byte through the mounted
file system) and a libvirt pool (a clone volume) too.
"""

from __future__ import annotations

import uuid

import pytest

from storage.drivers import driver_for
from storage.drivers.simulated import SimulatedStorage
from storage.models import Volume, VolumeSnapshot
from storage.steps import snapshot_converge, volume_converge
from tenants.models import Quota
from tests.storage.test_volumes import made

pytestmark = pytest.mark.django_db
URL = "/api/v1/snapshots/"


def code(answer) -> str:
    return answer.json()["errors"][0]["code"]


def taken(world, volume, name="before-upgrade", persona="t1_member") -> VolumeSnapshot:
    answer = world.client(persona).post(URL, {"volume": str(volume.pk), "name": name}, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["state"] == "creating"
    assert snapshot_converge(answer.json()["id"]) == "done"
    return VolumeSnapshot.objects.get(pk=answer.json()["id"])


def test_a_snapshot_is_restored_into_a_new_volume_that_holds_what_the_volume_held(world, classes):
    fs = made(world, name="data", size_gib=500)
    driver = SimulatedStorage()
    driver.write_chunk(ref=fs.backend_ref, key="train/shard-0", index=0, chunk=1024, data=b"a" * 1000)
    snapshot = taken(world, fs)
    assert snapshot.state == "available" and snapshot.size_gib == 500
    driver.write_chunk(ref=fs.backend_ref, key="train/shard-1", index=0, chunk=1024, data=b"b" * 10)  # after it

    answer = world.client("t1_member").post("/api/v1/volumes/", {"name": "data-restored",
                                                                 "snapshot": str(snapshot.pk)}, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["storage_class"] == "us-east-1-shared-fs" and answer.json()["size_gib"] == 500
    assert volume_converge(answer.json()["id"]) == "done"
    restored = Volume.objects.get(pk=answer.json()["id"])
    assert set(driver.files(ref=restored.backend_ref, prefix="")) == {"train/shard-0"}

    delete = world.client("t1_member").delete(f"/api/v1/volumes/{fs.pk}/")
    assert delete.status_code == 409 and code(delete) == "volume_has_snapshots"
    assert world.client("t1_member").delete(f"{URL}{snapshot.pk}/").status_code == 202
    assert snapshot_converge(snapshot.pk) == "done"
    assert VolumeSnapshot.objects.get(pk=snapshot.pk).state == "deleted"
    assert snapshot.backend_ref not in driver.state(fs.backend_ref).get("snapshots", {})
    assert world.client("t1_member").delete(f"/api/v1/volumes/{fs.pk}/").status_code == 202


def test_bad_snapshot_requests_are_refused_and_change_nothing(world, classes):
    fs = made(world, name="data", size_gib=500)
    bucket = made(world, name="archive", storage_class="us-east-1-object", size_gib=100)
    client = world.client("t1_member")
    answer = client.post(URL, {"volume": str(bucket.pk), "name": "s"}, format="json")
    assert answer.status_code == 400 and code(answer) == "not_snapshottable"
    theirs = made(world, persona="t2_member", name="theirs", size_gib=500)
    assert client.post(URL, {"volume": str(theirs.pk), "name": "s"}, format="json").status_code == 400
    assert client.post(URL, {"volume": str(fs.pk), "name": "Bad Name"}, format="json").status_code == 400
    snapshot = taken(world, fs)
    again = client.post(URL, {"volume": str(fs.pk), "name": snapshot.name}, format="json")
    assert again.status_code == 409 and code(again) == "name_taken"
    small = client.post("/api/v1/volumes/", {"name": "small", "snapshot": str(snapshot.pk), "size_gib": 100},
                        format="json")
    assert small.status_code == 400 and code(small) == "size_out_of_range"
    other = client.post("/api/v1/volumes/", {"name": "x", "snapshot": str(snapshot.pk),
                                             "storage_class": "us-east-1-block"}, format="json")
    assert other.status_code == 400 and code(other) == "class_mismatch"
    assert world.client("t2_member").post("/api/v1/volumes/", {"name": "steal", "snapshot": str(snapshot.pk)},
                                          format="json").status_code == 400
    assert world.client("t2_member").get(f"{URL}{snapshot.pk}/").status_code == 404
    assert world.client("t1_viewer").post(URL, {"volume": str(fs.pk), "name": "v"}, format="json").status_code == 403
    assert Volume.objects.filter(name__in=["small", "x", "steal"]).count() == 0
    assert VolumeSnapshot.objects.count() == 1


def test_snapshots_count_against_the_storage_quota(world, classes):
    fs = made(world, name="data", size_gib=500)
    Quota.objects.create(tenant=world.t1.tenant, resource="shared_fs_gib", limit=1200)
    taken(world, fs, "one")
    over = world.client("t1_member").post(URL, {"volume": str(fs.pk), "name": "two"}, format="json")
    assert over.status_code == 409 and over.json()["errors"][0]["meta"]["in_use"] == 1000


def test_a_snapshot_step_that_fails_for_good_says_why(world, classes, settings):
    fs = made(world, name="data", size_gib=500)
    settings.MERIDIAN_SIMULATION = {**settings.MERIDIAN_SIMULATION, "broken_rate": {"storage_snapshot": 1.0}}
    answer = world.client("t1_member").post(URL, {"volume": str(fs.pk), "name": "s"}, format="json")
    assert snapshot_converge(answer.json()["id"]) == "failed"
    failed = VolumeSnapshot.objects.get(pk=answer.json()["id"])
    assert failed.state == "failed" and "Simulated storage fault" in failed.state_reason


def test_a_scale_fileset_snapshot_restores_byte_for_byte(scale, tmp_path):
    driver, ref, snap = driver_for("scale"), f"vol-{uuid.uuid4()}", f"snap-{uuid.uuid4()}"
    driver.create(ref=ref, kind="shared_fs", size_gib=10)
    (tmp_path / ref / "data").mkdir()
    (tmp_path / ref / "data" / "a.bin").write_bytes(b"before")
    driver.snapshot(ref=ref, snapshot=snap)
    driver.snapshot(ref=ref, snapshot=snap)  # taken already: done
    (tmp_path / ref / "data" / "a.bin").write_bytes(b"after")
    assert "data/a.bin" in driver.files(ref=ref, prefix="") and len(driver.files(ref=ref, prefix="")) == 1

    copy = f"vol-{uuid.uuid4()}"
    driver.create(ref=copy, kind="shared_fs", size_gib=10, source=(ref, snap))
    assert (tmp_path / copy / "data" / "a.bin").read_bytes() == b"before"
    driver.delete(ref=ref)  # its snapshot goes first: Scale deletes no fileset that has one
    assert ref not in scale.cluster.filesets


def test_a_libvirt_pool_volume_is_snapshotted_as_a_clone_and_restored_from_it(settings):
    libvirt = pytest.importorskip("libvirt")
    settings.MERIDIAN_STORAGE_LIBVIRT_URI, settings.MERIDIAN_STORAGE_LIBVIRT_POOL = "test:///default", "default-pool"
    conn = libvirt.open("test:///default")  # held open: the test driver's state lives while a connection does
    pool = conn.storagePoolLookupByName("default-pool")
    driver, snap = driver_for("libvirt"), f"snap-{uuid.uuid4()}"
    ref, copy = f"vol-{uuid.uuid4()}", f"vol-{uuid.uuid4()}"
    try:
        driver.create(ref=ref, kind="block", size_gib=10)
        driver.snapshot(ref=ref, snapshot=snap)
        driver.snapshot(ref=ref, snapshot=snap)
        driver.create(ref=copy, kind="block", size_gib=20, source=(ref, snap))
        assert {ref, snap, copy} <= set(pool.listVolumes())
        assert snap not in driver.refs()  # a snapshot is no volume for the orphan sweep
        driver.snapshot_delete(ref=ref, snapshot=snap)
        assert snap not in pool.listVolumes()
    finally:
        for name in (ref, copy):
            driver.delete(ref=name)
        conn.close()
