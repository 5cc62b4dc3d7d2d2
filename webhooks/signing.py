"""
Delivery signatures (docs/webhooks.md, "Verifying a delivery"): ``Meridian-Signature: t=<unix
seconds>,v1=<hex>`` where each v1 is HMAC-SHA256 of ``"<t>.<body>"`` under one of the endpoint's
secrets -- the current one, and during a rotation's overlap the previous one too.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

PREFIX = "whsec_"


def new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def header(secrets_in_use: list[str], timestamp: int, body: bytes) -> str:
    return ",".join([f"t={timestamp}", *(f"v1={signature(s, timestamp, body)}" for s in secrets_in_use)])


def verify(secret: str, header_value: str, body: bytes, *, now: int, tolerance: int = 300) -> bool:
    """What a receiver does: a v1 signature of this secret matches, and the timestamp is recent."""
    parts = [part.split("=", 1) for part in header_value.split(",") if "=" in part]
    stamps = [value for key, value in parts if key == "t"]
    if not stamps or not stamps[0].isdigit() or abs(now - int(stamps[0])) > tolerance:
        return False
    expected = signature(secret, int(stamps[0]), body)
    return any(key == "v1" and hmac.compare_digest(value, expected) for key, value in parts)
