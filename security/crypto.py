"""
Secrets at rest: a model field that stores Fernet ciphertext.

Keys come from MERIDIAN_ENCRYPTION_KEYS, newest first; every key in the ring decrypts, only the
first encrypts, so adding a key in front and re-saving rows rotates without downtime
(``manage.py rotate_encryption_keys`` re-encrypts every stored value with the newest key, after
which the older keys can leave the ring).
"""

from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import models


@lru_cache(maxsize=4)
def _ring(keys: tuple[str, ...]) -> MultiFernet:
    if not keys:
        raise ImproperlyConfigured("MERIDIAN_ENCRYPTION_KEYS is empty; set at least one Fernet key.")
    return MultiFernet([Fernet(key) for key in keys])


@lru_cache(maxsize=4)
def _newest(key: str) -> Fernet:
    return Fernet(key)


class UndecryptableSecret(ImproperlyConfigured):
    """A stored value that no key in the ring decrypts: its key was dropped from the ring too soon."""


def key_ring() -> MultiFernet:
    """The current key ring, read from settings at call time (tests may override the keys)."""
    return _ring(tuple(settings.MERIDIAN_ENCRYPTION_KEYS))


def encrypt(plaintext: str) -> str:
    return key_ring().encrypt(plaintext.encode()).decode()


def decrypt(ciphertext: str) -> str:
    try:
        return key_ring().decrypt(ciphertext.encode()).decode()
    except InvalidToken as exc:
        raise UndecryptableSecret(
            "A stored secret cannot be decrypted with MERIDIAN_ENCRYPTION_KEYS; "
            "the key that encrypted it is missing from the ring."
        ) from exc


def newest_key() -> Fernet:
    """The key new values are encrypted with: the first of MERIDIAN_ENCRYPTION_KEYS."""
    key_ring()  # an empty ring is a configuration error, reported as such
    return _newest(settings.MERIDIAN_ENCRYPTION_KEYS[0])


def needs_rotation(ciphertext: str | None) -> bool:
    """
    Whether a stored value was encrypted with an older key than the newest. Empty values are never
    encrypted (the field stores them as they are), so they never need rotating.
    """
    if ciphertext in (None, ""):
        return False
    try:
        newest_key().decrypt(ciphertext.encode())
    except InvalidToken:
        return True
    return False


def reencrypt(ciphertext: str) -> str:
    """
    The same plaintext encrypted with the newest key (the original timestamp is kept), without the
    plaintext leaving this function. Raises UndecryptableSecret when no key in the ring decrypts it.
    """
    try:
        return key_ring().rotate(ciphertext.encode()).decode()
    except InvalidToken as exc:
        raise UndecryptableSecret(
            "A stored secret cannot be decrypted with any key in MERIDIAN_ENCRYPTION_KEYS."
        ) from exc


def encrypted_fields() -> list[tuple[type[models.Model], "EncryptedTextField"]]:
    """
    Every (model, field) pair that stores ciphertext, each table column once: proxy models share
    their concrete model's table and inherited fields belong to the parent's table, so both are left out.
    """
    return [
        (model, field)
        for model in apps.get_models()
        if not model._meta.proxy
        for field in model._meta.local_concrete_fields
        if isinstance(field, EncryptedTextField)
    ]


class EncryptedTextField(models.TextField):
    """A text field whose value is encrypted in the database and never appears in query results."""

    def from_db_value(self, value, expression, connection):
        return None if value in (None, "") else decrypt(value)

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        return value if value in (None, "") else encrypt(value)
