"""
X.509 chains for attestation: a GPU's device certificate, or the signer of a reference integrity
manifest, walked up to an operator-trusted root with every link checked by signature, then
validity, CA constraints and revocation. Pure: no database, no clock (``now`` is an argument).

Revocation has two sources: certificates the operator revoked (``Revocation.revoked``: issuer and
serial, as a CRL names them) and the ``good`` statuses of imported OCSP responses
(``Revocation.good_until``: how long each stays fresh). A root may require a status: then every
certificate below it needs a fresh ``good`` one, or the chain answers ``revocation_unknown`` (the
device may be fine, but an isolated control plane cannot ask the vendor's OCSP responder, so staff
import fresh responses). Verified chains are cached per presented PEMs and trust set; revocation
is re-checked on every hit.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import NameOID

MAX_PATH = 8


@dataclass(frozen=True)
class Reason:
    """One failed check: which GPU (None for the node as a whole), a stable code, and what was found."""

    gpu: str | None
    check: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "check": self.check, "detail": self.detail}


@dataclass(frozen=True)
class Trust:
    """The roots and helper intermediates one verification trusts, indexed once."""

    roots: frozenset[x509.Certificate]
    issuers_by_subject: dict[x509.Name, list[x509.Certificate]]
    strict_roots: frozenset[x509.Certificate] = frozenset()
    digest: bytes = b""

    @classmethod
    def of(cls, roots: Iterable[x509.Certificate], intermediates: Iterable[x509.Certificate] = (),
           strict_roots: Iterable[x509.Certificate] = ()) -> Trust:
        roots, intermediates, strict = list(roots), list(intermediates), frozenset(strict_roots)
        issuers: dict[x509.Name, list[x509.Certificate]] = {}
        # Roots first, so a path ends at a trusted root as soon as one signed it.
        for cert in [*roots, *intermediates]:
            issuers.setdefault(cert.subject, []).append(cert)
        digest = hashlib.sha256()
        for label, certs in ((b"roots", roots), (b"intermediates", intermediates), (b"strict", strict)):
            digest.update(label)
            for fingerprint in sorted(cert.fingerprint(hashes.SHA256()) for cert in certs):
                digest.update(fingerprint)
        return cls(roots=frozenset(roots), issuers_by_subject=issuers, strict_roots=strict, digest=digest.digest())


@dataclass(frozen=True)
class Revocation:
    """Revoked (issuer, serial) pairs, and until when each OCSP-confirmed good status is fresh."""

    revoked: set[tuple[str, int]] = field(default_factory=set)
    good_until: Mapping[tuple[str, int], datetime] = field(default_factory=dict)


@dataclass(frozen=True)
class Leaf:
    """The end certificate with what every verification reads from it, parsed once."""

    cert: x509.Certificate
    public_key: Any
    common_names: tuple[str, ...]
    serial_numbers: tuple[str, ...]


@dataclass(frozen=True)
class PathCert:
    """What a cached path keeps of each certificate: enough to re-check revocation."""

    subject: str
    issuer: str
    serial_number: int


@dataclass(frozen=True)
class ChainEntry:
    leaf: Leaf
    path: tuple[PathCert, ...]
    strict: bool
    valid_from: datetime
    valid_until: datetime


class ChainCache:
    """
    Remembers chains already verified, so a node attesting every few minutes pays for its chains
    once. The key is a digest of the presented PEMs and of the trust set, so a changed anchor set
    is a miss; revocation is re-checked against the caller's on every hit (a lookup per
    certificate), and an entry is served only while every certificate of its path is within its
    validity period. Only chains that passed every check are stored. Signatures over evidence,
    identity, nonce and measurements are checked on every call regardless. ``clear()`` drops
    everything, e.g. after an operator edits trust anchors.
    """

    def __init__(self, maxsize: int = 4096):
        self.maxsize = maxsize
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[bytes, ChainEntry] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def get(self, key: bytes, now: datetime) -> ChainEntry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and not entry.valid_from <= now <= entry.valid_until:
                del self._entries[key]
                entry = None
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key: bytes, entry: ChainEntry) -> None:
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)


def verified_chain(pems: list[str], *, trust: Trust, revocation: Revocation, now: datetime, label: str | None,
                   cache: ChainCache | None = None) -> tuple[Leaf | None, list[Reason]]:
    """The end certificate of ``pems`` (leaf first) and what is wrong with its chain; cached when it holds."""
    key = None
    if cache is not None:
        key = _cache_key(pems, trust.digest)
        entry = cache.get(key, now)
        if entry is not None:
            return entry.leaf, revocation_checks(entry.path, revocation, now, label, strict=entry.strict)
    certs, reasons = load_chain(pems, label)
    if not certs:
        return None, reasons
    leaf = _leaf(certs[0])
    if leaf is None:
        return None, [Reason(label, "malformed_certificate", "the end certificate's key cannot be read")]
    path, reasons = _build_path(certs[0], certs[1:], trust, label)
    ids = tuple(_path_cert(cert) for cert in path)
    strict = path[-1] in trust.strict_roots
    reasons += _path_checks(path, now, label)
    reasons += revocation_checks(ids, revocation, now, label, strict=strict)
    if key is not None and not reasons:
        cache.put(key, ChainEntry(leaf=leaf, path=ids, strict=strict,
                                  valid_from=max(cert.not_valid_before_utc for cert in path),
                                  valid_until=min(cert.not_valid_after_utc for cert in path)))
    return leaf, reasons


def load_chain(pems: list[str], label: str | None) -> tuple[list[x509.Certificate], list[Reason]]:
    certs = []
    for position, pem in enumerate(pems):
        try:
            cert = x509.load_pem_x509_certificate(pem.encode("ascii"))
            cert.extensions  # noqa: B018 -- parsed here so a malformed extension is reported, not raised later
        except (ValueError, UnicodeEncodeError) as error:
            return [], [Reason(label, "malformed_certificate", f"certificate {position} does not parse: {error}")]
        certs.append(cert)
    if not certs:
        return [], [Reason(label, "malformed_certificate", "no end certificate")]
    return certs, []


def revocation_checks(path: Iterable[PathCert], revocation: Revocation, now: datetime, label: str | None, *,
                      strict: bool) -> list[Reason]:
    path = list(path)
    reasons = [Reason(label, "revoked", f"{cert.subject} (serial {cert.serial_number:x} of {cert.issuer}) is revoked")
               for cert in path if (cert.issuer, cert.serial_number) in revocation.revoked]
    if strict and not reasons:
        # The root itself is the operator's trust decision; every certificate below needs a status.
        for cert in path[:-1]:
            fresh_until = revocation.good_until.get((cert.issuer, cert.serial_number))
            if fresh_until is None or fresh_until < now:
                state = "no imported OCSP status" if fresh_until is None else \
                    f"its OCSP status went stale at {fresh_until.isoformat()}"
                reasons.append(Reason(label, "revocation_unknown", f"{cert.subject} (serial {cert.serial_number:x}) "
                                                                   f"has {state}: import a fresh OCSP response"))
    return reasons


def _cache_key(pems: list[str], anchors_digest: bytes) -> bytes:
    digest = hashlib.sha256(anchors_digest)
    for pem in pems:
        digest.update(len(pem).to_bytes(4, "big"))
        digest.update(pem.encode("ascii", "replace"))
    return digest.digest()


def _leaf(cert: x509.Certificate) -> Leaf | None:
    try:
        public_key = cert.public_key()
    except (ValueError, UnsupportedAlgorithm):
        return None
    subject = cert.subject
    return Leaf(cert=cert, public_key=public_key,
                common_names=tuple(str(a.value) for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)),
                serial_numbers=tuple(str(a.value) for a in subject.get_attributes_for_oid(NameOID.SERIAL_NUMBER)))


def _path_cert(cert: x509.Certificate) -> PathCert:
    return PathCert(subject=cert.subject.rfc4514_string(), issuer=cert.issuer.rfc4514_string(),
                    serial_number=cert.serial_number)


def issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    """Whether ``issuer``'s key signed ``cert`` (and the names agree): the one test of a chain link."""
    try:
        cert.verify_directly_issued_by(issuer)
    except (InvalidSignature, ValueError, TypeError, UnsupportedAlgorithm):
        return False
    return True


