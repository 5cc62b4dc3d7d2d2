"""
Object storage through the S3 API, against a local S3 and IAM (moto in server mode, started here):
a bucket made once, locked down (no public access, encrypted, lifecycle rules), with its own user
whose keys open that bucket and nothing else; limited to the tenant's networks; chunks written,
listed, read back and removed; deleted with everything in it.
"""

import json
import uuid

import boto3
import pytest
import requests
from botocore.exceptions import ClientError

from storage.drivers import StorageDriverError, driver_for
from storage.drivers.object_store import ObjectStore, bucket_name


def ref() -> str:
    return f"vol-{uuid.uuid4()}"


def client(endpoint, service="s3", key="platform", secret="platform-secret"):  # noqa: S107 -- the emulator's
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=key,
                        aws_secret_access_key=secret)


def test_a_bucket_is_made_once_locked_down_grown_and_deleted_with_what_it_holds(s3):
    driver, name = driver_for("s3"), ref()
    assert isinstance(driver, ObjectStore)
    driver.create(ref=name, kind="object", size_gib=500)
    driver.create(ref=name, kind="object", size_gib=500)  # a retried step: made already
    raw, bucket = client(s3), bucket_name(name)
    assert raw.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"]["BlockPublicAcls"]
    rules = raw.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rules[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    lifecycle = {rule["ID"] for rule in raw.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]}
    assert lifecycle == {"abort-incomplete-uploads", "archive"}
    policy = client(s3, "iam").get_user_policy(UserName=bucket, PolicyName="this-bucket-only")["PolicyDocument"]
    assert policy["Statement"][0]["Resource"] == [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]
    assert name in driver.refs()

    driver.resize(ref=name, size_gib=900)
    tags = {t["Key"]: t["Value"] for t in raw.get_bucket_tagging(Bucket=bucket)["TagSet"]}
    assert tags["meridian-size-gib"] == "900"

    raw.put_object(Bucket=bucket, Key="data/a.bin", Body=b"tenant data")
    driver.delete(ref=name)
    driver.delete(ref=name)  # gone already: done
    assert name not in driver.refs()
    with pytest.raises(ClientError):
        client(s3, "iam").get_user(UserName=bucket)


def test_the_bucket_policy_lets_in_only_the_tenants_networks(s3):
    driver, name = driver_for("s3"), ref()
    driver.create(ref=name, kind="object", size_gib=10)
    export = driver.export(ref=name, clients=("10.9.0.0/24", "10.8.0.0/24"))
    assert export.target == f"{s3}/{bucket_name(name)}" and export.clients == ("10.8.0.0/24", "10.9.0.0/24")
    policy = json.loads(client(s3).get_bucket_policy(Bucket=bucket_name(name))["Policy"])
    deny = policy["Statement"][0]
    assert deny["Effect"] == "Deny" and deny["Condition"]["NotIpAddress"]["aws:SourceIp"] == [
        "10.8.0.0/24", "10.9.0.0/24", "127.0.0.0/8"]
    assert driver.exports(refs={name})[name] == ("10.8.0.0/24", "10.9.0.0/24")
    driver.delete(ref=name)


def test_chunks_are_written_listed_read_back_cut_and_removed(s3):
    driver, name = driver_for("s3"), ref()
    driver.create(ref=name, kind="object", size_gib=10)
    data = b"0123456789abcdefXYZ"  # three chunks of 8 bytes: 8, 8, 3
    for index in range(3):
        driver.write_chunk(ref=name, key="ckpt/step-1/model.pt", index=index, chunk=8,
                           data=data[index * 8:(index + 1) * 8])
    driver.write_chunk(ref=name, key="ckpt/step-1/model.pt", index=1, chunk=8, data=data[8:16])  # again: same
    files = driver.files(ref=name, prefix="ckpt/")
    assert list(files) == ["ckpt/step-1/model.pt"] and files["ckpt/step-1/model.pt"].size == len(data)
    assert b"".join(driver.read_chunk(ref=name, key="ckpt/step-1/model.pt", index=i, chunk=8)
                    for i in range(3)) == data
    driver.truncate(ref=name, key="ckpt/step-1/model.pt", size=8)
    assert driver.files(ref=name, prefix="ckpt/")["ckpt/step-1/model.pt"].size == 8
    driver.remove(ref=name, key="ckpt/step-1/model.pt")
    assert driver.files(ref=name, prefix="ckpt/") == {}
    with pytest.raises(StorageDriverError, match="not a path inside"):
        driver.write_chunk(ref=name, key="../other/x", index=0, chunk=8, data=b"x")
    driver.delete(ref=name)


def test_a_volumes_keys_open_its_bucket_and_nothing_else(s3):
    """With the emulator enforcing IAM: the platform acts as an administrator, the tenant's keys as their user."""
    iam = client(s3, "iam")
    iam.create_user(UserName="platform-admin")
    iam.put_user_policy(UserName="platform-admin", PolicyName="all", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    admin = iam.create_access_key(UserName="platform-admin")["AccessKey"]
    requests.post(f"{s3}/moto-api/reset-auth", data=b"0", timeout=5)  # from here on every request is checked
    try:
        driver = ObjectStore.__new__(ObjectStore)
        driver.s3 = client(s3, key=admin["AccessKeyId"], secret=admin["SecretAccessKey"])
        driver.iam = client(s3, "iam", key=admin["AccessKeyId"], secret=admin["SecretAccessKey"])
        mine, theirs = ref(), ref()
        driver.create(ref=mine, kind="object", size_gib=10)
        driver.create(ref=theirs, kind="object", size_gib=10)
        keys = driver.credentials(ref=mine)
        assert keys["bucket"] == bucket_name(mine)
        tenant = client(s3, key=keys["access_key_id"], secret=keys["secret_access_key"])
        tenant.put_object(Bucket=bucket_name(mine), Key="a.txt", Body=b"mine")
        assert tenant.get_object(Bucket=bucket_name(mine), Key="a.txt")["Body"].read() == b"mine"
        with pytest.raises(ClientError, match="AccessDenied"):
            tenant.put_object(Bucket=bucket_name(theirs), Key="a.txt", Body=b"not mine")
        with pytest.raises(ClientError, match="AccessDenied"):
            tenant.list_buckets()

        newer = driver.credentials(ref=mine)  # rotated: two live at most, the oldest goes
        driver.credentials(ref=mine)
        live = {k["AccessKeyId"] for k in driver.iam.list_access_keys(UserName=bucket_name(mine))["AccessKeyMetadata"]}
        assert keys["access_key_id"] not in live and newer["access_key_id"] in live and len(live) == 2
        driver.delete(ref=mine)
        driver.delete(ref=theirs)
    finally:
        requests.post(f"{s3}/moto-api/reset-auth", data=b"inf", timeout=5)


def test_only_object_storage_and_an_unreachable_service_is_transient(s3, settings):
    with pytest.raises(StorageDriverError, match="not block") as wrong:
        driver_for("s3").create(ref=ref(), kind="block", size_gib=10)
    assert wrong.value.transient is False
    settings.MERIDIAN_STORAGE_S3_ENDPOINT = "http://127.0.0.1:9"
    with pytest.raises(StorageDriverError, match="did not answer") as down:
        driver_for("s3").refs()
    assert down.value.transient is True
