"""
Attestation receipts: signed ES384 with a published key, verifiable by a tenant with nothing but
the JWKS; tampering, the wrong audience and keys past publication fail; a rotation keeps old
receipts verifiable; private keys are encrypted at rest and never published.
"""

import base64
import io
import json
import threading
import uuid
from datetime import timedelta

import jwt
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from security.models import AuditEvent, ReceiptKey
from security.receipts import (
    TOKEN_TYPE,
    jwks,
    receipt_issue,
    receipt_key_rotate,
    receipt_verify,
    signing_key,
)

JWKS_URL = "/.well-known/jwks.json"
TENANT = str(uuid.uuid4())
CLAIMS = {"reservation": str(uuid.uuid4()), "node": "gpu-0001.us-east-1", "gpus": ["GPU-a", "GPU-b"],
          "verdict": "pass", "report": str(uuid.uuid4()), "verified_at": "2025-01-01T00:00:00+00:00"}


def issue(**changes) -> str:
    return receipt_issue({**CLAIMS, **changes}, subject=CLAIMS["node"], audience=TENANT)


def published() -> dict:
    """The JWKS as a tenant gets it: over HTTP, with no credentials."""
    response = Client().get(JWKS_URL)
    assert response.status_code == 200
    return response.json()


def b64decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_receipt_verifies_with_the_published_jwks(db):
    token = issue()
    claims = receipt_verify(token, jwks=published(), audience=TENANT)
    assert {name: claims[name] for name in CLAIMS} == CLAIMS
    assert claims["iss"] == settings.MERIDIAN_PUBLIC_URL.rstrip("/")
    assert claims["sub"] == CLAIMS["node"] and claims["aud"] == TENANT
    assert claims["iat"] == claims["nbf"] and uuid.UUID(claims["jti"])
    assert "exp" not in claims
    header = jwt.get_unverified_header(token)
    assert header == {"alg": "ES384", "kid": signing_key().kid, "typ": TOKEN_TYPE}


def test_the_jwks_endpoint_is_public_cacheable_json(db):
    issue()
    response = Client().get(JWKS_URL)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert "public" in response["Cache-Control"] and "max-age=300" in response["Cache-Control"]
    (key,) = response.json()["keys"]
    assert key["kty"] == "EC" and key["crv"] == "P-384" and key["use"] == "sig" and key["alg"] == "ES384"
    assert key["kid"] == signing_key().kid
    assert Client().post(JWKS_URL).status_code == 405


def test_every_receipt_has_its_own_id(db):
    first, second = (receipt_verify(issue(), jwks=jwks(), audience=TENANT) for _ in range(2))
    assert first["jti"] != second["jti"]


def test_a_tampered_payload_fails(db):
    header, payload, signature = issue().split(".")
    claims = json.loads(b64decode(payload))
    claims["verdict"] = "fail"
    forged = ".".join([header, b64encode(json.dumps(claims).encode()), signature])
    with pytest.raises(jwt.InvalidSignatureError):
        receipt_verify(forged, jwks=published(), audience=TENANT)


def test_a_tampered_signature_fails(db):
    header, payload, signature = issue().split(".")
    raw = bytearray(b64decode(signature))
    raw[10] ^= 0x01
    with pytest.raises(jwt.InvalidSignatureError):
        receipt_verify(".".join([header, payload, b64encode(bytes(raw))]), jwks=published(), audience=TENANT)


def test_a_receipt_for_another_tenant_fails(db):
    with pytest.raises(jwt.InvalidAudienceError):
        receipt_verify(issue(), jwks=published(), audience=str(uuid.uuid4()))


def test_a_receipt_from_another_issuer_fails(db):
    with pytest.raises(jwt.InvalidIssuerError):
        receipt_verify(issue(), jwks=published(), audience=TENANT, issuer="https://elsewhere.example")


def test_an_expired_receipt_fails(db):
    token = receipt_issue(CLAIMS, subject="n", audience=TENANT, lifetime=timedelta(seconds=-5))
    with pytest.raises(jwt.ExpiredSignatureError):
        receipt_verify(token, jwks=published(), audience=TENANT)
    fresh = receipt_issue(CLAIMS, subject="n", audience=TENANT, lifetime=timedelta(hours=1))
    assert receipt_verify(fresh, jwks=published(), audience=TENANT)["exp"] > timezone.now().timestamp()