def _build_path(leaf: x509.Certificate, presented: list[x509.Certificate], trust: Trust,
                label: str | None) -> tuple[list[x509.Certificate], list[Reason]]:
    """
    Walk from the end certificate up to a trusted root, each step to a certificate whose key
    signed the one below. Returns the path (partial when it breaks) and why it broke.
    """
    path = [leaf]
    current = leaf
    while current not in trust.roots:
        if len(path) > MAX_PATH:
            return path, [Reason(label, "chain_too_long", f"no trusted root within {MAX_PATH} certificates")]
        subject = current.subject.rfc4514_string()
        if current.issuer == current.subject:
            return path, [Reason(label, "untrusted_root", f"the chain ends at {subject}, self-signed and not trusted")]
        candidates = [cert for cert in trust.issuers_by_subject.get(current.issuer, []) if cert not in path]
        candidates += [cert for cert in presented if cert.subject == current.issuer and cert not in path]
        if not candidates:
            return path, [Reason(label, "untrusted_root", f"the chain ends at {subject}, whose issuer "
                                                           f"{current.issuer.rfc4514_string()} is not trusted")]
        issuer = next((cert for cert in candidates if issued_by(current, cert)), None)
        if issuer is None:
            return path, [Reason(label, "chain_signature", f"{subject} names {current.issuer.rfc4514_string()} "
                                                            "as issuer, but that certificate's key did not sign it")]
        path.append(issuer)
        current = issuer
    return path, []


