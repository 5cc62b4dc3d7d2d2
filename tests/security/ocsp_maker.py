"""OCSP responses for tests (cryptography's builder), signed by the issuer or by a delegated responder."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509 import ocsp


def response(issuer_key, issuer, cert, *, status="good", this_update=None, next_update=None, signer=None,
             signer_key=None) -> bytes:
    """DER of a response stating ``cert``'s status; fresh for a day unless told otherwise."""
    now = datetime.now(UTC)
    this_update = this_update or now - timedelta(minutes=1)
    next_update = next_update if next_update is not None else now + timedelta(days=1)
    state = {"good": ocsp.OCSPCertStatus.GOOD, "revoked": ocsp.OCSPCertStatus.REVOKED}.get(
        status, ocsp.OCSPCertStatus.UNKNOWN)
    builder = ocsp.OCSPResponseBuilder().add_response(
        cert=cert, issuer=issuer, algorithm=hashes.SHA384(), cert_status=state, this_update=this_update,
        next_update=next_update, revocation_time=now - timedelta(hours=1) if status == "revoked" else None,
        revocation_reason=x509.ReasonFlags.key_compromise if status == "revoked" else None)
    responder = signer or issuer
    builder = builder.responder_id(ocsp.OCSPResponderEncoding.NAME, responder)
    if signer is not None:
        builder = builder.certificates([signer])
    return builder.sign(signer_key or issuer_key, hashes.SHA384()).public_bytes(serialization.Encoding.DER)
