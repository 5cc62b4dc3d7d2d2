"""
How the agent signs a request and the control plane checks it (both sides import this module).

The signature is HMAC-SHA256 with the node's secret over the method, the path, a Unix time, a
random nonce and the SHA-256 of the body, so a request cannot be altered, replayed (the server
remembers nonces while their time is fresh) or kept for later (the time must be close to now).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

HEADER_KEY = "X-Meridian-Node-Key"
HEADER_TIME = "X-Meridian-Time"
HEADER_NONCE = "X-Meridian-Nonce"
HEADER_SIGNATURE = "X-Meridian-Signature"
MAX_SKEW_S = 60


def signature(secret: str, method: str, path: str, timestamp: str, nonce: str, body: bytes) -> str:
    message = "\n".join([method.upper(), path, timestamp, nonce, hashlib.sha256(body).hexdigest()])
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


def signed_headers(key_id: str, secret: str, method: str, path: str, body: bytes, now: float | None = None) -> dict:
    timestamp = str(int(now if now is not None else time.time()))
    nonce = secrets.token_hex(16)
    return {
        HEADER_KEY: key_id,
        HEADER_TIME: timestamp,
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: signature(secret, method, path, timestamp, nonce, body),
    }


def valid(secret: str, method: str, path: str, timestamp: str, nonce: str, body: bytes, given: str) -> bool:
    return hmac.compare_digest(signature(secret, method, path, timestamp, nonce, body), given or "")
