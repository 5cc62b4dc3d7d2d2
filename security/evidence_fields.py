"""
Shared rules for reading attestation evidence from JSON: evidence is a security claim, so every
member is required or refused (a field the verifier ignores is a field an attacker controls),
strings are printable ASCII of bounded length, and certificates are bounded PEM.
"""

from __future__ import annotations

from typing import Any

MAX_CHAIN = 8
MAX_PEM = 16_384


def require_members(data: Any, names: tuple[str, ...], what: str) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be an object, not {type(data).__name__}")
    missing = [name for name in names if name not in data]
    if missing:
        raise ValueError(f"{what} lacks {', '.join(missing)}")
    extra = sorted(str(name) for name in data if name not in names)
    if extra:
        raise ValueError(f"{what} has unknown members: {', '.join(extra)}")


def text(data: dict, name: str, limit: int, where: str = "") -> str:
    """A non-empty printable-ASCII string of at most ``limit`` characters."""
    value = data[name]
    label = f"{where}: {name}" if where else name
    if not isinstance(value, str):
        raise ValueError(f"{label} must be a string, not {type(value).__name__}")
    if not value or len(value) > limit:
        raise ValueError(f"{label} must be 1 to {limit} characters long")
    if not (value.isascii() and value.isprintable()):
        raise ValueError(f"{label} must be printable ASCII")
    return value


def parse_chain(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_CHAIN:
        raise ValueError(f"{where}: certificate_chain must be a list of 1 to {MAX_CHAIN} PEM certificates")
    for pem in value:
        if not isinstance(pem, str) or len(pem) > MAX_PEM or "-----BEGIN CERTIFICATE-----" not in pem:
            raise ValueError(f"{where}: each certificate must be a PEM string of at most {MAX_PEM} characters")
        if not pem.isascii():
            raise ValueError(f"{where}: certificates must be ASCII PEM")
    return list(value)
