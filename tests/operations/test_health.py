"""/health/live and /health/ready: what orchestrators probe, and what staff read of the control plane."""

import base64

import pytest
from django.test import Client, override_settings

from operations import control_plane

pytestmark = pytest.mark.django_db

LOOPS = {"scheduler_leader", "scheduler_last_cycle_age_s", "beat_last_run_age_s", "workers", "queue_depths"}


def test_live_answers_without_asking_the_database(django_assert_num_queries):
    with django_assert_num_queries(0):
        response = Client().get("/health/live")
    assert response.status_code == 200 and response.json() == {"status": "alive"}
    assert "no-cache" in response["Cache-Control"]


def test_ready_checks_database_cache_broker_and_migrations_and_tells_anyone_only_the_verdict():
    response = Client().get("/health/ready")
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ready"
    assert set(body["checks"]) == {"database", "cache", "broker", "migrations"}
    assert all(check["ok"] for check in body["checks"].values())
    assert not LOOPS & set(body)  # the control plane's internals are for staff


def test_a_broker_down_makes_the_process_not_ready_and_says_which(monkeypatch):
    def unreachable():
        raise ConnectionRefusedError("[Errno 111] Connection refused")

    monkeypatch.setattr(control_plane, "_broker", unreachable)
    response = Client().get("/health/ready")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["broker"]["ok"] is False and "Connection refused" in checks["broker"]["error"]
    assert checks["database"]["ok"] and checks["cache"]["ok"]


def test_migrations_not_applied_make_it_not_ready_and_say_what_to_run(monkeypatch):
    monkeypatch.setattr(control_plane, "_migrations_applied", False)
    monkeypatch.setattr(control_plane.MigrationExecutor, "migration_plan", lambda self, targets: [("app", "0099")])
    response = Client().get("/health/ready")
    assert response.status_code == 503
    assert "manage.py migrate" in response.json()["checks"]["migrations"]["error"]


def test_the_verdict_of_migrations_is_remembered_once_they_are_applied(monkeypatch):
    control_plane.pending_migrations()
    monkeypatch.setattr(control_plane.MigrationExecutor, "__init__", lambda *a, **k: pytest.fail("asked again"))
    assert control_plane.pending_migrations() == 0


def test_staff_also_read_the_loops(world):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {world.tokens['platform_admin']}")
    body = client.get("/health/ready").json()
    assert set(body) >= LOOPS
    assert body["migrations_pending"] == 0


def test_a_tenant_token_reads_only_the_verdict(world):
    body = Client(HTTP_AUTHORIZATION=f"Bearer {world.tokens['t1_owner']}").get("/health/ready").json()
    assert not LOOPS & set(body)


@override_settings(MERIDIAN_METRICS_USER="prometheus", MERIDIAN_METRICS_PASSWORD="scrape-secret-123")
def test_the_metrics_user_reads_the_loops():
    credentials = base64.b64encode(b"prometheus:scrape-secret-123").decode()
    body = Client(HTTP_AUTHORIZATION=f"Basic {credentials}").get("/health/ready").json()
    assert set(body) >= LOOPS


def test_a_staff_session_reads_the_loops(world):
    client = Client()
    client.force_login(world.users["platform_admin"])
    assert set(client.get("/health/ready").json()) >= LOOPS


@override_settings(SECURE_SSL_REDIRECT=True, SECURE_REDIRECT_EXEMPT=[r"^health/"])
def test_probes_over_plain_http_are_not_redirected_while_everything_else_is():
    client = Client()
    assert client.get("/health/live").status_code == 200
    assert client.get("/login/").status_code == 301
