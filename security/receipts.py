"""
Signed attestation receipts: a compact JWS (ES384) that says what Meridian verified about a
tenant's GPUs, which the tenant can check offline against the published JWKS.

One key signs at a time; rotation retires it but keeps it published, so receipts already handed
out still verify. A retired key leaves the JWKS MERIDIAN_RECEIPT_KEY_PUBLISHED_DAYS after its
retirement, and the receipts it signed stop verifying with it. Private keys are stored encrypted
(EncryptedTextField) and exist in the clear only in memory, while signing.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from datetime import timedelta

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone
from jwt.algorithms import ECAlgorithm

from security.audit import audit_record
from security.models import ReceiptKey

ALGORITHM = "ES384"
TOKEN_TYPE = "attestation-receipt+jwt"
PUBLISHED_DAYS_DEFAULT = 400
REGISTERED_CLAIMS = frozenset({"iss", "sub", "aud", "iat", "nbf", "exp", "jti"})

# One lock for every change to the set of signing keys, so racing processes make one key, not two.
_LOCK_KEY = int.from_bytes(hashlib.sha256(b"meridian:receipt-key").digest()[:8], "big", signed=True)


def receipt_key_rotate(*, actor=None) -> ReceiptKey:
    """
    Make a new signing key and retire the current one. The retired key stays published, so the
    receipts it signed keep verifying until it is unpublished; keys retired longer ago than the
    publication period are unpublished now.
    """
    with transaction.atomic():
        _lock_keys()
        return _rotate(actor=actor)


def signing_key() -> ReceiptKey:
    """The newest unretired key; the first one is made on first use, once, however many processes race."""
    key = _current_key()
    if key is not None:
        return key
    with transaction.atomic():
        _lock_keys()
        return _current_key() or _rotate(actor=None)


def receipt_issue(claims: dict, *, subject: str, audience: str, lifetime: timedelta | None = None) -> str:
    """
    A receipt for ``audience`` (the tenant's id) about ``subject``, carrying ``claims`` as given.
    The registered claims are Meridian's to set, so ``claims`` may not carry them. Without a
    ``lifetime`` the receipt does not expire; it verifies as long as its key is published.
    """
    clash = REGISTERED_CLAIMS & claims.keys()
    if clash:
        raise ValueError(f"Registered claims are set by receipt_issue, not by the caller: {sorted(clash)}.")
    key = signing_key()
    now = int(timezone.now().timestamp())
    payload = {**claims, "iss": _issuer(), "sub": str(subject), "aud": str(audience), "iat": now, "nbf": now,
               "jti": str(uuid.uuid4())}
    if lifetime is not None:
        payload["exp"] = now + int(lifetime.total_seconds())
    return jwt.encode(payload, _private_key(key), algorithm=ALGORITHM,
                      headers={"kid": key.kid, "typ": TOKEN_TYPE}, json_encoder=DjangoJSONEncoder)


def jwks() -> dict:
    """The public keys of every published key, newest first: what a tenant verifies receipts with."""
    return {"keys": [dict(key.public_jwk) for key in _published_keys()]}


def receipt_verify(token: str, *, jwks: dict, audience: str, issuer: str | None = None) -> dict:
    """
    The claims of ``token`` once its signature checks out with the key its header names in
    ``jwks``, and its type, audience, issuer (default: this Meridian) and times are right.
    Raises a jwt.InvalidTokenError (or another jwt.PyJWTError) otherwise.
    """
    header = jwt.get_unverified_header(token)
    if header.get("typ") != TOKEN_TYPE:
        raise jwt.InvalidTokenError("Not an attestation receipt.")
    return jwt.decode(token, _public_key(jwks, header.get("kid")), algorithms=[ALGORITHM], audience=str(audience),
                      issuer=issuer or _issuer(), options={"require": ["iss", "sub", "aud", "iat", "nbf", "jti"]})


def published_days() -> int:
    return getattr(settings, "MERIDIAN_RECEIPT_KEY_PUBLISHED_DAYS", PUBLISHED_DAYS_DEFAULT)


def _rotate(*, actor) -> ReceiptKey:
    now = timezone.now()
    retiring = list(ReceiptKey.objects.filter(retired_at__isnull=True).values_list("kid", flat=True))
    ReceiptKey.objects.filter(kid__in=retiring).update(retired_at=now)
    expired = ReceiptKey.objects.filter(retired_at__lte=now - timedelta(days=published_days()),
                                        unpublished_at__isnull=True)
    unpublishing = list(expired.values_list("kid", flat=True))
    expired.update(unpublished_at=now)
    key = _new_key()
    audit_record(actor=actor, action="receipt_key.rotate", target=key,
                 after={"kid": key.kid, "retired": retiring, "unpublished": unpublishing})
    return key


def _new_key() -> ReceiptKey:
    private = ec.generate_private_key(ec.SECP384R1())
    public_jwk = ECAlgorithm.to_jwk(private.public_key(), as_dict=True)
    kid = _thumbprint(public_jwk)
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    key = ReceiptKey(kid=kid, private_key_pem=pem,
                     public_jwk={**public_jwk, "kid": kid, "use": "sig", "alg": ALGORITHM})
    key.save(force_insert=True)
    return key


def _thumbprint(jwk: dict) -> str:
    """The RFC 7638 thumbprint: a kid any party can recompute from the public key alone."""
    members = {name: jwk[name] for name in ("crv", "kty", "x", "y")}
    digest = hashlib.sha256(json.dumps(members, separators=(",", ":"), sort_keys=True).encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _current_key() -> ReceiptKey | None:
    return ReceiptKey.objects.filter(retired_at__isnull=True).order_by("-created_at").first()


def _published_keys():
    """Unpublished by a rotation, or past the publication period already though no rotation came since."""
    now = timezone.now()
    cutoff = now - timedelta(days=published_days())
    return (ReceiptKey.objects.filter(Q(unpublished_at__isnull=True) | Q(unpublished_at__gt=now))
            .filter(Q(retired_at__isnull=True) | Q(retired_at__gt=cutoff))
            .defer("private_key_pem").order_by("-created_at"))


def _lock_keys() -> None:
    """Serialise key changes: an advisory lock on PostgreSQL; SQLite's IMMEDIATE transactions already do."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])


def sign_bytes(data: bytes) -> tuple[str, str]:
    """Sign ``data`` (ECDSA P-384 over SHA-384) with the current key: (kid, base64 DER signature)."""
    from cryptography.hazmat.primitives import hashes

    key = signing_key()
    signature = _private_key(key).sign(data, ec.ECDSA(hashes.SHA384()))
    return key.kid, base64.b64encode(signature).decode()


def verify_bytes(data: bytes, *, kid: str, signature: str) -> bool:
    """Whether ``signature`` over ``data`` verifies with key ``kid`` (published or not: the record is ours)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes

    key = ReceiptKey.objects.filter(kid=kid).first()
    if key is None:
        return False
    try:
        _private_key(key).public_key().verify(base64.b64decode(signature), data, ec.ECDSA(hashes.SHA384()))
    except (InvalidSignature, ValueError):
        return False
    return True


def _private_key(key: ReceiptKey):
    return serialization.load_pem_private_key(key.private_key_pem.encode(), password=None)


def _public_key(keys: dict, kid: str | None) -> jwt.PyJWK:
    for jwk in keys.get("keys", []):
        if kid is not None and jwk.get("kid") == kid:
            return jwt.PyJWK(jwk, algorithm=ALGORITHM)
    raise jwt.InvalidTokenError(f"No published key {kid!r} in the JWKS.")


def _issuer() -> str:
    return settings.MERIDIAN_PUBLIC_URL.rstrip("/")
