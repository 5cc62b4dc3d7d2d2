"""
Checkpoint tiers end to end on emulated backends: a shared file system on Storage Scale (the fake
management API, with the file system "mounted" in a directory) and its cold tier an S3 bucket
(moto in server mode). Real bytes move: demoted, they are in the bucket as chunks and gone from
the fileset; restored, they are back byte for byte. The volumes' own lifecycle runs on the same
backends (made, exported to the tenant's networks, deleted with nothing left behind).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from datetime import timedelta

import boto3
import pytest
from django.utils import timezone

from cloud.models import Region
from storage.checkpoints import tier_pass
from storage.drivers import driver_for
from storage.drivers.object_store import bucket_name
from storage.models import Checkpoint, StorageClass, Volume
from storage.steps import orphans_remove, volume_converge
from tests.storage.test_checkpoints import run_moves
from tests.world import small_fleet, world_vpc

pytestmark = pytest.mark.django_db
CHUNK = 64 * 1024


@pytest.fixture
def emulated(world, scale, s3, settings, tmp_path):
    small_fleet(4)
    settings.MERIDIAN_STORAGE_CHUNK_BYTES = CHUNK
    region = Region.objects.get(slug="us-east-1")
    StorageClass.objects.create(slug="gpfs", name="GPFS", kind="shared_fs", region=region, backend="scale",
                                price_per_gib_month="0.20", min_gib=10)
    StorageClass.objects.create(slug="s3", name="Object", kind="object", region=region, backend="s3",
                                price_per_gib_month="0.02", min_gib=1)
    world_vpc(world.t1.tenant)
    return tmp_path


def made(world, name: str, storage_class: str) -> Volume:
    answer = world.client("t1_member").post("/api/v1/volumes/", {
        "name": name, "storage_class": storage_class, "size_gib": 100}, format="json")
    assert answer.status_code == 201, answer.content
    assert volume_converge(answer.json()["id"]) == "done"
    return Volume.objects.get(pk=answer.json()["id"])


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_checkpoints_move_between_a_scale_fileset_and_an_s3_bucket_byte_for_byte(world, emulated, scale, s3):
    fs, cold = made(world, "ckpt", "gpfs"), made(world, "archive", "s3")
    assert fs.backend_ref in scale.cluster.filesets and scale.cluster.quotas[fs.backend_ref] == "100G"
    # The tenant's VPC only, from the moment it is made.
    assert driver_for("s3").exports(refs={cold.backend_ref})[cold.backend_ref] == ("10.20.0.0/24",)
    raw = boto3.client("s3", endpoint_url=s3, region_name="us-east-1", aws_access_key_id="platform",
                       aws_secret_access_key="platform-secret")  # noqa: S106 -- the emulator's
    # moto evaluates no aws:SourceIp condition (a Deny that has one denies every object request), so
    # the policy, checked above, is lifted for the moves; AWS, RGW and MinIO evaluate it.
    raw.delete_bucket_policy(Bucket=bucket_name(cold.backend_ref))
    answer = world.client("t1_member").put(f"/api/v1/volumes/{fs.pk}/checkpoint-policy/", {
        "cold_volume": str(cold.pk), "demote_after_hours": 1, "keep_hot": 1}, format="json")
    assert answer.status_code == 200, answer.content

    root = emulated / fs.backend_ref / "checkpoints"
    for step, size in (("step-1", 200_000), ("step-2", 150_000)):  # 4 and 3 chunks of 64 KiB
        (root / step).mkdir(parents=True)
        (root / step / "model.pt").write_bytes(os.urandom(size))
        (root / step / "meta.json").write_bytes(b'{"step": 1}')
    old = root / "step-1" / "model.pt"
    os.utime(old, (old.stat().st_atime - 10, old.stat().st_mtime - 10))  # written before step-2
    before = digest(old)

    assert tier_pass(now=timezone.now() + timedelta(hours=2))["demoting"] == 1
    outcomes = run_moves(slice_s=0)  # a chunk per run
    assert outcomes.count("continues") >= 4 and outcomes[-1] == "done"
    checkpoint = Checkpoint.objects.get(volume=fs, name="step-1")
    assert checkpoint.state == "cold" and checkpoint.moved_bytes == 200_000 + 11
    assert not (root / "step-1").exists() and (root / "step-2" / "model.pt").exists()
    keys = sorted(o["Key"] for o in raw.list_objects_v2(Bucket=bucket_name(cold.backend_ref))["Contents"])
    assert keys[0] == f"{fs.backend_ref}/checkpoints/step-1/meta.json.chunks/00000000" and len(keys) == 5

    answer = world.client("t1_member").post(f"/api/v1/checkpoints/{checkpoint.pk}/restore/", {}, format="json")
    assert answer.status_code == 202
    run_moves(slice_s=60)
    assert digest(root / "step-1" / "model.pt") == before  # back byte for byte
    assert (root / "step-1" / "meta.json").read_bytes() == b'{"step": 1}'
    assert raw.list_objects_v2(Bucket=bucket_name(cold.backend_ref)).get("KeyCount", 0) == 0

    for volume in (fs, cold):
        world.client("t1_member").delete(f"/api/v1/volumes/{volume.pk}/")
        assert volume_converge(volume.pk) == "done"
    assert scale.cluster.filesets == {} and scale.cluster.exports == {}
    assert cold.backend_ref not in driver_for("s3").refs()
    assert orphans_remove() == 0


def test_what_a_lost_create_left_on_scale_and_s3_is_found_and_removed(world, emulated, scale, s3):
    """A fileset and a bucket made by steps whose commit was lost (no volume owns them) go; owned ones stay."""
    kept = made(world, "kept", "gpfs")
    lost_fs, lost_bucket = f"vol-{uuid.uuid4()}", f"vol-{uuid.uuid4()}"
    driver_for("scale").create(ref=lost_fs, kind="shared_fs", size_gib=10)
    driver_for("s3").create(ref=lost_bucket, kind="object", size_gib=10)
    assert orphans_remove() == 2
    assert set(scale.cluster.filesets) == {kept.backend_ref}
    assert lost_bucket not in driver_for("s3").refs()