def _path_checks(path: list[x509.Certificate], now: datetime, label: str | None) -> list[Reason]:
    reasons = []
    for cert in path:
        reasons += _validity_checks(cert, now, label)
    leaf_constraints = extension(path[0], x509.BasicConstraints)
    if leaf_constraints is not None and leaf_constraints.ca:
        reasons.append(Reason(label, "leaf_is_ca", "the end certificate is a CA certificate"))
    for depth, issuer in enumerate(path[1:], start=1):
        reasons += _issuer_checks(issuer, depth, label)
    return reasons


def _validity_checks(cert: x509.Certificate, now: datetime, label: str | None) -> list[Reason]:
    subject = cert.subject.rfc4514_string()
    if now > cert.not_valid_after_utc:
        return [Reason(label, "expired", f"{subject} expired at {cert.not_valid_after_utc.isoformat()}")]
    if now < cert.not_valid_before_utc:
        return [Reason(label, "not_yet_valid", f"{subject} is valid from {cert.not_valid_before_utc.isoformat()}")]
    return []


def _issuer_checks(issuer: x509.Certificate, depth: int, label: str | None) -> list[Reason]:
    """An issuer must be a CA allowed to sign certificates, with room for the CAs below it."""
    subject = issuer.subject.rfc4514_string()
    constraints = extension(issuer, x509.BasicConstraints)
    usage = extension(issuer, x509.KeyUsage)
    problems = []
    if constraints is None or not constraints.ca:
        problems.append("BasicConstraints CA is not true")
    if usage is None or not usage.key_cert_sign:
        problems.append("KeyUsage lacks keyCertSign")
    if problems:
        return [Reason(label, "not_a_ca", f"{subject} signed a certificate but is not a CA: {'; '.join(problems)}")]
    # depth 1 issued the leaf; the CAs between it and the leaf are depth - 1.
    if constraints.path_length is not None and depth - 1 > constraints.path_length:
        return [Reason(label, "path_length", f"{subject} allows {constraints.path_length} intermediate CAs "
                                             f"below it, the chain has {depth - 1}")]
    return []


def extension(cert: x509.Certificate, kind: type) -> Any:
    try:
        return cert.extensions.get_extension_for_class(kind).value
    except x509.ExtensionNotFound:
        return None
