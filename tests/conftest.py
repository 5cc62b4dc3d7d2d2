"""
Fixtures. Settings are tests/settings.py (PostgreSQL by default); every API test runs in a
world of two tenants and the eight personas of the role matrix (tests/world.py).
"""

import pytest
from rest_framework.test import APIClient

from tests.world import World, build_world


@pytest.fixture(autouse=True)
def _clear_cache():
    from django.core.cache import cache

    cache.clear()
    yield


@pytest.fixture
def world(db) -> World:
    return build_world()


@pytest.fixture
def api() -> APIClient:
    return APIClient()
