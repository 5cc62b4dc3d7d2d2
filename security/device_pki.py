"""
A small device PKI for simulated GPUs: roots, intermediates and device certificates shaped like a
GPU vendor's (ECDSA P-384, the device certificate's subject CN = GPU UUID and serialNumber = board
serial), signed evidence, and deterministic reference measurements. The simulated node agent, the
demo fleet and the tests use it so that security.attestation is exercised with real signatures.

Keys are PEM PKCS#8 without a passphrase: whoever stores one encrypts it at rest.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from security.attestation import GPUEvidence, canonical_bytes

PrivateKey = ec.EllipticCurvePrivateKey

MEASUREMENT_COUNT = 10
CA_LIFETIME = timedelta(days=3650)
DEVICE_LIFETIME = timedelta(days=3 * 365)
BACKDATE = timedelta(days=1)  # so a certificate made now is valid on a machine whose clock lags


def generate_key() -> PrivateKey:
    return ec.generate_private_key(ec.SECP384R1())


def make_root(name: str, *, not_before: datetime | None = None,
              not_after: datetime | None = None) -> tuple[PrivateKey, x509.Certificate]:
    """A self-signed root CA named CN=``name``."""
    key = generate_key()
    subject = _name(NameOID.COMMON_NAME, name)
    cert = _issue(subject=subject, public_key=key.public_key(), issuer=subject, issuer_key=key,
                  issuer_public_key=key.public_key(), ca=True, path_length=None,
                  validity=_validity(not_before, not_after, CA_LIFETIME))
    return key, cert


def make_intermediate(root_key: PrivateKey, root_cert: x509.Certificate, name: str, *, ca: bool = True,
                      path_length: int | None = None, not_before: datetime | None = None,
                      not_after: datetime | None = None) -> tuple[PrivateKey, x509.Certificate]:
    """
    An intermediate CA CN=``name`` issued by ``root_cert``. ``ca=False`` gives BasicConstraints
    CA=false (KeyUsage unchanged), the misissued intermediate a verifier must refuse.
    """
    key = generate_key()
    cert = _issue(subject=_name(NameOID.COMMON_NAME, name), public_key=key.public_key(), issuer=root_cert.subject,
                  issuer_key=root_key, issuer_public_key=root_cert.public_key(), ca=ca, path_length=path_length,
                  validity=_validity(not_before, not_after, CA_LIFETIME), key_cert_sign=True)
    return key, cert


def make_device(issuer_key: PrivateKey, issuer_cert: x509.Certificate, *, gpu_uuid: str, serial: str,
                not_before: datetime | None = None, not_after: datetime | None = None,
                key: PrivateKey | None = None) -> tuple[PrivateKey, x509.Certificate]:
    """A GPU's device certificate (not a CA): subject CN=``gpu_uuid``, serialNumber=``serial``."""
    key = key or generate_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, gpu_uuid),
                         x509.NameAttribute(NameOID.SERIAL_NUMBER, serial)])
    cert = _issue(subject=subject, public_key=key.public_key(), issuer=issuer_cert.subject, issuer_key=issuer_key,
                  issuer_public_key=issuer_cert.public_key(), ca=False, path_length=None,
                  validity=_validity(not_before, not_after, DEVICE_LIFETIME), key_cert_sign=False)
    return key, cert


def sign_gpu_evidence(key: PrivateKey, chain_pems: list[str], *, uuid: str, serial: str, gpu_model: str, vbios: str,
                      driver: str, measurements: dict[int, str], nonce: str, generated_at: int,
                      cc_mode: str | None = None) -> GPUEvidence:
    """One GPU's evidence, signed with its device key as security.attestation.canonical_bytes specifies."""
    unsigned = GPUEvidence(uuid=uuid, serial=serial, gpu_model=gpu_model, vbios=vbios, driver=driver,
                           measurements=dict(measurements), nonce=nonce, generated_at=int(generated_at),
                           certificate_chain=list(chain_pems), signature="", cc_mode=cc_mode)
    signature = key.sign(canonical_bytes(unsigned), ec.ECDSA(hashes.SHA384()))
    return replace(unsigned, signature=base64.b64encode(signature).decode("ascii"))


def reference_measurements(gpu_model: str, vbios: str, driver: str) -> dict[int, str]:
    """What a simulated GPU of this firmware version measures: SHA-384 of "model|vbios|driver|index"."""
    return {index: hashlib.sha384(f"{gpu_model}|{vbios}|{driver}|{index}".encode()).hexdigest()
            for index in range(MEASUREMENT_COUNT)}


def key_to_pem(key: PrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode("ascii")


def key_from_pem(pem: str | bytes) -> PrivateKey:
    """Load an unencrypted PKCS#8 PEM key; only EC keys are device or CA keys here."""
    key = serialization.load_pem_private_key(pem.encode("ascii") if isinstance(pem, str) else pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("not an EC private key")
    return key


def cert_to_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode("ascii")


def cert_from_pem(pem: str | bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem.encode("ascii") if isinstance(pem, str) else pem)


def certs_from_pem(bundle: str | bytes) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle, in order."""
    return x509.load_pem_x509_certificates(bundle.encode("ascii") if isinstance(bundle, str) else bundle)


def fingerprint_sha256(cert: x509.Certificate) -> str:
    """Lower-case hex SHA-256 of the DER certificate, as TrustAnchor.fingerprint_sha256 stores it."""
    return cert.fingerprint(hashes.SHA256()).hex()


def _name(oid: x509.ObjectIdentifier, value: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(oid, value)])


def _validity(not_before: datetime | None, not_after: datetime | None,
              lifetime: timedelta) -> tuple[datetime, datetime]:
    start = not_before or datetime.now(UTC) - BACKDATE
    return start, not_after or start + lifetime


def _issue(*, subject: x509.Name, public_key: Any, issuer: x509.Name, issuer_key: PrivateKey, issuer_public_key: Any,
           ca: bool, path_length: int | None, validity: tuple[datetime, datetime],
           key_cert_sign: bool | None = None) -> x509.Certificate:
    """Build and sign one certificate; CA certificates may sign certificates, device ones only data."""
    can_sign_certs = ca if key_cert_sign is None else key_cert_sign
    usage = x509.KeyUsage(digital_signature=not can_sign_certs, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=can_sign_certs,
                          crl_sign=can_sign_certs, encipher_only=False, decipher_only=False)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(x509.BasicConstraints(ca=ca, path_length=path_length if ca else None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_public_key), critical=False)
    )
    return builder.sign(issuer_key, hashes.SHA384())
