"""
Verification of a GPU node's attestation evidence, modelled on NVIDIA's flow: each GPU signs a
report of its firmware measurements with its device key, and sends the device certificate chain
that ties that key to a vendor root. Pure functions: no database, no clock (``now`` is an
argument), so the same code checks a live report, a stored one, and the tests' forgeries.

Wire format
-----------
``NodeEvidence.to_dict()`` / ``from_dict()``::

    {"node": "gpu-node-17.example", "nonce": "<64 hex>", "gpus": [GPU, ...]}         1 to 16 GPUs

    GPU = {"uuid": str, "serial": str, "gpu_model": str, "vbios": str, "driver": str,
           "measurements": {"0": "<96 hex>", ...}, "nonce": "<64 hex>", "generated_at": int,
           "certificate_chain": ["-----BEGIN CERTIFICATE-----...", ...], "signature": "<base64>",
           "cc_mode": "on" | "devtools" | "off"}                         cc_mode optional

A GPU with a ``format`` member is NVIDIA's evidence instead (security.nvidia: SPDM reports).

Strings are printable ASCII, hex is lower case, unknown members are refused (evidence is a
security claim: a field the verifier ignores is a field an attacker controls).

Canonical encoding (what each GPU signs)
----------------------------------------
``canonical_bytes(gpu)`` is the UTF-8 encoding of one JSON object with exactly these members:
``driver``, ``generated_at``, ``gpu_model``, ``measurements``, ``nonce``, ``serial``, ``uuid``,
``vbios``, and ``cc_mode`` when the evidence has it.

- ``generated_at`` is a JSON integer (unix seconds: no sign unless negative, no fraction, no
  exponent). Every other member is a string, except ``measurements``: an object mapping each
  measurement index, written in decimal without sign or leading zeros, to its SHA-384 digest
  as 96 lower-case hex characters.
- The members of both objects are ordered by key, comparing keys character by character, so
  measurement ``"10"`` comes before ``"2"`` (the order of RFC 8785).
- No whitespace anywhere: the separators are ``,`` and ``:``.
- Strings are escaped as JSON requires (``\\"``, ``\\\\``, control characters as ``\\n``,
  ``\\t``, ``\\b``, ``\\f``, ``\\r`` or ``\\u00XX``) and every character outside ASCII as
  ``\\uXXXX`` with lower-case hex (a surrogate pair above U+FFFF), so the bytes are pure ASCII.
  Evidence that passed ``from_dict`` holds printable ASCII only, so there only ``"`` and ``\\``
  can need escaping and the bytes are exactly the RFC 8785 (JCS) form of the object.

For example (digests shortened)::

    {"driver":"550.54.15","generated_at":1750000000,"gpu_model":"h100-sxm",
     "measurements":{"0":"9f..","1":"03..","10":"c1..","2":"7a.."},"nonce":"5e..",
     "serial":"1650124000001","uuid":"GPU-0b7d...","vbios":"96.00.89.00.01"}

(one line). The signature is ECDSA on P-384 with SHA-384 over those bytes, DER-encoded (the
ASN.1 SEQUENCE of r and s), then standard base64 with padding.

Checks
------
Every failure is its own ``Reason`` with one of these stable ``check`` codes:

    malformed_certificate  a PEM of the chain does not parse
    untrusted_root         the chain ends at a self-signed or unknown certificate, not a trusted root
    chain_signature        a certificate names an issuer whose key did not sign it
    chain_too_long         more than MAX_PATH certificates before a trusted root
    not_a_ca               an issuer in the path lacks BasicConstraints CA=True or keyCertSign
    path_length            an issuer's pathLenConstraint is exceeded
    leaf_is_ca             the device certificate is itself a CA
    expired, not_yet_valid a certificate of the path is outside its validity period at ``now``
    revoked                a certificate of the path is revoked
    bad_signature          the device key is not ECDSA P-384, or the evidence signature fails
    identity_mismatch      the device certificate is not this GPU's (CN = uuid, serialNumber = serial)
    nonce_mismatch         the evidence does not carry the nonce issued for this attestation
    nonce_replayed         the nonce was used before
    nonce_expired          the nonce expired before ``now``
    stale                  generated before the challenge, in the future, or older than max_age_s
    foreign_gpu            a GPU the database does not give this node (or with another serial/model)
    gpu_missing            a GPU of this node sent no evidence
    duplicate_gpu          the same GPU (uuid or serial) twice
    measurement_mismatch   a measurement differs from the reference, or is missing, or is extra
    reference_missing      no reference values for the GPU's (model, VBIOS, driver)

The status is ``pass`` with no reasons, ``reference_unavailable`` when every reason is
``reference_missing`` (the node may be fine; staff must register the version), else ``fail``.

Chains are built from the presented certificates and the operator-trusted intermediates and must
end at one of the trusted roots; every link is checked by signature, never by name alone.
Operator-trusted intermediates help build a path when a node omits them: they are not trust
anchors of their own. Revocations name a certificate by its issuer, as
``cryptography``'s ``Name.rfc4514_string()`` writes it, and its serial number.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from security import nvidia
from security.chains import ChainCache, Leaf, Reason, Revocation, Trust, verified_chain
from security.evidence_fields import parse_chain, require_members, text

MAX_GPUS = 16
MAX_FIELD = 64  # uuid, serial, model, VBIOS and driver: the database columns' length
MAX_NODE = 253  # a DNS name
MAX_MEASUREMENTS = 64
MAX_INDEX = 65_535
MAX_SIGNATURE = 256  # a DER P-384 signature is at most 104 bytes, 140 in base64
CLOCK_SKEW_S = 5

PASS = "pass"
FAIL = "fail"
REFERENCE_UNAVAILABLE = "reference_unavailable"
NOT_CAPABLE = "not_capable"
# Reasons that say the verifier lacks what it needs (a reference, a revocation status), not that the device is wrong.
_UNAVAILABLE = frozenset({"reference_missing", "revocation_unknown"})

__all__ = ["ChainCache", "GPUEvidence", "NodeEvidence", "NonceRecord", "Reason", "Verdict", "canonical_bytes",
           "verify"]

_HEX_NONCE = re.compile(r"[0-9a-f]{64}")
_HEX_DIGEST = re.compile(r"[0-9a-f]{96}")
_INDEX = re.compile(r"0|[1-9][0-9]{0,4}")
_GPU_FIELDS = ("uuid", "serial", "gpu_model", "vbios", "driver", "measurements", "nonce", "generated_at",
               "certificate_chain", "signature")
_NODE_FIELDS = ("node", "nonce", "gpus")


#
# Evidence
#


@dataclass(frozen=True)
class GPUEvidence:
    """What one GPU reports, signed by its device key; the chain's first certificate is that key's."""

    uuid: str
    serial: str
    gpu_model: str
    vbios: str
    driver: str
    measurements: dict[int, str]
    nonce: str
    generated_at: int
    certificate_chain: list[str]
    signature: str
    cc_mode: str | None = None  # optional: "on", "devtools" or "off"; signed when present

    @property
    def model_claim(self) -> str:
        """The model slug the evidence signs, which must be the inventory's."""
        return self.gpu_model

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "serial": self.serial, "gpu_model": self.gpu_model, "vbios": self.vbios,
                "driver": self.driver, "measurements": _measurements_json(self.measurements), "nonce": self.nonce,
                "generated_at": self.generated_at, "certificate_chain": list(self.certificate_chain),
                "signature": self.signature, **({"cc_mode": self.cc_mode} if self.cc_mode is not None else {})}

    @classmethod
    def from_dict(cls, data: Any) -> GPUEvidence:
        """Parse one GPU's evidence, refusing anything malformed with a ValueError that says what."""
        optional = ("cc_mode",) if isinstance(data, dict) and "cc_mode" in data else ()
        require_members(data, _GPU_FIELDS + optional, "GPU evidence")
        uuid = text(data, "uuid", MAX_FIELD)
        where = f"GPU {uuid}"
        return cls(
            uuid=uuid,
            serial=text(data, "serial", MAX_FIELD, where),
            gpu_model=text(data, "gpu_model", MAX_FIELD, where),
            vbios=text(data, "vbios", MAX_FIELD, where),
            driver=text(data, "driver", MAX_FIELD, where),
            measurements=_parse_measurements(data["measurements"], where),
            nonce=_nonce(data["nonce"], where),
            generated_at=_timestamp(data["generated_at"], where),
            certificate_chain=parse_chain(data["certificate_chain"], where),
            signature=_parse_signature(data["signature"], where),
            cc_mode=_cc_mode(data["cc_mode"], where) if optional else None,
        )


