"""API rate limits are per token and answer 429 with Retry-After in the one error format."""

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
