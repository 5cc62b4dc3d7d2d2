"""Deployment checks: check --deploy, the OpenAPI schema, migrations on SQLite, security headers."""

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client, override_settings

REPO = Path(__file__).resolve().parent.parent


def manage(*args, env_extra: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run manage.py in a clean environment: nothing of the test run's settings leaks in."""
    env = {"PATH": os.environ["PATH"], "MERIDIAN_DATA_DIR": str(tmp_path / "data"), **env_extra}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=180
    )


def test_check_deploy_is_clean_with_only_debug_secret_and_hosts(tmp_path):
    """DEBUG off, a real secret key and allowed hosts are all `check --deploy` needs to pass."""
    result = manage(
        "check", "--deploy", "--fail-level", "WARNING",
        env_extra={"DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": secrets.token_urlsafe(64),
                   "DJANGO_ALLOWED_HOSTS": "meridian.example.com"},
        tmp_path=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_a_command_that_goes_well_writes_nothing_on_stderr(tmp_path):
    """stderr is kept for real problems: no library's start-up banner on every command."""
    result = manage("check", env_extra={}, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_openapi_schema_validates_without_warnings(tmp_path):
    """The schema generates with no warning and validates as OpenAPI 3."""
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yml"))
    assert (tmp_path / "schema.yml").read_text().startswith("openapi: 3")


@pytest.mark.slow
def test_migrations_apply_on_sqlite_and_match_the_models(tmp_path):
    """The embedded default's database migrates from scratch, and no model change lacks a migration."""
    env = {"DATABASE_URL": f"sqlite:///{tmp_path / 'embedded.sqlite3'}"}
    migrated = manage("migrate", "--noinput", env_extra=env, tmp_path=tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stderr == ""  # stderr is for real problems
    check = manage("makemigrations", "--check", "--dry-run", env_extra=env, tmp_path=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.django_db
def test_security_headers_on_console_and_api():
    """Every response forbids framing and sniffing and carries a content security policy."""
    client = Client()
    for path in ["/login/", "/api/v1/me/", "/api/docs/"]:
        response = client.get(path)
        assert response["X-Frame-Options"] == "DENY", path
        assert response["X-Content-Type-Options"] == "nosniff", path
        assert response["Referrer-Policy"] == "same-origin", path
        assert "frame-ancestors 'none'" in response["Content-Security-Policy"], path
        assert response["X-Request-ID"], path


@pytest.mark.django_db
def test_secure_transport_turns_on_hsts_and_https_redirect():
    """With secure transport (the default when DEBUG is off) HTTP redirects and HTTPS gets HSTS."""
    with override_settings(SECURE_SSL_REDIRECT=True, SECURE_HSTS_SECONDS=31_536_000):
        client = Client()
        assert client.get("/login/").status_code == 301
        response = client.get("/login/", secure=True)
        assert response["Strict-Transport-Security"].startswith("max-age=31536000")


@pytest.mark.django_db
def test_api_docs_are_served_offline():
    """Swagger UI and its assets come from this server (no CDN reachable here)."""
    response = Client().get("/api/docs/")
    assert response.status_code == 200
    page = response.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert assets and all(a.startswith("/static/") for a in assets), assets
    # Nothing fetched from elsewhere (a plain "cdn" search also matched the random CSRF token in the page).
    assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", page), re.findall(r"(?:https?:)?//[^\s\"']+", page)


@pytest.mark.parametrize(("env_extra", "says"), [
    ({"MERIDIAN_ALLOCATION_ARCHIVE_AFTER_MINUTES": "60"}, "is now MERIDIAN_ALLOCATION_ARCHIVE_AFTER_SECONDS"),
    ({"MERIDIAN_ALLOCATION_ARCHIVE_AFTER_SECONDS": "5"}, "must be at least 10"),
])
def test_an_archive_horizon_that_is_renamed_or_too_short_stops_the_start(tmp_path, env_extra, says):
    """Silently taken, the old minutes would be read as the default and 5 s would queue creates that waited a little."""
    result = manage("check", env_extra=env_extra, tmp_path=tmp_path)
    assert result.returncode != 0
    assert says in result.stderr