@dataclass(frozen=True)
class NodeEvidence:
    """One node's answer to a challenge: the nonce it was sent and every GPU's evidence."""

    node: str
    nonce: str
    gpus: list[GPUEvidence | nvidia.NvidiaGPUEvidence]

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "nonce": self.nonce, "gpus": [gpu.to_dict() for gpu in self.gpus]}

    @classmethod
    def from_dict(cls, data: Any) -> NodeEvidence:
        """Parse a node's evidence (decoded JSON); ValueError says what is wrong, and where."""
        require_members(data, _NODE_FIELDS, "node evidence")
        gpus = data["gpus"]
        if not isinstance(gpus, list):
            raise ValueError("gpus must be a list")
        if not 1 <= len(gpus) <= MAX_GPUS:
            raise ValueError(f"gpus must hold 1 to {MAX_GPUS} GPUs, not {len(gpus)}")
        return cls(node=text(data, "node", MAX_NODE), nonce=_nonce(data["nonce"], "node evidence"),
                   gpus=[_gpu_from_dict(gpu) for gpu in gpus])


def _gpu_from_dict(data: Any) -> GPUEvidence | nvidia.NvidiaGPUEvidence:
    """NVIDIA's format says so (``format``); the simulated fleet's signed JSON has no such member."""
    if isinstance(data, dict) and "format" in data:
        return nvidia.NvidiaGPUEvidence.from_dict(data)
    return GPUEvidence.from_dict(data)


