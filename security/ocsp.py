"""
OCSP responses an operator imports (RFC 6960), for a control plane that cannot reach the vendor's
responder: fetch them where the network allows (``openssl ocsp`` or NVIDIA's responder), carry
them in, and Meridian checks each before it counts: a successful response, signed by the issuer
of the certificates it speaks for or by a responder the issuer delegated (OCSPSigning), not stale.
Pure: ``now`` is an argument.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509 import ocsp
from cryptography.x509.oid import ExtendedKeyUsageOID

from security.chains import issued_by

MAX_RESPONSE = 64 * 1024
CLOCK_SKEW = timedelta(minutes=5)


@dataclass(frozen=True)
class Status:
    """One certificate's status as a verified response states it."""

    issuer: str
    serial_number: int
    status: str  # good, revoked or unknown
    this_update: datetime
    next_update: datetime | None
    revoked_at: datetime | None


def read(der: bytes, *, issuers: list[x509.Certificate], now: datetime) -> list[Status]:
    """The statuses of a DER OCSP response, after every check; ValueError says what is wrong."""
    if not isinstance(der, bytes) or not 0 < len(der) <= MAX_RESPONSE:
        raise ValueError(f"an OCSP response is 1 byte to {MAX_RESPONSE // 1024} KiB of DER")
    try:
        response = ocsp.load_der_ocsp_response(der)
    except ValueError as error:
        raise ValueError(f"not a DER OCSP response: {error}") from None
    if response.response_status != ocsp.OCSPResponseStatus.SUCCESSFUL:
        raise ValueError(f"the responder answered {response.response_status.name}, not SUCCESSFUL")
    statuses = []
    signer_checked: set[bytes] = set()
    for single in response.responses:
        issuer = _issuer_of(single, issuers)
        key = issuer.fingerprint(hashes.SHA256())
        if key not in signer_checked:
            _check_signature(response, issuer)
            signer_checked.add(key)
        statuses.append(_status(single, issuer, now))
    if not statuses:
        raise ValueError("the response states no certificate's status")
    return statuses


def _issuer_of(single, issuers: list[x509.Certificate]) -> x509.Certificate:
    algorithm = single.hash_algorithm
    for issuer in issuers:
        name_hash = _digest(algorithm, issuer.subject.public_bytes())
        key_hash = _digest(algorithm, _key_bits(issuer))
        if (name_hash, key_hash) == (single.issuer_name_hash, single.issuer_key_hash):
            return issuer
    raise ValueError(f"serial {single.serial_number:x}: its issuer is none of the certificates Meridian knows "
                     "(trust the issuing CA, or give its certificate with the response)")


def _check_signature(response, issuer: x509.Certificate) -> None:
    signer = issuer
    if not _names_responder(response, issuer):
        delegated = [cert for cert in response.certificates if _names_responder(response, cert)]
        if not delegated:
            raise ValueError("the response is signed by neither the issuer nor a responder certificate it includes")
        signer = delegated[0]
        if not issued_by(signer, issuer):
            raise ValueError(f"the responder {signer.subject.rfc4514_string()} is not issued by "
                             f"{issuer.subject.rfc4514_string()}")
        try:
            usages = signer.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        except x509.ExtensionNotFound:
            usages = []
        if ExtendedKeyUsageOID.OCSP_SIGNING not in usages:
            raise ValueError(f"the responder {signer.subject.rfc4514_string()} is not delegated to sign OCSP "
                             "(no OCSPSigning extended key usage)")
    key = signer.public_key()
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(response.signature, response.tbs_response_bytes, ec.ECDSA(response.signature_hash_algorithm))
        elif isinstance(key, rsa.RSAPublicKey):
            key.verify(response.signature, response.tbs_response_bytes, padding.PKCS1v15(),
                       response.signature_hash_algorithm)
        else:
            raise ValueError("the responder's key is neither EC nor RSA")
    except (InvalidSignature, UnsupportedAlgorithm, TypeError):
        raise ValueError("the response's signature does not verify with the responder's key") from None


def _names_responder(response, cert: x509.Certificate) -> bool:
    if response.responder_name is not None:
        return response.responder_name == cert.subject
    return response.responder_key_hash == hashlib.sha1(_key_bits(cert)).digest()  # noqa: S324 -- RFC 6960 KeyHash


def _status(single, issuer: x509.Certificate, now: datetime) -> Status:
    serial = single.serial_number
    if single.this_update_utc > now + CLOCK_SKEW:
        raise ValueError(f"serial {serial:x}: the status is dated {single.this_update_utc.isoformat()}, in the future")
    if single.next_update_utc is not None and single.next_update_utc < now:
        raise ValueError(f"serial {serial:x}: the status went stale at {single.next_update_utc.isoformat()}; "
                         "fetch a fresh response")
    state = {ocsp.OCSPCertStatus.GOOD: "good", ocsp.OCSPCertStatus.REVOKED: "revoked"}.get(single.certificate_status,
                                                                                           "unknown")
    return Status(issuer=issuer.subject.rfc4514_string(), serial_number=serial, status=state,
                  this_update=single.this_update_utc, next_update=single.next_update_utc,
                  revoked_at=single.revocation_time_utc)


def _key_bits(cert: x509.Certificate) -> bytes:
    """The subjectPublicKey BIT STRING's contents, which OCSP's issuerKeyHash and KeyHash digest."""
    key = cert.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey):
        return key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.PKCS1)


def _digest(algorithm, data: bytes) -> bytes:
    return hashlib.new(algorithm.name, data).digest()
