"""
Evidence from NVIDIA GPUs in confidential-computing mode, checked as NVIDIA's own verifier does,
with Meridian's code and ``cryptography``:

- the attestation report (security.spdm) is signed by the key of the first certificate of the
  GPU's chain (ECDSA P-384, SHA-384 over the request and the response up to the signature);
- the chain reaches an operator-trusted device root (NVIDIA's "Device Identity CA"), with
  revocation from the operator's revocations and imported OCSP responses (security.chains);
- the FWID the report states equals the one in the device certificate's DICE TcbInfo;
- the request carries the nonce Meridian issued (SPDM reports have no clock: the nonce is the
  freshness);
- every active measurement of the driver RIM and of the VBIOS RIM for the versions the report
  states is one of the RIM's alternatives, the RIMs verified (security.rim) against the RIM roots.

Wire format of one GPU (inside the node evidence's ``gpus``)::

    {"format": "nvidia-spdm", "uuid": str, "serial": str, "gpu_model": str,
     "cc_mode": "on" | "devtools" | "off", "report": "<hex>" | null, "certificate_chain": [PEM, ...]}

``uuid``, ``serial`` and ``gpu_model`` come from NVML and are not signed: the GPU's signed
identity is the device ID in its certificate (``NVIDIA:GH100:48B02D92494BADF4``), which Meridian
pins to the UUID the first time the GPU passes (``identities``); a GPU whose CC mode is off has
no report and is ``not_capable``, which is a state, not an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, utils

from security import rim, spdm
from security.chains import ChainCache, Leaf, Reason, Revocation, Trust, verified_chain
from security.evidence_fields import parse_chain, require_members, text

FORMAT = "nvidia-spdm"
CC_MODES = ("on", "devtools", "off")
MAX_FIELD = 64
_FIELDS = ("format", "uuid", "serial", "gpu_model", "cc_mode", "report", "certificate_chain")
_DEVICE_ID_OID = x509.ObjectIdentifier("1.3.6.1.4.1.412.274.1")
_TCB_INFO_OID = x509.ObjectIdentifier("2.23.133.5.4.1")
_SHA384_OID_DER = bytes.fromhex("0609608648016503040202")


@dataclass(frozen=True)
class NvidiaGPUEvidence:
    uuid: str
    serial: str
    gpu_model: str
    cc_mode: str
    report: spdm.Report | None
    report_hex: str | None
    certificate_chain: list[str]

    @property
    def model_claim(self) -> None:
        """None: NVML names the model in its own words, unsigned; the serial binds the GPU to the inventory."""
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "uuid": self.uuid, "serial": self.serial, "gpu_model": self.gpu_model,
                "cc_mode": self.cc_mode, "report": self.report_hex, "certificate_chain": list(self.certificate_chain)}

    @classmethod
    def from_dict(cls, data: Any) -> NvidiaGPUEvidence:
        require_members(data, _FIELDS, "GPU evidence")
        if data["format"] != FORMAT:
            raise ValueError(f"GPU evidence format must be {FORMAT!r}")
        uuid = text(data, "uuid", MAX_FIELD)
        where = f"GPU {uuid}"
        if data["cc_mode"] not in CC_MODES:
            raise ValueError(f"{where}: cc_mode must be one of {', '.join(CC_MODES)}")
        report = report_hex = None
        if data["report"] is not None:
            report_hex = data["report"]
            if not isinstance(report_hex, str) or len(report_hex) > 2 * spdm.MAX_REPORT:
                raise ValueError(f"{where}: report must be hex of at most {spdm.MAX_REPORT} bytes")
            try:
                report = spdm.parse(bytes.fromhex(report_hex))
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from None
        elif data["cc_mode"] != "off":
            raise ValueError(f"{where}: a GPU in CC mode {data['cc_mode']} must send its attestation report")
        chain = parse_chain(data["certificate_chain"], where) if report is not None else []
        return cls(uuid=uuid, serial=text(data, "serial", MAX_FIELD, where),
                   gpu_model=text(data, "gpu_model", MAX_FIELD, where), cc_mode=data["cc_mode"], report=report,
                   report_hex=report_hex, certificate_chain=chain)


@dataclass
class Context:
    """What one node's NVIDIA GPUs are checked against; RIMs verified once per call."""

    nonce: str
    trust: Trust
    rim_trust: Trust
    revocation: Revocation
    rims: Mapping[tuple[str, str], bytes]  # (kind, version lower-case) -> RIM XML
    identities: Mapping[str, str]  # GPU UUID -> the device ID it attested with before
    now: datetime
    cache: ChainCache | None = None
    _manifests: dict = field(default_factory=dict)  # each RIM verified once per call

    def manifest(self, kind: str, version: str) -> tuple[rim.Manifest | None, list[Reason]]:
        key = (kind, version.lower())
        if key not in self._manifests:
            document = self.rims.get(key)
            if document is None:
                self._manifests[key] = (None, [])
            else:
                manifest, reasons = rim.verify(document, trust=self.rim_trust, revocation=self.revocation,
                                               now=self.now, label=f"{kind} RIM {version}", cache=self.cache)
                if manifest is not None and manifest.version.lower() != version.lower():
                    manifest, reasons = None, [Reason(None, "rim_version_mismatch",
                                                      f"the RIM filed for {kind} {version} describes "
                                                      f"{manifest.version}")]
                self._manifests[key] = (manifest, reasons)
        return self._manifests[key]


