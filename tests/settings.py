"""
Settings of the test suite: the project's settings, with the environment defaults a test run
needs set first. PostgreSQL by default (DATABASE_URL overrides), a throwaway data folder, a
fixed encryption key, plain HTTP for the test client.
"""

import os
import tempfile

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/meridian")
os.environ.setdefault("MERIDIAN_DATA_DIR", tempfile.mkdtemp(prefix="meridian-test-"))
os.environ.setdefault("MERIDIAN_ENCRYPTION_KEYS", "kJ0Qv1CSYVzQxUOq9tJ8Y2m6TqkJ7iAHF2h4b0QdVRk=")
os.environ.setdefault("DJANGO_SECRET_KEY", "test-only-secret-key-that-is-long-enough-for-django-checks-0123456789")
os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "testserver,127.0.0.1,localhost")
os.environ.setdefault("MERIDIAN_SECURE_TRANSPORT", "0")
os.environ.setdefault("MERIDIAN_WEBHOOK_ALLOW_LOOPBACK", "1")  # receivers in the tests listen on 127.0.0.1

from config.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
REST_FRAMEWORK = {
    **REST_FRAMEWORK,  # noqa: F405
    "DEFAULT_THROTTLE_RATES": {"principal": "100000/min", "anonymous": "100000/min"},
}
WHITENOISE_AUTOREFRESH = True
# Each test process (xdist worker) publishes the audit heads of its own test database; tests/conftest.py
# clears them after each test.
MERIDIAN_AUDIT_HEAD_DIR = os.path.join(tempfile.gettempdir(), f"meridian-test-audit-heads-{os.getpid()}")
# One cache per test process (the embedded default's file cache would be shared by the xdist
# workers, which clear it between tests).
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "meridian-tests"}}
