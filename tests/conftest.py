"""
Fixtures. Settings are tests/settings.py (PostgreSQL by default); every API test runs in a
world of two tenants and the eight personas of the role matrix (tests/world.py).
"""

import subprocess

import pytest
from rest_framework.test import APIClient

from tests.ci_required import pytest_runtest_makereport  # noqa: F401 -- the hook: CI runs browser and libvirt tests
from tests.security import nvidia_samples
from tests.world import World, build_world


@pytest.fixture(autouse=True)
def _clear_cache():
    from django.core.cache import cache

    from cloud.catalogue_cache import CATALOGUE
    from provisioning.admission import REGION_SIZES
    from provisioning.scheduling.free_hint import FREE_HINT
    from tenants.quotas import KEPT_LIMITS
    from tenants.token_cache import TOKENS

    cache.clear()
    FREE_HINT.clear()  # per process: a test starts with nothing remembered by another
    REGION_SIZES.clear()
    TOKENS.clear()
    CATALOGUE.clear()
    KEPT_LIMITS.clear()
    yield
    from provisioning.lifecycle.dispatch import START_SENDER

    START_SENDER.flush()  # a test's start messages leave before the next test stands in for the broker


@pytest.fixture(autouse=True)
def _no_published_audit_heads():
    """Each test's database starts with an empty audit chain; so must the heads published for it."""
    yield
    import shutil

    from django.conf import settings

    shutil.rmtree(settings.MERIDIAN_AUDIT_HEAD_DIR, ignore_errors=True)


@pytest.fixture
def world(db) -> World:
    return build_world()


@pytest.fixture
def api() -> APIClient:
    return APIClient()


@pytest.fixture
def steps(monkeypatch, settings):
    """
    The lifecycle's tasks, collected and run here in order (``steps.run()``) instead of by Celery,
    one step per task (tests of chained steps turn MERIDIAN_STEP_CHAIN_SECONDS back on).
    """
    from provisioning.lifecycle import dispatch as dispatching
    from tests.provisioning.pipeline import Steps

    settings.MERIDIAN_STEP_CHAIN_SECONDS = 0
    collected = Steps()
    monkeypatch.setattr(dispatching, "enqueue", collected.enqueue)
    monkeypatch.setattr(dispatching, "provision_when_due", collected.when_due)
    return collected


@pytest.fixture(scope="session")
def nvidia_samples_dir():
    """NVIDIA's genuine attestation samples (tests/security/nvidia_samples.py fetches the pinned wheel once)."""
    try:
        return nvidia_samples.fetch()
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        pytest.skip(f"NVIDIA's samples could not be fetched from the package index: {error}")