def gpu_checks(gpu: NvidiaGPUEvidence, context: Context) -> list[Reason]:
    if gpu.report is None:
        return [Reason(gpu.uuid, "not_capable", "confidential computing is off on this GPU, so it makes no "
                                                "attestation report: turn CC mode on (nvidia-smi conf-compute "
                                                "-scc on, then reset the GPU) to attest it")]
    report = gpu.report
    leaf, reasons = verified_chain(gpu.certificate_chain, trust=context.trust, revocation=context.revocation,
                                   now=context.now, label=gpu.uuid, cache=context.cache)
    if leaf is not None:
        reasons += _signature_checks(gpu.uuid, report, leaf)
        reasons += _fwid_checks(gpu.uuid, report, leaf)
        reasons += _identity_checks(gpu.uuid, leaf, context.identities)
    if report.request_nonce.hex() != context.nonce:
        reasons.append(Reason(gpu.uuid, "nonce_mismatch", "the report answers another nonce than the one issued"))
    reasons += _measurement_checks(gpu.uuid, report, context)
    return reasons


def summary(gpu: NvidiaGPUEvidence) -> dict[str, Any]:
    """What receipts and reports show of a GPU: its identity and versions as its signed evidence states them."""
    report = gpu.report
    base = {"uuid": gpu.uuid, "serial": gpu.serial, "model": gpu.gpu_model, "evidence": FORMAT,
            "cc_mode": gpu.cc_mode}
    if report is None:
        return {**base, "vbios": "", "driver": "", "identity": "", "measurements": {}}
    return {**base, "vbios": report.vbios_version, "driver": report.driver_version, "board": report.board,
            "identity": _presented_id(gpu.certificate_chain),
            "measurements": {str(index - 1): value.hex() for index, value in sorted(report.measurements.items())}}


def _presented_id(chain: list[str]) -> str:
    """The device ID of the chain's first certificate; "" when it does not parse (a reason says so already)."""
    try:
        return device_id(x509.load_pem_x509_certificate(chain[0].encode())) if chain else ""
    except ValueError:
        return ""


def device_id(cert: x509.Certificate) -> str:
    """The device ID NVIDIA writes in a GPU certificate's subjectAltName (``NVIDIA:GH100:<hex>``)."""
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ""
    for name in names:
        if isinstance(name, x509.OtherName) and name.type_id == _DEVICE_ID_OID:
            value = _der_children(name.value)
            raw = value[0][1] if value else name.value
            return raw.decode("utf-8", "replace")[:MAX_FIELD]
    return ""


