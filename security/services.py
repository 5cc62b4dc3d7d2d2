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
from cryptography.hazmat.primitives import hashes
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from cloud.choices import GPUState, NodeState
from cloud.models import GPU
from cloud.services import node_transition
from core.errors import Conflict, DomainError
from security.attestation import ChainCache, NodeEvidence, NonceRecord, verify
from security.audit import audit_record
from security.models import (
    AttestationNonce,
    AttestationReport,
    Incident,
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
    node_gpus = {gpu.uuid: (gpu.serial, gpu.model.slug) for gpu in gpus}
    roots, intermediates = _anchors()
    verdict = verify(parsed, nonce=challenge, roots=roots, intermediates=intermediates, revoked=_revoked(),
                     references=_references(parsed), node_gpus=node_gpus, now=now,
                     max_age_s=int(settings.MERIDIAN_ATTESTATION_NONCE_TTL.total_seconds()), cache=_CHAINS)
    reasons = [{"gpu": r.gpu, "check": r.check, "detail": r.detail} for r in verdict.reasons]
    return _report(node, nonce, verdict.status, reasons, evidence, gpus=verdict.gpus)


def _report(node, nonce, status, reasons, evidence, gpus=()) -> AttestationReport:
    digest = hashlib.sha384(json.dumps(evidence, sort_keys=True, default=str).encode()).hexdigest()
    return AttestationReport.objects.create(node_id=node.pk, nonce=str(nonce)[:64], status=status, reasons=reasons,
                                            gpus=list(gpus), evidence_sha384=digest)


def _anchors() -> tuple[list, list]:
    roots, intermediates = [], []
    for kind, pem in TrustAnchor.objects.filter(is_active=True).values_list("kind", "certificate_pem"):
        cert = _certificate(pem)
        (roots if kind == TrustAnchor.Kind.ROOT else intermediates).append(cert)
    return roots, intermediates


_PARSED: dict[str, x509.Certificate] = {}


def _certificate(pem: str) -> x509.Certificate:
    if pem not in _PARSED:
        _PARSED[pem] = x509.load_pem_x509_certificate(pem.encode())
    return _PARSED[pem]


def _revoked() -> set[tuple[str, int]]:
    return {(issuer, int(serial, 16)) for issuer, serial in
            RevokedCertificate.objects.values_list("issuer", "serial_number")}


def _references(evidence: NodeEvidence) -> dict:
    """The reference values of every (model, VBIOS, driver) the evidence reports, in one query."""
    wanted = Q()
    for model, vbios, driver in {(g.gpu_model, g.vbios, g.driver) for g in evidence.gpus}:
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
    reference values holds the node in ``reference_unavailable`` until staff register them.
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
    kind = "attestation_failed" if report.status == Status.FAIL else "reference_unavailable"
    Incident.objects.create(kind=kind, node_id=node.pk, summary=f"{node.hostname}: {summary}"[:500],
                            evidence={"report": str(report.pk), "reasons": report.reasons,
                                      "gpus": [g.uuid for g in gpus] if gpus is not None else None})


#
# What the verifier trusts (staff)
#


@transaction.atomic
def trust_anchor_add(*, actor, name: str, certificate_pem: str, kind: str = TrustAnchor.Kind.ROOT) -> TrustAnchor:
    """Trust a CA certificate (PEM) for device certificates; it must be a CA and not expired."""
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
        defaults={"name": name, "kind": kind, "certificate_pem": certificate_pem.strip() + "\n",
                  "subject": cert.subject.rfc4514_string()[:500], "not_after": cert.not_valid_after_utc,
                  "is_active": True})
    audit_record(actor=actor, action="attestation.trust_anchor_add", target=anchor,
                 after={"name": name, "kind": kind, "subject": anchor.subject, "fingerprint": fingerprint})
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

