"""
Secrets at rest: a model field that stores Fernet ciphertext.

Keys come from MERIDIAN_ENCRYPTION_KEYS, newest first; every key in the ring decrypts, only the
first encrypts, so adding a key in front and re-saving rows rotates without downtime.
"""

from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import models


@lru_cache(maxsize=4)
def _ring(keys: tuple[str, ...]) -> MultiFernet:
    if not keys:
        raise ImproperlyConfigured("MERIDIAN_ENCRYPTION_KEYS is empty; set at least one Fernet key.")
    return MultiFernet([Fernet(key) for key in keys])


def key_ring() -> MultiFernet:
    """The current key ring, read from settings at call time (tests may override the keys)."""
    return _ring(tuple(settings.MERIDIAN_ENCRYPTION_KEYS))


def encrypt(plaintext: str) -> str:
    return key_ring().encrypt(plaintext.encode()).decode()


def decrypt(ciphertext: str) -> str:
    try:
        return key_ring().decrypt(ciphertext.encode()).decode()
    except InvalidToken as exc:
        raise ImproperlyConfigured(
            "A stored secret cannot be decrypted with MERIDIAN_ENCRYPTION_KEYS; "
            "the key that encrypted it is missing from the ring."
        ) from exc


class EncryptedTextField(models.TextField):
    """A text field whose value is encrypted in the database and never appears in query results."""

    def from_db_value(self, value, expression, connection):
        return None if value in (None, "") else decrypt(value)

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        return value if value in (None, "") else encrypt(value)