def _signature_checks(uuid: str, report: spdm.Report, leaf: Leaf) -> list[Reason]:
    key = leaf.public_key
    if not (isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP384R1)):
        return [Reason(uuid, "bad_signature", "the attestation key is not ECDSA P-384")]
    half = spdm.SIGNATURE_LENGTH // 2
    signature = utils.encode_dss_signature(int.from_bytes(report.signature[:half], "big"),
                                           int.from_bytes(report.signature[half:], "big"))
    try:
        key.verify(signature, report.signed, ec.ECDSA(hashes.SHA384()))
    except InvalidSignature:
        return [Reason(uuid, "bad_signature", "the report's signature does not verify with the attestation key")]
    return []


def _fwid_checks(uuid: str, report: spdm.Report, leaf: Leaf) -> list[Reason]:
    try:
        tcb_info = leaf.cert.extensions.get_extension_for_oid(_TCB_INFO_OID).value.value
    except x509.ExtensionNotFound:
        return [Reason(uuid, "fwid_mismatch", "the device certificate carries no FWID (DICE TcbInfo)")]
    fwids = _sha384_digests(tcb_info)
    if report.fwid not in fwids:
        return [Reason(uuid, "fwid_mismatch", f"the report's FWID {report.fwid.hex()[:16]}... is not the device "
                                              "certificate's")]
    return []


def _identity_checks(uuid: str, leaf: Leaf, identities: Mapping[str, str]) -> list[Reason]:
    known = identities.get(uuid)
    presented = device_id(leaf.cert)
    if known and presented != known:
        return [Reason(uuid, "identity_mismatch", f"this UUID attested as device {known}; the certificate is "
                                                  f"{presented or 'without a device ID'}")]
    return []


def _measurement_checks(uuid: str, report: spdm.Report, context: Context) -> list[Reason]:
    reasons = []
    golden: dict[int, tuple[str, tuple[str, ...]]] = {}
    for kind, version in ((rim.DRIVER, report.driver_version), (rim.VBIOS, report.vbios_version)):
        manifest, problems = context.manifest(kind, version)
        if problems:
            reasons += [Reason(uuid, problem.check, f"{kind} RIM {version}: {problem.detail}") for problem in problems]
            continue
        if manifest is None:
            reasons.append(Reason(uuid, "reference_missing", f"no {kind} RIM for {version}: import NVIDIA's RIM "
                                                             "for this version"))
            continue
        for index, values in manifest.measurements.items():
            if index in golden:
                reasons.append(Reason(uuid, "rim_conflict", f"measurement {index} is active in both RIMs"))
            golden[index] = (f"{kind} RIM {manifest.version}", values)
    if reasons:
        return reasons
    for index, (source, values) in sorted(golden.items()):
        got = report.measurements.get(index + 1)
        if got is None:
            reasons.append(Reason(uuid, "measurement_mismatch", f"measurement {index} is missing; {source} lists it"))
        elif got.hex() not in values:
            allowed = ", ".join(value[:16] + "..." for value in values)
            reasons.append(Reason(uuid, "measurement_mismatch",
                                  f"measurement {index} is {got.hex()[:16]}..., {source} allows {allowed}"))
    return reasons


def _sha384_digests(der: bytes) -> set[bytes]:
    """Every SHA-384 FWID in a DICE TcbInfo: a SEQUENCE of the SHA-384 OID and an OCTET STRING, at any depth."""
    found: set[bytes] = set()
    stack = [der]
    while stack:
        children = _der_children(stack.pop())
        for position, (tag, value, encoded) in enumerate(children):
            if encoded == _SHA384_OID_DER and position + 1 < len(children) and children[position + 1][0] == 0x04:
                found.add(children[position + 1][1])
            if tag & 0x20:  # constructed: look inside
                stack.append(value)
    return found


def _der_children(data: bytes) -> list[tuple[int, bytes, bytes]]:
    """The TLVs of ``data`` at one level: (tag, value, whole encoding); [] when it is not DER."""
    children, at = [], 0
    while at < len(data):
        if at + 2 > len(data):
            return []
        tag, length, start = data[at], data[at + 1], at + 2
        if length & 0x80:
            count = length & 0x7F
            if not 1 <= count <= 3 or start + count > len(data):
                return []
            length, start = int.from_bytes(data[start:start + count], "big"), start + count
        if start + length > len(data):
            return []
        children.append((tag, data[start:start + length], data[at:start + length]))
        at = start + length
    return children
