import pytest

from tests.inference.helpers import haproxy_binary


@pytest.fixture
def haproxy() -> str:
    """HAProxy's binary, for its own check of the balancer's configuration (scripts/ensure-haproxy installs it)."""
    found = haproxy_binary()
    if found is None:
        pytest.skip("HAProxy is not installed (scripts/ensure-haproxy)")
    return found
