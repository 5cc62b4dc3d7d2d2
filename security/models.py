"""Security records: the audit trail, incidents, device attestation and the keys of receipts."""

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from security.choices import CertificateStatus, TrustAnchorKind, TrustAnchorPurpose
from security.crypto import EncryptedTextField
from tenants.scoping import PlatformQuerySet, TenantScopedQuerySet


class AuditEvent(models.Model):
    """
    One state change made through a service: who, in which tenant, what, on which object, the
    values before and after, and the request it came from. Written in the same transaction as
    the change (security.audit.audit_record is the only writer) and never updated.

    Plain ids, not foreign keys: the trail outlives the objects and people it names.
    """

    # The sequence gives commit order to the sealer; the public id is a UUID, so a tenant reading
    # its own events learns nothing of how many others' there are.
    id = models.BigAutoField(primary_key=True)
    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    occurred_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor_id = models.UUIDField(null=True, blank=True)
    actor_email = models.CharField(max_length=254, blank=True)
    token_id = models.UUIDField(null=True, blank=True)
    tenant_id = models.UUIDField(null=True, blank=True, db_index=True)
    action = models.CharField(max_length=64, db_index=True)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    # Written by the sealer (security.audit_chain), never by the writer: the event's place in the
    # chain and the keyed hash over it and the previous link.
    seal_seq = models.BigIntegerField(null=True, blank=True, unique=True)
    chain_hash = models.CharField(max_length=64, blank=True)

    objects = TenantScopedQuerySet.as_manager()
    tenant_path = "tenant_id"
    team_path = None

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["id"], condition=models.Q(seal_seq__isnull=True), name="audit_unsealed_idx")]

    def __str__(self):
        return f"{self.action} {self.target_type}:{self.target_id} by {self.actor_email or 'system'}"


class Incident(models.Model):
    """
    Something found wrong with the platform that an operator must look at: what (``kind``), where
    (plain ids, like the audit trail: an incident outlives what it names), the evidence and when
    it was detected. The affected tenant, when there is one, may read its own.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=64, db_index=True)
    summary = models.CharField(max_length=500)
    evidence = models.JSONField(default=dict)
    tenant_id = models.UUIDField(null=True, blank=True, db_index=True)
    node_id = models.UUIDField(null=True, blank=True, db_index=True)
    fabric_id = models.UUIDField(null=True, blank=True)
    # A tenant's incident names the reservation it hit and how many of its GPUs were out:
    # what the SLA counts, from ``impact_started_at`` until ``restored_at`` (working hardware again).
    reservation_id = models.UUIDField(null=True, blank=True, db_index=True)
    gpu_ids = models.JSONField(default=list, blank=True)
    gpus_affected = models.PositiveIntegerField(default=0)
    impact_started_at = models.DateTimeField(null=True, blank=True)
    # Detection may be decided before the row is written (a watchdog's tick): callers pass it.
    detected_at = models.DateTimeField(default=timezone.now, db_index=True)
    restored_at = models.DateTimeField(null=True, blank=True)
    # Set by detection when the condition clears, or by staff (security.incident_response).
    resolved_at = models.DateTimeField(null=True, blank=True)

    # Staff's response (security.incident_response): people by foreign key, so the console and the
    # API name them; a removed user leaves the times and the audit trail.
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                        related_name="+")
    assignee = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="assigned_incidents")
    assigned_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    resolution_note = models.TextField(blank=True)

    # The paging outbox (security.incident_paging): every incident, however it was written (some
    # with bulk_create, which sends no signal), is picked up while ``notified_at`` is empty.
    notified_at = models.DateTimeField(null=True, blank=True)
    emailed_at = models.DateTimeField(null=True, blank=True)
    webhook_sent_at = models.DateTimeField(null=True, blank=True)
    notify_attempts = models.PositiveSmallIntegerField(default=0)
    notify_error = models.CharField(max_length=500, blank=True)
    # The next try after a failure (backoff), or the end of a sender's claim while it sends.
    notify_next_at = models.DateTimeField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()
    tenant_path = "tenant_id"
    team_path = None

    class Meta:
        ordering = ["-detected_at"]
        indexes = [
            models.Index(fields=["detected_at"], condition=models.Q(notified_at__isnull=True),
                         name="incident_unnotified_idx"),
            models.Index(fields=["-detected_at"], condition=models.Q(resolved_at__isnull=True),
                         name="incident_open_idx"),
        ]

    def __str__(self):
        return f"{self.kind}: {self.summary}"

    @property
    def time_to_detect_s(self) -> float | None:
        if self.impact_started_at is None:
            return None
        return max((self.detected_at - self.impact_started_at).total_seconds(), 0.0)

    @property
    def time_to_restore_s(self) -> float | None:
        """From detection until the tenant had working hardware again."""
        if self.restored_at is None:
            return None
        return max((self.restored_at - self.detected_at).total_seconds(), 0.0)


class IncidentNotice(models.Model):
    """
    A message to one staff member about an incident (it was assigned to them, or someone else
    acknowledged or resolved theirs), written with the change and sent by the paging round.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="notices")
    to = models.EmailField(max_length=254)
    subject = models.CharField(max_length=200)
    body = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)

    objects = PlatformQuerySet.as_manager()

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["created_at"], condition=models.Q(sent_at__isnull=True),
                                name="incident_notice_unsent_idx")]

    def __str__(self):
        return f"{self.subject} to {self.to}"