def test_a_token_of_another_type_fails(db):
    key = signing_key()
    other = jwt.encode({"aud": TENANT}, key.private_key_pem, algorithm="ES384", headers={"kid": key.kid})
    with pytest.raises(jwt.InvalidTokenError):
        receipt_verify(other, jwks=published(), audience=TENANT)


def test_callers_cannot_set_registered_claims(db):
    with pytest.raises(ValueError, match="aud"):
        issue(aud=str(uuid.uuid4()))


def test_after_a_rotation_old_receipts_still_verify(db):
    old_token = issue()
    old = signing_key()
    new = receipt_key_rotate()
    assert new.kid != old.kid and signing_key().kid == new.kid
    new_token = issue()
    assert jwt.get_unverified_header(new_token)["kid"] == new.kid
    keys = published()
    assert {key["kid"] for key in keys["keys"]} == {old.kid, new.kid}
    assert receipt_verify(old_token, jwks=keys, audience=TENANT)["verdict"] == "pass"
    assert receipt_verify(new_token, jwks=keys, audience=TENANT)["verdict"] == "pass"
    old.refresh_from_db()
    assert old.retired_at is not None and old.unpublished_at is None


def test_a_rotation_is_audited(db):
    old = signing_key()
    new = receipt_key_rotate()
    event = AuditEvent.objects.get(action="receipt_key.rotate", target_id=new.kid)
    assert event.target_type == "security.receiptkey"
    assert event.after == {"kid": new.kid, "retired": [old.kid], "unpublished": []}


@pytest.mark.parametrize("days", [400, 30])
def test_past_the_publication_period_old_receipts_fail(db, settings, days):
    if days != 400:
        settings.MERIDIAN_RECEIPT_KEY_PUBLISHED_DAYS = days
    old_token = issue()
    old = signing_key()
    receipt_key_rotate()
    ReceiptKey.objects.filter(pk=old.pk).update(retired_at=timezone.now() - timedelta(days=days, seconds=1))
    keys = published()
    assert old.kid not in {key["kid"] for key in keys["keys"]}
    with pytest.raises(jwt.InvalidTokenError):
        receipt_verify(old_token, jwks=keys, audience=TENANT)
    assert receipt_verify(issue(), jwks=keys, audience=TENANT)


def test_within_the_publication_period_the_old_key_stays(db):
    old = signing_key()
    receipt_key_rotate()
    ReceiptKey.objects.filter(pk=old.pk).update(retired_at=timezone.now() - timedelta(days=399))
    assert old.kid in {key["kid"] for key in published()["keys"]}


def test_a_rotation_records_the_unpublication(db):
    oldest = signing_key()
    receipt_key_rotate()
    ReceiptKey.objects.filter(pk=oldest.pk).update(retired_at=timezone.now() - timedelta(days=401))
    receipt_key_rotate()
    oldest.refresh_from_db()
    assert oldest.unpublished_at is not None
    assert ReceiptKey.objects.filter(unpublished_at__isnull=True).count() == 2


def test_the_private_key_is_encrypted_at_rest_and_never_published(db):
    key = signing_key()
    issue()
    assert "BEGIN PRIVATE KEY" in ReceiptKey.objects.get(pk=key.pk).private_key_pem
    with connection.cursor() as cursor:
        cursor.execute("SELECT private_key_pem FROM security_receiptkey WHERE kid = %s", [key.kid])
        (raw,) = cursor.fetchone()
    assert "PRIVATE KEY" not in raw and key.private_key_pem not in raw
    body = Client().get(JWKS_URL).content.decode()
    assert "PRIVATE" not in body and raw not in body
    for jwk in json.loads(body)["keys"]:
        assert set(jwk) == {"kty", "crv", "x", "y", "kid", "use", "alg"}


@pytest.mark.django_db(transaction=True)
def test_racing_first_uses_make_one_key():
    threads = 4
    barrier = threading.Barrier(threads)
    kids, errors = [], []

    def first_use():
        try:
            barrier.wait()
            kids.append(signing_key().kid)
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    workers = [threading.Thread(target=first_use) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    assert len(set(kids)) == 1 and len(kids) == threads
    assert ReceiptKey.objects.count() == 1


def test_the_command_rotates_and_prints_the_kid(db):
    old = signing_key()
    out = io.StringIO()
    call_command("rotate_receipt_key", stdout=out)
    kid = out.getvalue().strip()
    assert kid == signing_key().kid != old.kid
    assert ReceiptKey.objects.get(pk=old.pk).retired_at is not None
