"""System checks: the database's autovacuum."""

from unittest import mock

import pytest
from django.db import connection

from config.checks import autovacuum_on

pytestmark = pytest.mark.django_db


def _setting_is(value):
    """The answer pg_settings gives for autovacuum (the test database's own may be either)."""
    real = connection.cursor

    def cursor(*args, **kwargs):
        wrapped = real(*args, **kwargs)
        wrapped.fetchone = lambda: (value,)
        return wrapped

    return mock.patch.object(connection, "cursor", cursor)


def test_autovacuum_off_is_a_warning_that_says_what_to_do():
    if connection.vendor != "postgresql":
        pytest.skip("autovacuum is PostgreSQL's")
    with _setting_is("off"):
        found = autovacuum_on(None, databases=["default"])
    assert [warning.id for warning in found] == ["meridian.W001"]
    assert "ALTER SYSTEM SET autovacuum = on" in found[0].hint


def test_autovacuum_on_says_nothing():
    with _setting_is("on"):
        assert autovacuum_on(None, databases=["default"]) == []


def test_without_a_database_asked_for_it_reads_nothing():
    with mock.patch.object(connection, "cursor", side_effect=AssertionError("read the database")):
        assert autovacuum_on(None, databases=None) == []


def test_the_real_setting_is_read():
    if connection.vendor != "postgresql":
        pytest.skip("autovacuum is PostgreSQL's")
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        actual = cursor.fetchone()[0]
    found = autovacuum_on(None, databases=["default"])
    assert bool(found) == (actual != "on")
