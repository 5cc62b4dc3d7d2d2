"""Storage tests' fixtures: the default classes, and the emulated backends (Storage Scale's API, S3)."""

from __future__ import annotations

import pytest

from tests.storage.scale_server import ScaleServer
from tests.world import small_fleet


@pytest.fixture
def classes(world):
    """us-east-1's default storage classes, by kind (a small fleet made for the region)."""
    small_fleet(4)
    from cloud.models import Region
    from storage.catalogue import default_storage_classes

    return {c.kind: c for c in default_storage_classes(Region.objects.get(slug="us-east-1"))}


@pytest.fixture
def scale(settings, tmp_path):
    """A Storage Scale management API, its file system "mounted" at ``tmp_path``."""
    with ScaleServer(root=tmp_path) as server:
        settings.MERIDIAN_STORAGE_SCALE_URL = server.url
        settings.MERIDIAN_STORAGE_SCALE_USER, settings.MERIDIAN_STORAGE_SCALE_PASSWORD = server.credentials
        settings.MERIDIAN_STORAGE_SCALE_MOUNT = str(tmp_path)
        settings.MERIDIAN_STORAGE_SCALE_JOB_SECONDS = 5
        yield server


@pytest.fixture(scope="session")
def s3_endpoint():
    """A local S3 and IAM (moto in server mode) for the whole run."""
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(settings, s3_endpoint):
    settings.MERIDIAN_STORAGE_S3_ENDPOINT = s3_endpoint
    settings.MERIDIAN_STORAGE_S3_ACCESS_KEY, settings.MERIDIAN_STORAGE_S3_SECRET_KEY = "platform", "platform-secret"
    settings.MERIDIAN_STORAGE_CHUNK_BYTES = 8
    settings.MERIDIAN_STORAGE_S3_PLATFORM_CIDRS = "127.0.0.0/8"  # the workers here reach the emulator from it
    return s3_endpoint
