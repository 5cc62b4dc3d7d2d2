"""API rate limits are per token and answer 429 with Retry-After in the one error format."""

import pytest
from rest_framework.settings import api_settings

from tests.world import issue_token


def test_429_with_retry_after_once_a_token_uses_its_rate(world, settings):
    """The fourth request in a minute at 3/min is refused, and says when to come back."""
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"principal": "3/min",
                                                                                     "anonymous": "3/min"}}
    assert api_settings.DEFAULT_THROTTLE_RATES["principal"] == "3/min"
    client = world.client("t1_member")
    for _ in range(3):
        assert client.get("/api/v1/me/").status_code == 200
    refused = client.get("/api/v1/me/")
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) > 0
    assert refused.json()["errors"][0]["code"] == "throttled"

    other_token = issue_token(world.users["t1_member"], world.t1.tenant)
    other = world.client("anon")
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_token}")
    assert other.get("/api/v1/me/").status_code == 200, "each token has its own bucket"


def test_the_previous_window_counts_by_the_share_of_it_still_within_a_period(world, settings):
    """10/min: a full minute of requests leaves half the rate for the first half of the next minute."""
    from unittest import mock

    from web.api.throttling import PrincipalRateThrottle

    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"principal": "10/min",
                                                                                     "anonymous": "10/min"}}
    client = world.client("t1_member")
    clock = [60_000.0 * 60]  # the start of a window

    with mock.patch.object(PrincipalRateThrottle, "timer", staticmethod(lambda: clock[0])):
        for _ in range(10):
            assert client.get("/api/v1/me/").status_code == 200
        refused = client.get("/api/v1/me/")
        assert refused.status_code == 429 and int(refused["Retry-After"]) == 60  # the next window
        clock[0] += 90  # halfway through the next window: the last one weighs 0.5 -> 5 in the period
        for _ in range(5):
            assert client.get("/api/v1/me/").status_code == 200
        refused = client.get("/api/v1/me/")
        assert refused.status_code == 429
        assert int(refused["Retry-After"]) == 1  # 5 + 10 * (1 - elapsed) < 10 just after halfway
        clock[0] += 6  # 10 % of the window later: 5 + 10 * 0.4 = 9 -> one more
        assert client.get("/api/v1/me/").status_code == 200
        assert client.get("/api/v1/me/").status_code == 429


def test_an_hourly_count_outlives_the_caches_default_expiry(world, settings, tmp_path):
    """On the embedded default's file cache (Django's own incr writes the counter again with a
    five-minute expiry), an idle spell inside an hourly window must not forget the window's requests."""
    from unittest import mock

    import time_machine

    from core.file_cache import AtomicFileCache
    from web.api.throttling import PrincipalRateThrottle

    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"principal": "3/hour",
                                                                                     "anonymous": "3/hour"}}
    files = AtomicFileCache(str(tmp_path / "cache"), {})
    assert files.default_timeout == 300
    client = world.client("t1_member")
    start = 3600.0 * 500_000  # the start of an hourly window
    with mock.patch.object(PrincipalRateThrottle, "cache", files):
        with time_machine.travel(start, tick=False):
            for _ in range(3):
                assert client.get("/api/v1/me/").status_code == 200
        with time_machine.travel(start + 600, tick=False):  # ten idle minutes, the same window
            assert client.get("/api/v1/me/").status_code == 429


def hammer(cache, *, threads: int, calls: int) -> int:
    """``threads`` threads making ``calls`` requests each on one token, in one window: how many were let through."""
    import threading
    from types import SimpleNamespace
    from unittest import mock

    from web.api.throttling import PrincipalRateThrottle

    request = SimpleNamespace(user=SimpleNamespace(is_authenticated=True, pk=1), auth=SimpleNamespace(pk=7))
    allowed, start = [], threading.Barrier(threads)

    def client():
        start.wait()
        allowed.append(sum(PrincipalRateThrottle().allow_request(request, None) for _ in range(calls)))

    with mock.patch.object(PrincipalRateThrottle, "cache", cache), \
            mock.patch.object(PrincipalRateThrottle, "timer", staticmethod(lambda: 60.0 * 1_000_000 + 1)):
        workers = [threading.Thread(target=client) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    return sum(allowed)


@pytest.fixture
def rate_120(settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"principal": "120/min",
                                                                                     "anonymous": "120/min"}}


def test_concurrent_requests_on_one_token_never_pass_the_rate_on_the_embedded_cache(rate_120, tmp_path):
    """Eight threads on one token against the embedded default's file cache: exactly the rate is let through."""
    from config import settings as project
    from core.file_cache import AtomicFileCache

    if not project.REDIS_URL:
        assert project.CACHES["default"]["BACKEND"] == "core.file_cache.AtomicFileCache"
    assert hammer(AtomicFileCache(str(tmp_path / "cache"), {}), threads=8, calls=60) == 120


def test_concurrent_requests_on_one_token_never_pass_the_rate_on_redis(rate_120):
    """The same against Redis, the production cache (127.0.0.1:6379)."""
    import uuid

    from django.core.cache.backends.redis import RedisCache

    redis = RedisCache("redis://127.0.0.1:6379/0", {"KEY_PREFIX": f"meridian-test-{uuid.uuid4().hex}"})
    assert hammer(redis, threads=8, calls=60) == 120
