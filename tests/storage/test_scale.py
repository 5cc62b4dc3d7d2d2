"""
Shared file systems on IBM Storage Scale, against a local server that speaks the documented
management API (tests/storage/scale_server.py): a fileset made once with its quota, grown, exported
to exactly the tenant's networks, listed, and removed with its export; jobs followed to the end; a
server that fails or refuses is an error that says so, transient or for good as it should be.
"""

import uuid

import pytest

from storage.drivers import StorageDriverError, driver_for
from storage.drivers.scale import StorageScale


def ref() -> str:
    return f"vol-{uuid.uuid4()}"


def test_a_fileset_is_made_once_with_its_quota_grown_and_removed_once(scale, tmp_path):
    driver, name = driver_for("scale"), ref()
    assert isinstance(driver, StorageScale)
    driver.create(ref=name, kind="shared_fs", size_gib=2048)
    driver.create(ref=name, kind="shared_fs", size_gib=2048)  # a retried step: made already
    fileset = scale.cluster.filesets[name]
    assert fileset["config"]["path"] == f"/gpfs/fs1/{name}" and scale.cluster.quotas[name] == "2048G"
    assert sum(1 for method, path, _ in scale.requests
               if method == "POST" and path.endswith("/filesets")) == 1
    assert (tmp_path / name).is_dir()  # linked: the mounted file system shows it
    assert name in driver.refs()

    driver.resize(ref=name, size_gib=4096)
    assert scale.cluster.quotas[name] == "4096G"

    driver.delete(ref=name)
    driver.delete(ref=name)  # gone already: done
    assert name not in scale.cluster.filesets and not (tmp_path / name).exists()
    assert name not in driver.refs()


def test_the_export_lets_in_exactly_the_tenants_networks_and_follows_them(scale):
    driver, name = driver_for("scale"), ref()
    driver.create(ref=name, kind="shared_fs", size_gib=100)
    export = driver.export(ref=name, clients=("10.8.0.0/24", "10.9.0.0/24"))
    assert export.target == f"ces.scale.internal:/gpfs/fs1/{name}"
    assert export.clients == ("10.8.0.0/24", "10.9.0.0/24")
    assert driver.exports(refs={name})[name] == ("10.8.0.0/24", "10.9.0.0/24")
    assert all("Squash=root_squash" in spec for spec in scale.cluster.exports[f"/gpfs/fs1/{name}"])

    driver.export(ref=name, clients=("10.9.0.0/24", "10.10.0.0/24"))  # a VPC deleted, one made
    assert driver.exports(refs={name})[name] == ("10.10.0.0/24", "10.9.0.0/24")
    writes = len(scale.requests)
    driver.export(ref=name, clients=("10.9.0.0/24", "10.10.0.0/24"))  # as it is: only read
    assert all(method == "GET" for method, _, _ in scale.requests[writes:])

    driver.delete(ref=name)  # the export goes with the fileset
    assert scale.cluster.exports == {}


def test_a_slow_job_is_followed_and_one_too_slow_is_asked_again(scale, settings):
    driver, name = driver_for("scale"), ref()
    scale.cluster.job_polls = 3
    driver.create(ref=name, kind="shared_fs", size_gib=10)
    assert name in scale.cluster.filesets

    scale.cluster.job_polls = 10_000
    with pytest.raises(StorageDriverError, match="still RUNNING") as slow:
        StorageScale(job_seconds=0.2).resize(ref=name, size_gib=20)
    assert slow.value.transient is True


def test_a_failed_job_is_an_error_for_good_with_the_servers_reason(scale):
    driver, name = driver_for("scale"), ref()
    scale.cluster.fail_job = "Disk quota exceeded for file system fs1."
    with pytest.raises(StorageDriverError, match="Disk quota exceeded") as failed:
        driver.create(ref=name, kind="shared_fs", size_gib=10)
    assert failed.value.transient is False


def test_a_server_error_is_transient_and_a_wrong_password_is_not(scale, settings):
    driver = driver_for("scale")
    scale.fail_next(1)
    with pytest.raises(StorageDriverError, match="503") as busy:
        driver.refs()
    assert busy.value.transient is True

    settings.MERIDIAN_STORAGE_SCALE_PASSWORD = "wrong"
    with pytest.raises(StorageDriverError, match="MERIDIAN_STORAGE_SCALE_USER") as refused:
        driver_for("scale").refs()
    assert refused.value.transient is False


def test_an_unreachable_server_is_transient(settings):
    settings.MERIDIAN_STORAGE_SCALE_URL = "http://127.0.0.1:9"
    with pytest.raises(StorageDriverError, match="did not answer") as down:
        driver_for("scale").refs()
    assert down.value.transient is True


def test_only_file_systems_and_only_existing_ones(scale):
    driver = driver_for("scale")
    with pytest.raises(StorageDriverError, match="not block"):
        driver.create(ref=ref(), kind="block", size_gib=10)
    with pytest.raises(StorageDriverError, match="no fileset"):
        driver.resize(ref=ref(), size_gib=10)
    with pytest.raises(StorageDriverError, match="no fileset"):
        driver.export(ref=ref(), clients=("10.0.0.0/24",))
