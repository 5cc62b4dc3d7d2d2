"""
Device attestation through the database: challenges, verification of a node's evidence against
the operator's trust anchors, revocations and reference values (security.attestation, pure),
the verdict's outcome for the node or its GPUs, and the staff actions that register what the
verifier trusts. Signed receipts are in security.receipts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from cloud.choices import GPUState, NodeState
from cloud.models import GPU
from cloud.services import node_transition
from core.errors import Conflict, DomainError
from security import ocsp, rim
from security.attestation import ChainCache, NodeEvidence, NonceRecord, verify
from security.audit import audit_record
from security.chains import Revocation, Trust, verified_chain
from security.models import (
    AttestationNonce,
    AttestationReport,
    Incident,
    OcspStatus,
    ReferenceManifest,
    ReferenceMeasurement,
    RevokedCertificate,
    TrustAnchor,
)

log = logging.getLogger(__name__)
NONCE_BYTES = 32
# Verified chains, per process: a node report of 8 GPUs then costs 8 signature checks, not 24.
# Keyed by the trust anchors and revocations too, so a change to either is never served stale.
_CHAINS = ChainCache()
Status = AttestationReport.Status


#
# Challenge and verification
#


def attestation_challenge(*, node_id, reference: str) -> AttestationNonce:
    """
    A fresh 32-byte nonce for ``node_id``, single-use, valid MERIDIAN_ATTESTATION_NONCE_TTL; the
    same outstanding one for a repeated ``reference`` (a retried step asks again).
    """
    now = timezone.now()
    # Reused only while it leaves the agent time to answer: a nonce that expires in flight would fail a good node.
    outstanding = AttestationNonce.objects.filter(node_id=node_id, reference=reference, used_at__isnull=True,
                                                  expires_at__gt=now + settings.MERIDIAN_ATTESTATION_NONCE_TTL / 2
                                                  ).first()
    if outstanding is not None and reference:
        return outstanding
    return AttestationNonce.objects.create(value=secrets.token_hex(NONCE_BYTES), node_id=node_id, reference=reference,
                                           issued_at=now, expires_at=now + settings.MERIDIAN_ATTESTATION_NONCE_TTL)


@transaction.atomic
def attestation_submit(*, node, evidence: dict, nonce: str, gpu_uuids=None) -> AttestationReport:
    """
    Verify ``node``'s evidence answering ``nonce`` (spent whatever the verdict) and record the
    report. ``gpu_uuids``: only these GPUs are attested (a shared host's GPUs of one instance).
    """
    now = timezone.now()
    record = AttestationNonce.objects.select_for_update().filter(value=str(nonce)[:64], node_id=node.pk).first()
    if record is None:
        return _report(node, nonce, Status.FAIL, [{"gpu": None, "check": "nonce_unknown",
                                                   "detail": "The nonce was never issued to this node."}], evidence)
    challenge = NonceRecord(value=record.value, issued_at=record.issued_at, expires_at=record.expires_at,
                            used=record.used_at is not None)
    AttestationNonce.objects.filter(value=record.value).update(used_at=now)
    try:
        parsed = NodeEvidence.from_dict(evidence)
    except ValueError as exc:
        return _report(node, nonce, Status.FAIL, [{"gpu": None, "check": "malformed", "detail": str(exc)[:500]}],
                       evidence)
    gpus = node.gpus.select_related("model")
    if gpu_uuids is not None:
        gpus = gpus.filter(uuid__in=list(gpu_uuids))
    gpus = list(gpus)
    node_gpus = {gpu.uuid: (gpu.serial, gpu.model.slug) for gpu in gpus}
    anchors = _anchors()
    revoked, good_until = _revocation()
    verdict = verify(parsed, nonce=challenge, roots=anchors["device_roots"], intermediates=anchors["intermediates"],
                     revoked=revoked, good_until=good_until, strict_roots=anchors["strict"],
                     rim_roots=anchors["rim_roots"], rims=_rims(parsed),
                     identities={gpu.uuid: gpu.attested_identity for gpu in gpus if gpu.attested_identity},
                     references=_references(parsed), node_gpus=node_gpus, now=now,
                     max_age_s=int(settings.MERIDIAN_ATTESTATION_NONCE_TTL.total_seconds()), cache=_CHAINS)
    if verdict.status == Status.PASS:
        _pin_identities(gpus, verdict.gpus)
    reasons = [{"gpu": r.gpu, "check": r.check, "detail": r.detail} for r in verdict.reasons]
    return _report(node, nonce, verdict.status, reasons, evidence, gpus=verdict.gpus)


def _pin_identities(gpus, summaries) -> None:
    """A GPU's first passing device ID is kept: later evidence under its UUID must come from the same device."""
    stated = {summary["uuid"]: summary.get("identity") for summary in summaries}
    for gpu in gpus:
        if not gpu.attested_identity and stated.get(gpu.uuid):
            GPU.objects.filter(pk=gpu.pk, attested_identity="").update(attested_identity=stated[gpu.uuid][:64])


def _report(node, nonce, status, reasons, evidence, gpus=()) -> AttestationReport:
    digest = hashlib.sha384(json.dumps(evidence, sort_keys=True, default=str).encode()).hexdigest()
    return AttestationReport.objects.create(node_id=node.pk, nonce=str(nonce)[:64], status=status, reasons=reasons,
                                            gpus=list(gpus), evidence_sha384=digest)


def _anchors() -> dict[str, list]:
    """The active anchors: device roots, intermediates, RIM roots, and the roots that require OCSP status."""
    found: dict[str, list] = {"device_roots": [], "intermediates": [], "rim_roots": [], "strict": []}
    rows = TrustAnchor.objects.filter(is_active=True).values_list("kind", "purpose", "revocation_required",
                                                                  "certificate_pem")
    for kind, purpose, strict, pem in rows:
        cert = _certificate(pem)
        if kind != TrustAnchor.Kind.ROOT:
            found["intermediates"].append(cert)
            continue
        found["rim_roots" if purpose == TrustAnchor.Purpose.RIM else "device_roots"].append(cert)
        if strict:
            found["strict"].append(cert)
    return found


_PARSED: dict[str, x509.Certificate] = {}


def _certificate(pem: str) -> x509.Certificate:
    if pem not in _PARSED:
        _PARSED[pem] = x509.load_pem_x509_certificate(pem.encode())
    return _PARSED[pem]


def _revocation() -> tuple[set[tuple[str, int]], dict]:
    """Revoked (issuer, serial): the operator's and imported OCSP's; and until when each good status is fresh."""
    revoked = {(issuer, int(serial, 16)) for issuer, serial in
               RevokedCertificate.objects.values_list("issuer", "serial_number")}
    good_until = {}
    for issuer, serial, status, this_update, next_update in OcspStatus.objects.values_list(
            "issuer", "serial_number", "status", "this_update", "next_update"):
        if status == OcspStatus.Status.REVOKED:
            revoked.add((issuer, int(serial, 16)))
        elif status == OcspStatus.Status.GOOD:
            good_until[(issuer, int(serial, 16))] = next_update or this_update + settings.MERIDIAN_OCSP_MAX_AGE
    return revoked, good_until


def _rims(evidence: NodeEvidence) -> dict:
    """The RIM documents for the driver and VBIOS versions the evidence's NVIDIA reports state, in one query."""
    wanted = set()
    for gpu in evidence.gpus:
        report = getattr(gpu, "report", None)
        if report is not None:
            wanted |= {(rim.DRIVER, report.driver_version.lower()), (rim.VBIOS, report.vbios_version.lower())}
    if not wanted:
        return {}
    matching = Q()
    for kind, version in wanted:
        matching |= Q(kind=kind, version__iexact=version)
    rows = ReferenceManifest.objects.filter(matching).values_list("kind", "version", "document")
    return {(kind, version.lower()): document.encode() for kind, version, document in rows}


def _references(evidence: NodeEvidence) -> dict:
    """The reference values of every (model, VBIOS, driver) the evidence reports, in one query."""
    wanted = Q()
    for model, vbios, driver in {(g.gpu_model, g.vbios, g.driver) for g in evidence.gpus if hasattr(g, "vbios")}:
        wanted |= Q(gpu_model=model, vbios_version=vbios, driver_version=driver)
    return {(row.gpu_model, row.vbios_version, row.driver_version):
            {int(index): digest for index, digest in row.measurements.items()}
            for row in ReferenceMeasurement.objects.filter(wanted)} if wanted else {}


#
# Outcome
#


def attestation_outcome(*, node, report: AttestationReport, gpus=None) -> None:
    """
    Apply a verdict. A pass changes nothing (a held node comes back only through validation). A
    failure quarantines the bare-metal node -- or, on a shared host, only ``gpus`` (the GPUs of
    one instance: the other tenants' work goes on) -- and opens an incident; firmware with no
    reference values (or certificates without a fresh OCSP status) holds the node in
    ``reference_unavailable`` until staff import them, and so does a host whose GPUs have CC mode
    off (``not_capable``: nothing is wrong with it, but it cannot prove what it runs).
    """
    if report.status == Status.PASS:
        return
    summary = "; ".join(dict.fromkeys(f"{r['check']}: {r['detail']}" for r in report.reasons))[:450]
    if gpus is not None:
        GPU.objects.filter(pk__in=[g.pk for g in gpus]).exclude(state=GPUState.QUARANTINED).update(
            state=GPUState.QUARANTINED)
    else:
        target = NodeState.QUARANTINED if report.status == Status.FAIL else NodeState.REFERENCE_UNAVAILABLE
        node.refresh_from_db(fields=["state"])
        if node.state != target:
            try:
                node_transition(actor=None, node=node, target=target, reason=f"Attestation: {summary}")
            except Conflict:
                log.warning("Could not move %s to %s after attestation: %s", node.hostname, target, summary)
    kind = {Status.FAIL: "attestation_failed", Status.NOT_CAPABLE: "attestation_not_capable"}.get(
        report.status, "reference_unavailable")
    Incident.objects.create(kind=kind, node_id=node.pk, summary=f"{node.hostname}: {summary}"[:500],
                            evidence={"report": str(report.pk), "reasons": report.reasons,
                                      "gpus": [g.uuid for g in gpus] if gpus is not None else None})


def evidence_cc_mode(summaries: list[dict]) -> str:
    """The node's GPUs' CC mode as their verified evidence states it: on only when every GPU says on."""
    modes = {summary.get("cc_mode") or "off" for summary in summaries}
    return modes.pop() if len(modes) == 1 else "off"


#
# What the verifier trusts (staff)
#


@transaction.atomic
def trust_anchor_add(*, actor, name: str, certificate_pem: str, kind: str = TrustAnchor.Kind.ROOT,
                     purpose: str = TrustAnchor.Purpose.DEVICE, revocation_required: bool = False) -> TrustAnchor:
    """Trust a CA certificate (PEM) for device certificates or RIM signers; it must be a CA and not expired."""
    try:
        cert = x509.load_pem_x509_certificate(certificate_pem.encode())
    except ValueError:
        raise DomainError({"certificate_pem": ["Not a PEM X.509 certificate."]}, code="invalid_certificate") from None
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise DomainError({"certificate_pem": ["This certificate is not a CA (BasicConstraints CA=false)."]},
                          code="not_a_ca")
    if cert.not_valid_after_utc <= timezone.now():
        raise DomainError({"certificate_pem": ["This certificate has expired."]}, code="expired")
    fingerprint = cert.fingerprint(hashes.SHA256()).hex()
    anchor, _ = TrustAnchor.objects.update_or_create(
        fingerprint_sha256=fingerprint,
        defaults={"name": name, "kind": kind, "purpose": purpose, "revocation_required": revocation_required,
                  "certificate_pem": certificate_pem.strip() + "\n",
                  "subject": cert.subject.rfc4514_string()[:500], "not_after": cert.not_valid_after_utc,
                  "is_active": True})
    audit_record(actor=actor, action="attestation.trust_anchor_add", target=anchor,
                 after={"name": name, "kind": kind, "purpose": purpose, "revocation_required": revocation_required,
                        "subject": anchor.subject, "fingerprint": fingerprint})
    return anchor


@transaction.atomic
def certificate_revoke(*, actor, issuer: str, serial_number: str, reason: str = "") -> RevokedCertificate:
    """Revoke a certificate by issuer and serial (as a CRL lists it): every chain through it fails from now on."""
    try:
        serial = f"{int(str(serial_number), 16):x}"
    except ValueError:
        raise DomainError({"serial_number": ["A serial number is hex."]}, code="invalid") from None
    try:
        # The verifier compares issuers as cryptography writes them: spacing or escaping must not make it miss.
        issuer = x509.Name.from_rfc4514_string(issuer).rfc4514_string()
    except ValueError:
        raise DomainError({"issuer": ["Not a distinguished name (RFC 4514), like CN=GPU CA,O=Vendor."]},
                          code="invalid") from None
    revoked, _ = RevokedCertificate.objects.get_or_create(issuer=issuer, serial_number=serial,
                                                          defaults={"reason": reason[:200]})
    audit_record(actor=actor, action="attestation.revoke", target=revoked, after={"issuer": issuer, "serial": serial})
    return revoked


@transaction.atomic
def reference_register(*, actor, gpu_model: str, vbios_version: str, driver_version: str,
                       measurements: dict) -> ReferenceMeasurement:
    """
    Register the reference values of a GPU model's firmware version (from the vendor's RIM).
    Nodes held in ``reference_unavailable`` go through validation again to be attested with them.
    """
    clean = {}
    for index, digest in measurements.items():
        if not str(index).isdigit() or not isinstance(digest, str) or len(digest) != 96 or \
                any(c not in "0123456789abcdef" for c in digest.lower()):
            raise DomainError({"measurements": [f"Index {index}: a measurement is a SHA-384 hex digest "
                                                "(96 hex digits) under a numeric index."]}, code="invalid")
        clean[str(int(index))] = digest.lower()
    if not clean:
        raise DomainError({"measurements": ["Give at least one measurement."]}, code="invalid")
    reference, created = ReferenceMeasurement.objects.update_or_create(
        gpu_model=gpu_model, vbios_version=vbios_version, driver_version=driver_version,
        defaults={"measurements": clean, "registered_by_id": getattr(getattr(actor, "user", actor), "pk", None)})
    audit_record(actor=actor, action="attestation.reference_register", target=reference,
                 after={"gpu_model": gpu_model, "vbios": vbios_version, "driver": driver_version,
                        "indices": sorted(clean, key=int), "replaced": not created})
    return reference



@transaction.atomic
def rim_import(*, actor, document: bytes) -> ReferenceManifest:
    """
    Import a vendor's reference integrity manifest after its XML signature and signer chain
    verify against the RIM roots now; it replaces an earlier RIM for the same version. Nodes held
    in ``reference_unavailable`` go through validation again to be attested with it.
    """
    anchors = _anchors()
    revoked, good_until = _revocation()
    trust = Trust.of(anchors["rim_roots"], anchors["intermediates"],
                     [root for root in anchors["strict"] if root in anchors["rim_roots"]])
    manifest, reasons = rim.verify(document, trust=trust, revocation=Revocation(revoked=revoked, good_until=good_until),
                                   now=timezone.now())
    if manifest is None:
        raise DomainError({"document": [f"{r.check}: {r.detail}" for r in reasons]}, code="rim_invalid")
    row, created = ReferenceManifest.objects.update_or_create(
        kind=manifest.kind, version=manifest.version,
        defaults={"product": manifest.product[:64], "tag_id": manifest.tag_id[:128], "signer": manifest.signer[:500],
                  "document": document.decode("utf-8"), "measurements": manifest.to_dict()["measurements"],
                  "imported_by_id": getattr(getattr(actor, "user", actor), "pk", None)})
    audit_record(actor=actor, action="attestation.rim_import", target=row,
                 after={"kind": manifest.kind, "version": manifest.version, "signer": manifest.signer,
                        "indices": len(manifest.measurements), "replaced": not created})
    return row


@transaction.atomic
def ocsp_import(*, actor, der: bytes, issuers: list[x509.Certificate] = ()) -> list[OcspStatus]:
    """
    Record the statuses of an OCSP response fetched where the vendor's responder is reachable.
    The issuer is a trusted anchor, or a certificate given with the response that chains to one.
    A status older than the one held is ignored.
    """
    now = timezone.now()
    anchors = _anchors()
    known = anchors["device_roots"] + anchors["rim_roots"] + anchors["intermediates"]
    trust = Trust.of(anchors["device_roots"] + anchors["rim_roots"], anchors["intermediates"])
    for cert in issuers:
        pem = cert.public_bytes(serialization.Encoding.PEM).decode()
        _, reasons = verified_chain([pem], trust=trust, revocation=Revocation(), now=now, label=None)
        if reasons:
            raise DomainError({"issuer": [f"{cert.subject.rfc4514_string()}: {reasons[0].detail}"]},
                              code="untrusted_issuer")
        known.append(cert)
    try:
        statuses = ocsp.read(der, issuers=known, now=now)
    except ValueError as error:
        raise DomainError({"response": [str(error)]}, code="ocsp_invalid") from None
    rows = []
    for status in statuses:
        serial = f"{status.serial_number:x}"
        held = OcspStatus.objects.select_for_update().filter(issuer=status.issuer, serial_number=serial).first()
        if held is not None and held.this_update >= status.this_update:
            rows.append(held)
            continue
        row, _ = OcspStatus.objects.update_or_create(
            issuer=status.issuer, serial_number=serial,
            defaults={"status": status.status, "this_update": status.this_update, "next_update": status.next_update,
                      "revoked_at": status.revoked_at})
        audit_record(actor=actor, action="attestation.ocsp_import", target=row,
                     after={"issuer": status.issuer, "serial": serial, "status": status.status,
                            "next_update": status.next_update.isoformat() if status.next_update else None})
        rows.append(row)
    _CHAINS.clear()
    return rows
