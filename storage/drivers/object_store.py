"""
Object storage volumes through the S3 API (``boto3``): any S3 service the operator runs -- AWS
itself, Ceph RGW, MinIO or an appliance -- at ``MERIDIAN_STORAGE_S3_ENDPOINT`` with the platform's
own credentials. Each volume is a bucket (``<prefix><ref>``) with:

- all public access blocked and default encryption on (SSE-S3);
- lifecycle rules: incomplete multipart uploads aborted after a day, and objects moved to the
  archive storage class after ``MERIDIAN_STORAGE_S3_ARCHIVE_DAYS``;
- its own IAM user (``<prefix><ref>``) whose only policy reaches that bucket and its objects, so the
  access keys the tenant is given (``credentials``) open nothing else;
- a bucket policy that denies every request from outside the tenant's networks (``export``) and
  the platform's own (``MERIDIAN_STORAGE_S3_PLATFORM_CIDRS``: the workers that move checkpoints).

A bucket has no size of its own: its size is what the tenant pays for and its quota counts, kept
as the bucket's ``meridian-size-gib`` tag. Checkpoint data is kept as one object per chunk
(``<key>.chunks/<index>``), so a move cut short writes again only the chunks it had not finished.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings

from storage.data import FileInfo, checked_key
from storage.drivers.base import Export, StorageDriverError

GONE = {"NoSuchBucket", "NoSuchEntity", "NoSuchKey", "404"}
TRANSIENT = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling", "503", "500"}
CHUNKS = ".chunks/"


def bucket_name(ref: str) -> str:
    return f"{settings.MERIDIAN_STORAGE_S3_PREFIX}{ref}".lower()


class ObjectStore:
    """An S3 service; every method is safe to repeat."""

    def __init__(self):
        options = {"endpoint_url": settings.MERIDIAN_STORAGE_S3_ENDPOINT or None,
                   "region_name": settings.MERIDIAN_STORAGE_S3_REGION,
                   "aws_access_key_id": settings.MERIDIAN_STORAGE_S3_ACCESS_KEY or None,
                   "aws_secret_access_key": settings.MERIDIAN_STORAGE_S3_SECRET_KEY or None,
                   "config": Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5,
                                    read_timeout=30)}
        self.s3 = boto3.client("s3", **options)
        self.iam = boto3.client("iam", **options)

    # -- the interface ---------------------------------------------------------------------------

    def create(self, *, ref: str, kind: str, size_gib: int, source: tuple[str, str] | None = None) -> None:
        if source is not None:
            raise StorageDriverError("Buckets have no snapshots to restore from.", transient=False)
        if kind != "object":
            raise StorageDriverError(f"An S3 service serves object storage, not {kind}: give the storage class "
                                     "another backend.", transient=False)
        bucket = bucket_name(ref)
        with errors(f"create bucket {bucket}"):
            try:
                region = settings.MERIDIAN_STORAGE_S3_REGION
                self.s3.create_bucket(Bucket=bucket, **({} if region == "us-east-1" else {
                    "CreateBucketConfiguration": {"LocationConstraint": region}}))
            except ClientError as exc:
                if code(exc) != "BucketAlreadyOwnedByYou":
                    raise
            self.s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration={
                "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True,
                "RestrictPublicBuckets": True})
            self.s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={
                "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]})
            self.s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration=lifecycle())
            self._tag(bucket, size_gib)
        self._user(ref)

    def snapshot(self, *, ref: str, snapshot: str) -> None:
        raise StorageDriverError("Buckets have no snapshots: keep versions or copies of the objects instead.",
                                 transient=False)

    def snapshot_delete(self, *, ref: str, snapshot: str) -> None:
        return None  # none was ever taken

    def resize(self, *, ref: str, size_gib: int) -> None:
        with errors(f"grow bucket {bucket_name(ref)}"):
            self._tag(bucket_name(ref), size_gib)

    def delete(self, *, ref: str) -> None:
        bucket = bucket_name(ref)
        with errors(f"delete bucket {bucket}"):
            try:
                self._empty(bucket)
                self.s3.delete_bucket(Bucket=bucket)
            except ClientError as exc:
                if code(exc) not in GONE:
                    raise
            self._user_delete(bucket)

    def export(self, *, ref: str, clients: tuple[str, ...]) -> Export:
        bucket = bucket_name(ref)
        policy = {"Version": "2012-10-17", "Statement": [{
            "Sid": "OnlyFromTheTenantsNetworks", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
            "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
            "Condition": {"NotIpAddress": {"aws:SourceIp": sorted({*clients, *platform_networks()})
                                           or ["0.0.0.0/32"]}}}]}
        with errors(f"limit bucket {bucket} to the tenant's networks"):
            self.s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))
        endpoint = settings.MERIDIAN_STORAGE_S3_ENDPOINT or "https://s3.amazonaws.com"
        return Export(target=f"{endpoint.rstrip('/')}/{bucket}", clients=tuple(sorted(clients)))

    def refs(self) -> set[str]:
        prefix = settings.MERIDIAN_STORAGE_S3_PREFIX.lower()
        with errors("list buckets"):
            names = [b["Name"] for b in self.s3.list_buckets().get("Buckets", [])]
        return {name[len(prefix):] for name in names if name.startswith(prefix + "vol-")}

    def exports(self, *, refs: set[str]) -> dict[str, tuple[str, ...]]:
        """The networks each of these buckets' policy lets in (one tenant's, for its isolation report)."""
        found = {}
        for ref in sorted(refs):
            with errors(f"read the policy of {bucket_name(ref)}"):
                try:
                    policy = json.loads(self.s3.get_bucket_policy(Bucket=bucket_name(ref))["Policy"])
                except ClientError as exc:
                    if code(exc) not in ("NoSuchBucketPolicy", *GONE):
                        raise
                    found[ref] = ("*",)  # no policy: reachable from anywhere the keys are
                    continue
            allowed = [s["Condition"]["NotIpAddress"]["aws:SourceIp"] for s in policy.get("Statement", [])
                       if s.get("Effect") == "Deny" and "NotIpAddress" in s.get("Condition", {})]
            found[ref] = tuple(sorted(set(allowed[0]) - set(platform_networks()))) if allowed else ("*",)
        return found

    def credentials(self, *, ref: str) -> dict:
        """New access keys for the volume's own user (at most two live: the older goes); shown once."""
        user = bucket_name(ref)
        with errors(f"issue keys for {user}"):
            keys = sorted(self.iam.list_access_keys(UserName=user)["AccessKeyMetadata"], key=lambda k: k["CreateDate"])
            for old in keys[:max(0, len(keys) - 1)]:
                self.iam.delete_access_key(UserName=user, AccessKeyId=old["AccessKeyId"])
            key = self.iam.create_access_key(UserName=user)["AccessKey"]
        return {"access_key_id": key["AccessKeyId"], "secret_access_key": key["SecretAccessKey"],
                "bucket": user, "endpoint": settings.MERIDIAN_STORAGE_S3_ENDPOINT or "https://s3.amazonaws.com"}

    # -- files (checkpoint chunks) ---------------------------------------------------------------

    def files(self, *, ref: str, prefix: str) -> dict[str, FileInfo]:
        found: dict[str, FileInfo] = {}
        with errors(f"list {prefix} of {bucket_name(ref)}"):
            pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket_name(ref), Prefix=prefix)
            for page in pages:
                for item in page.get("Contents", []):
                    key = item["Key"].rsplit(CHUNKS, 1)[0]
                    seen = found.get(key)
                    found[key] = FileInfo(size=(seen.size if seen else 0) + item["Size"],
                                          modified=max(item["LastModified"], seen.modified) if seen
                                          else item["LastModified"])
        return found

    def read_chunk(self, *, ref: str, key: str, index: int, chunk: int) -> bytes:
        with errors(f"read {key} of {bucket_name(ref)}"):
            answer = self.s3.get_object(Bucket=bucket_name(ref), Key=chunk_key(key, index))
            return answer["Body"].read()

    def write_chunk(self, *, ref: str, key: str, index: int, chunk: int, data: bytes) -> None:
        with errors(f"write {key} of {bucket_name(ref)}"):
            self.s3.put_object(Bucket=bucket_name(ref), Key=chunk_key(key, index), Body=data)

    def truncate(self, *, ref: str, key: str, size: int) -> None:
        """Chunks past ``size`` go (a file written again shorter keeps no tail)."""
        with errors(f"size {key} of {bucket_name(ref)}"):
            listed = self.s3.list_objects_v2(Bucket=bucket_name(ref), Prefix=checked_key(key) + CHUNKS)
            chunk = settings.MERIDIAN_STORAGE_CHUNK_BYTES
            extra = [{"Key": o["Key"]} for o in listed.get("Contents", [])
                     if int(o["Key"].rsplit("/", 1)[1]) * chunk >= max(size, 1)]
            if extra:
                self.s3.delete_objects(Bucket=bucket_name(ref), Delete={"Objects": extra, "Quiet": True})

    def remove(self, *, ref: str, key: str) -> None:
        with errors(f"remove {key} of {bucket_name(ref)}"):
            self._empty(bucket_name(ref), prefix=checked_key(key) + CHUNKS)

    # -- helpers ---------------------------------------------------------------------------------

    def _tag(self, bucket: str, size_gib: int) -> None:
        self.s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [
            {"Key": "meridian-volume", "Value": bucket}, {"Key": "meridian-size-gib", "Value": str(size_gib)}]})

    def _user(self, ref: str) -> None:
        user, bucket = bucket_name(ref), bucket_name(ref)
        with errors(f"make the user of {bucket}"):
            try:
                self.iam.create_user(UserName=user, Tags=[{"Key": "meridian-volume", "Value": bucket}])
            except ClientError as exc:
                if code(exc) != "EntityAlreadyExists":
                    raise
            self.iam.put_user_policy(UserName=user, PolicyName="this-bucket-only", PolicyDocument=json.dumps({
                "Version": "2012-10-17", "Statement": [{
                    "Effect": "Allow", "Action": "s3:*",
                    "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]}))

    def _user_delete(self, user: str) -> None:
        try:
            for key in self.iam.list_access_keys(UserName=user)["AccessKeyMetadata"]:
                self.iam.delete_access_key(UserName=user, AccessKeyId=key["AccessKeyId"])
            for name in self.iam.list_user_policies(UserName=user)["PolicyNames"]:
                self.iam.delete_user_policy(UserName=user, PolicyName=name)
            self.iam.delete_user(UserName=user)
        except ClientError as exc:
            if code(exc) not in GONE:
                raise

    def _empty(self, bucket: str, prefix: str = "") -> None:
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            objects = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if objects:
                self.s3.delete_objects(Bucket=bucket, Delete={"Objects": objects, "Quiet": True})
        for page in self.s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
            for upload in page.get("Uploads", []):
                self.s3.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])


def platform_networks() -> list[str]:
    """Where the platform's own workers reach the store from (checkpoint moves): let in beside the tenant's."""
    return [cidr.strip() for cidr in settings.MERIDIAN_STORAGE_S3_PLATFORM_CIDRS.split(",") if cidr.strip()]


def lifecycle() -> dict:
    return {"Rules": [
        {"ID": "abort-incomplete-uploads", "Status": "Enabled", "Filter": {"Prefix": ""},
         "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}},
        {"ID": "archive", "Status": "Enabled", "Filter": {"Prefix": ""},
         "Transitions": [{"Days": settings.MERIDIAN_STORAGE_S3_ARCHIVE_DAYS,
                          "StorageClass": settings.MERIDIAN_STORAGE_S3_ARCHIVE_CLASS}]},
    ]}


def chunk_key(key: str, index: int) -> str:
    return f"{checked_key(key)}{CHUNKS}{index:08d}"


def code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


@contextmanager
def errors(what: str):
    """Turn the S3 client's errors into StorageDriverError: transient when worth asking again."""
    try:
        yield
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        transient = code(exc) in TRANSIENT or status >= 500
        message = exc.response.get("Error", {}).get("Message", "") or code(exc)
        raise StorageDriverError(f"The object store refused to {what}: {message} ({code(exc)}).",
                                 transient=transient) from exc
    except BotoCoreError as exc:
        raise StorageDriverError(f"The object store did not answer ({what}): {exc}", transient=True) from exc