def canonical_bytes(gpu: GPUEvidence) -> bytes:
    """The exact bytes a GPU signs; the module docstring specifies them for agents in other languages."""
    document = {
        **({"cc_mode": gpu.cc_mode} if gpu.cc_mode is not None else {}),
        "driver": gpu.driver,
        "generated_at": int(gpu.generated_at),
        "gpu_model": gpu.gpu_model,
        "measurements": _measurements_json(gpu.measurements),
        "nonce": gpu.nonce,
        "serial": gpu.serial,
        "uuid": gpu.uuid,
        "vbios": gpu.vbios,
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("utf-8")


def _measurements_json(measurements: Mapping[int, str]) -> dict[str, str]:
    """Index -> digest with decimal-string keys, in numeric order (canonical_bytes re-sorts as text)."""
    return {str(index): measurements[index] for index in sorted(measurements, key=int)}


def _nonce(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _HEX_NONCE.fullmatch(value):
        raise ValueError(f"{where}: nonce must be 64 lower-case hex characters")
    return value


def _cc_mode(value: Any, where: str) -> str:
    if value not in nvidia.CC_MODES:
        raise ValueError(f"{where}: cc_mode must be one of {', '.join(nvidia.CC_MODES)}")
    return value


def _timestamp(value: Any, where: str) -> int:
    # bool is an int in Python and a float is not exact: neither belongs in signed evidence.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: generated_at must be an integer (unix seconds)")
    if not 0 <= value < 2**63:
        raise ValueError(f"{where}: generated_at is out of range")
    return value


def _parse_measurements(value: Any, where: str) -> dict[int, str]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: measurements must be an object")
    if not 1 <= len(value) <= MAX_MEASUREMENTS:
        raise ValueError(f"{where}: measurements must hold 1 to {MAX_MEASUREMENTS} entries")
    parsed = {}
    for key, digest in value.items():
        index = _index(key, where)
        if not isinstance(digest, str) or not _HEX_DIGEST.fullmatch(digest):
            raise ValueError(f"{where}: measurement {key} must be a SHA-384 digest, 96 lower-case hex characters")
        if index in parsed:
            raise ValueError(f"{where}: measurement {index} appears twice")
        parsed[index] = digest
    return parsed


def _index(key: Any, where: str) -> int:
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)
    if not isinstance(key, str) or not _INDEX.fullmatch(key) or int(key) > MAX_INDEX:
        raise ValueError(f"{where}: measurement index {key!r} must be a decimal number from 0 to {MAX_INDEX}")
    return int(key)


def _parse_signature(value: Any, where: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_SIGNATURE:
        raise ValueError(f"{where}: signature must be a base64 string of at most {MAX_SIGNATURE} characters")
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: signature is not valid base64") from None
    return value


#
# Verdict
#


@dataclass(frozen=True)
class Verdict:
    """The outcome, every reason for it, and what each GPU reported (for receipts and reports)."""

    status: str
    reasons: list[Reason]
    gpus: list[dict[str, Any]]

    @property
    def checks(self) -> frozenset[str]:
        return frozenset(reason.check for reason in self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reasons": [reason.to_dict() for reason in self.reasons], "gpus": self.gpus}


@dataclass(frozen=True)
class NonceRecord:
    """The challenge as the database holds it: the value sent, its lifetime, and whether it was spent."""

    value: str
    issued_at: datetime
    expires_at: datetime
    used: bool


#
# Verification
#


@dataclass
class _Context:
    """Everything one verify() call checks against, prepared once for all the node's GPUs."""

    nonce: NonceRecord
    trust: Trust
    revocation: Revocation
    references: Mapping[tuple[str, str, str], Mapping[int, str]]
    now: datetime
    max_age_s: int
    cache: ChainCache | None
    nvidia: nvidia.Context
    normalised_references: dict[tuple[str, str, str], dict[int, str] | None] = field(default_factory=dict)


def verify(
    evidence: NodeEvidence,
    *,
    nonce: NonceRecord,
    roots: list[x509.Certificate],
    intermediates: Iterable[x509.Certificate] = (),
    revoked: set[tuple[str, int]],
    references: Mapping[tuple[str, str, str], Mapping[int, str]],
    node_gpus: Mapping[str, tuple[str, str]],
    now: datetime,
    max_age_s: int = 300,
    cache: ChainCache | None = None,
    strict_roots: Iterable[x509.Certificate] = (),
    good_until: Mapping[tuple[str, int], datetime] | None = None,
    rim_roots: Iterable[x509.Certificate] = (),
    rims: Mapping[tuple[str, str], bytes] | None = None,
    identities: Mapping[str, str] | None = None,
) -> Verdict:
    """
    Check a node's evidence against the challenge, the trust anchors, the revocations, the
    reference measurements and the GPUs the database says the node owns. Every check runs, so a
    verdict lists all that is wrong, not just the first thing.

    NVIDIA GPUs (security.nvidia) are checked against ``rims`` (RIM XML by kind and version,
    verified against ``rim_roots``) and ``identities`` (the device ID each UUID attested with).
    Certificates below a root in ``strict_roots`` need a fresh OCSP status in ``good_until``.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    strict_roots = list(strict_roots)
    trust = Trust.of(roots, intermediates, strict_roots)
    revocation = Revocation(revoked=revoked, good_until=good_until or {})
    rim_roots = list(rim_roots)
    rim_trust = Trust.of(rim_roots, (), [root for root in rim_roots if root in strict_roots])
    context = _Context(nonce=nonce, trust=trust, revocation=revocation, references=references, now=now,
                       max_age_s=max_age_s, cache=cache,
                       nvidia=nvidia.Context(nonce=nonce.value, trust=trust, rim_trust=rim_trust, revocation=revocation,
                                             rims=rims or {}, identities=identities or {}, now=now, cache=cache))
    reasons = _nonce_checks(evidence, nonce, now) + _membership_checks(evidence, node_gpus)
    for gpu in evidence.gpus:
        reasons += _gpu_checks(gpu, context)
    return Verdict(status=_status(reasons), reasons=reasons, gpus=[_summary(gpu) for gpu in evidence.gpus])


def _status(reasons: list[Reason]) -> str:
    if not reasons:
        return PASS
    checks = {reason.check for reason in reasons}
    if checks <= _UNAVAILABLE:
        return REFERENCE_UNAVAILABLE
    if checks == {"not_capable"}:
        return NOT_CAPABLE
    return FAIL


def _summary(gpu: GPUEvidence | nvidia.NvidiaGPUEvidence) -> dict[str, Any]:
    if isinstance(gpu, nvidia.NvidiaGPUEvidence):
        return nvidia.summary(gpu)
    return {"uuid": gpu.uuid, "serial": gpu.serial, "model": gpu.gpu_model, "vbios": gpu.vbios,
            "driver": gpu.driver, "measurements": _measurements_json(gpu.measurements),
            **({"cc_mode": gpu.cc_mode} if gpu.cc_mode is not None else {})}


def _nonce_checks(evidence: NodeEvidence, nonce: NonceRecord, now: datetime) -> list[Reason]:
    reasons = []
    if evidence.nonce != nonce.value:
        reasons.append(Reason(None, "nonce_mismatch", "the evidence answers another challenge"))
    if nonce.used:
        reasons.append(Reason(None, "nonce_replayed", "this challenge was answered before"))
    if now > nonce.expires_at:
        reasons.append(Reason(None, "nonce_expired", f"the challenge expired at {nonce.expires_at.isoformat()}"))
    return reasons


def _membership_checks(evidence: NodeEvidence, node_gpus: Mapping[str, tuple[str, str]]) -> list[Reason]:
    """The evidence covers exactly the node's GPUs, each once, each as the database knows it."""
    reasons = []
    seen_uuids: set[str] = set()
    seen_serials: set[str] = set()
    for gpu in evidence.gpus:
        if gpu.uuid in seen_uuids or gpu.serial in seen_serials:
            reasons.append(Reason(gpu.uuid, "duplicate_gpu", f"GPU {gpu.uuid} (serial {gpu.serial}) reported twice"))
        seen_uuids.add(gpu.uuid)
        seen_serials.add(gpu.serial)
        owned = node_gpus.get(gpu.uuid)
        if owned is None:
            reasons.append(Reason(gpu.uuid, "foreign_gpu", "this GPU is not registered to this node"))
        elif owned[0] != gpu.serial or gpu.model_claim not in (None, owned[1]):
            reasons.append(Reason(gpu.uuid, "foreign_gpu", f"registered as serial {owned[0]}, model {owned[1]}; "
                                                           f"reported serial {gpu.serial}, model {gpu.gpu_model}"))
    for uuid in node_gpus:
        if uuid not in seen_uuids:
            reasons.append(Reason(uuid, "gpu_missing", "a GPU of this node sent no evidence"))
    return reasons


def _gpu_checks(gpu: GPUEvidence | nvidia.NvidiaGPUEvidence, context: _Context) -> list[Reason]:
    if isinstance(gpu, nvidia.NvidiaGPUEvidence):
        return nvidia.gpu_checks(gpu, context.nvidia)
    leaf, reasons = verified_chain(gpu.certificate_chain, trust=context.trust, revocation=context.revocation,
                                   now=context.now, label=gpu.uuid, cache=context.cache)
    if leaf is not None:
        reasons += _identity_checks(gpu, leaf)
        reasons += _signature_checks(gpu, leaf)
    reasons += _freshness_checks(gpu, context)
    reasons += _measurement_checks(gpu, context)
    return reasons


def _freshness_checks(gpu: GPUEvidence, context: _Context) -> list[Reason]:
    reasons = []
    if gpu.nonce != context.nonce.value:
        reasons.append(Reason(gpu.uuid, "nonce_mismatch", "this GPU's evidence carries another nonce"))
    issued = context.nonce.issued_at.timestamp()
    now = context.now.timestamp()
    generated = gpu.generated_at
    if generated < issued - CLOCK_SKEW_S:
        reasons.append(Reason(gpu.uuid, "stale", "generated before the challenge was issued"))
    elif generated > now + CLOCK_SKEW_S:
        reasons.append(Reason(gpu.uuid, "stale", f"generated {generated - now:.0f} s in the future"))
    elif now - generated > context.max_age_s:
        reasons.append(Reason(gpu.uuid, "stale", f"generated {now - generated:.0f} s ago, "
                                                 f"more than {context.max_age_s} s"))
    return reasons


def _measurement_checks(gpu: GPUEvidence, context: _Context) -> list[Reason]:
    version = (gpu.gpu_model, gpu.vbios, gpu.driver)
    reference = _reference(version, context)
    if reference is None:
        return [Reason(gpu.uuid, "reference_missing",
                       f"no reference measurements for {gpu.gpu_model} VBIOS {gpu.vbios} driver {gpu.driver}")]
    reasons = []
    reported = {int(index): digest for index, digest in gpu.measurements.items()}
    for index in sorted(reference.keys() | reported.keys()):
        expected, got = reference.get(index), reported.get(index)
        if expected == got:
            continue
        if got is None:
            detail = f"measurement {index} is missing"
        elif expected is None:
            detail = f"measurement {index} is not in the reference"
        else:
            detail = f"measurement {index} is {got[:16]}..., the reference is {expected[:16]}..."
        reasons.append(Reason(gpu.uuid, "measurement_mismatch", detail))
    return reasons


def _reference(version: tuple[str, str, str], context: _Context) -> dict[int, str] | None:
    """The reference with int keys and lower-case digests (the database stores JSON, string keys)."""
    if version not in context.normalised_references:
        raw = context.references.get(version)
        context.normalised_references[version] = (
            None if raw is None else {int(index): str(digest).lower() for index, digest in raw.items()})
    return context.normalised_references[version]


def _identity_checks(gpu: GPUEvidence, leaf: Leaf) -> list[Reason]:
    if leaf.common_names == (gpu.uuid,) and leaf.serial_numbers == (gpu.serial,):
        return []
    return [Reason(gpu.uuid, "identity_mismatch",
                   f"the device certificate is for CN={','.join(leaf.common_names) or '-'} "
                   f"serialNumber={','.join(leaf.serial_numbers) or '-'}, "
                   f"the evidence for {gpu.uuid} serial {gpu.serial}")]


def _signature_checks(gpu: GPUEvidence, leaf: Leaf) -> list[Reason]:
    key = leaf.public_key
    if not (isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP384R1)):
        return [Reason(gpu.uuid, "bad_signature", "the device key is not ECDSA P-384")]
    try:
        signature = base64.b64decode(gpu.signature, validate=True)
        key.verify(signature, canonical_bytes(gpu), ec.ECDSA(hashes.SHA384()))
    except (binascii.Error, ValueError):
        return [Reason(gpu.uuid, "bad_signature", "the signature is not valid base64")]
    except InvalidSignature:
        return [Reason(gpu.uuid, "bad_signature", "the evidence signature does not verify with the device key")]
    return []