#
# Device attestation (security.attestation verifies; security.services records)
#


class TrustAnchor(models.Model):
    """
    A certificate authority the operator trusts, for GPU device certificates or for the signers of
    reference integrity manifests (never both: each purpose has its own roots). A root that
    requires revocation status makes every certificate below it need a fresh imported OCSP status.
    """

    Kind = TrustAnchorKind
    Purpose = TrustAnchorPurpose

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.ROOT)
    purpose = models.CharField(max_length=8, choices=Purpose.choices, default=Purpose.DEVICE)
    revocation_required = models.BooleanField(
        default=False, help_text="Certificates below this root need a fresh imported OCSP status to pass.")
    certificate_pem = models.TextField()
    fingerprint_sha256 = models.CharField(max_length=64, unique=True)
    subject = models.CharField(max_length=500)
    not_after = models.DateTimeField()
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = PlatformQuerySet.as_manager()

    class Meta:
        ordering = ["kind", "name"]

    def __str__(self):
        return f"{self.name} ({self.kind})"


class RevokedCertificate(models.Model):
    """A revoked certificate, as a CRL names it: its issuer and serial number (any certificate in a chain)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    issuer = models.CharField(max_length=500, help_text="The issuer's distinguished name (RFC 4514).")
    serial_number = models.CharField(max_length=64, help_text="Hex, lower case, no leading zeros.")
    reason = models.CharField(max_length=200, blank=True)
    revoked_at = models.DateTimeField(auto_now_add=True)

    objects = PlatformQuerySet.as_manager()

    class Meta:
        ordering = ["-revoked_at"]
        constraints = [models.UniqueConstraint(fields=["issuer", "serial_number"], name="revocation_unique")]

    def __str__(self):
        return f"{self.serial_number} of {self.issuer}"


class ReferenceMeasurement(models.Model):
    """
    The measurements a GPU of one model must report with one VBIOS and driver version, registered
    by staff (from the vendor's reference integrity manifest): index -> SHA-384 hex digest.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    gpu_model = models.CharField(max_length=64, help_text="The GPU model's slug.")
    vbios_version = models.CharField(max_length=64)
    driver_version = models.CharField(max_length=64)
    measurements = models.JSONField()
    registered_by_id = models.UUIDField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = PlatformQuerySet.as_manager()

    class Meta:
        ordering = ["gpu_model", "vbios_version", "driver_version"]
        constraints = [models.UniqueConstraint(fields=["gpu_model", "vbios_version", "driver_version"],
                                               name="reference_unique_per_version")]

    def __str__(self):
        return f"{self.gpu_model} VBIOS {self.vbios_version} driver {self.driver_version}"


class ReferenceManifest(models.Model):
    """
    A vendor's signed reference integrity manifest (an NVIDIA driver or VBIOS RIM), imported by
    staff after its signature and signer chain verified; kept whole, and verified again at each
    attestation (its signer may have expired or been revoked since).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=8)  # driver or vbios
    version = models.CharField(max_length=64)
    product = models.CharField(max_length=64, blank=True)
    tag_id = models.CharField(max_length=128, blank=True)
    signer = models.CharField(max_length=500)
    document = models.TextField()
    measurements = models.JSONField(default=dict)  # the active indices and their alternatives, for reading
    imported_by_id = models.UUIDField(null=True, blank=True)
    imported_at = models.DateTimeField(auto_now_add=True)

    objects = PlatformQuerySet.as_manager()

    class Meta:
        ordering = ["kind", "version"]
        constraints = [models.UniqueConstraint(fields=["kind", "version"], name="rim_unique_per_version")]

    def __str__(self):
        return f"{self.kind} RIM {self.version}"


class OcspStatus(models.Model):
    """A certificate's revocation status from an OCSP response an operator imported (the newest wins)."""

    Status = CertificateStatus

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    issuer = models.CharField(max_length=500, help_text="The issuer's distinguished name (RFC 4514).")
    serial_number = models.CharField(max_length=64, help_text="Hex, lower case, no leading zeros.")
    status = models.CharField(max_length=8, choices=Status.choices)
    this_update = models.DateTimeField()
    next_update = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    imported_at = models.DateTimeField(auto_now=True)

    objects = PlatformQuerySet.as_manager()

    class Meta:
        ordering = ["issuer", "serial_number"]
        constraints = [models.UniqueConstraint(fields=["issuer", "serial_number"], name="ocsp_status_unique")]

    def __str__(self):
        return f"{self.serial_number} of {self.issuer}: {self.status}"


class AttestationNonce(models.Model):
    """A challenge sent to one node: 32 random bytes, single-use and short-lived."""

    value = models.CharField(max_length=64, primary_key=True)
    node_id = models.UUIDField(db_index=True)
    # Who asked (an operation's step): a retried step gets its outstanding challenge back, not a new one.
    reference = models.CharField(max_length=200, blank=True, db_index=True)
    issued_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"{self.value[:12]}... for {self.node_id}"


class AttestationReport(models.Model):
    """One verification of a node's evidence: the verdict, one reason per failed check, what the GPUs said."""

    class Status(models.TextChoices):
        PASS = "pass", "Pass"
        FAIL = "fail", "Fail"
        REFERENCE_UNAVAILABLE = "reference_unavailable", "Reference values unavailable"
        NOT_CAPABLE = "not_capable", "Not capable (confidential computing off)"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    node_id = models.UUIDField(db_index=True)
    nonce = models.CharField(max_length=64)
    status = models.CharField(max_length=24, choices=Status.choices)
    reasons = models.JSONField(default=list)  # [{"gpu": uuid or null, "check": ..., "detail": ...}]
    gpus = models.JSONField(default=list)  # [{"uuid", "serial", "model", "vbios", "driver", "measurements"}]
    evidence_sha384 = models.CharField(max_length=96, blank=True)
    verified_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = PlatformQuerySet.as_manager()

    class Meta:
        ordering = ["-verified_at"]

    def __str__(self):
        return f"{self.node_id}: {self.status} at {self.verified_at:%Y-%m-%d %H:%M:%S}"


class ReceiptKey(models.Model):
    """
    A key Meridian signs attestation receipts with (ES384). The newest unretired one signs; every
    key not yet past its retirement stays in the published JWKS, so receipts outlive a rotation.
    """

    kid = models.CharField(max_length=64, primary_key=True)
    private_key_pem = EncryptedTextField()
    public_jwk = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    retired_at = models.DateTimeField(null=True, blank=True, help_text="No longer signs from then on.")
    unpublished_at = models.DateTimeField(null=True, blank=True, help_text="Out of the JWKS from then on.")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return self.kid


class AuditCheckpoint(models.Model):
    """
    A signed statement of the audit chain's head: after ``seq`` events the chain hash is
    ``head_hash``. Signed with Meridian's receipt key (ES384), so an edit, a deletion or a
    truncation of sealed events is detectable against it.
    """

    id = models.BigAutoField(primary_key=True)
    seq = models.BigIntegerField(unique=True)
    head_hash = models.CharField(max_length=64)
    signed_at = models.DateTimeField()
    kid = models.CharField(max_length=64)
    signature = models.TextField()

    objects = PlatformQuerySet.as_manager()

    class Meta:
        ordering = ["-seq"]

    def __str__(self):
        return f"audit checkpoint at {self.seq}"
