import base64
import binascii

from cryptography import x509
from rest_framework import serializers

from cloud.models import GPUModel
from security import rim
from security.models import (
    AttestationReport,
    AuditEvent,
    OcspStatus,
    ReferenceManifest,
    ReferenceMeasurement,
    RevokedCertificate,
    TrustAnchor,
)
from web.api.base import BoundedDictField, BoundedListField, StrictSerializer


class AuditEventSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)

    class Meta:
        model = AuditEvent
        fields = ["id", "occurred_at", "actor_id", "actor_email", "token_id", "tenant_id", "action", "target_type",
                  "target_id", "before", "after", "request_id"]
        read_only_fields = fields


class TrustAnchorSerializer(serializers.ModelSerializer):
    class Meta:
        model = TrustAnchor
        fields = ["id", "name", "kind", "purpose", "revocation_required", "subject", "fingerprint_sha256", "not_after",
                  "is_active", "created_at", "certificate_pem"]
        read_only_fields = fields


class TrustAnchorCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=200)
    kind = serializers.ChoiceField(choices=TrustAnchor.Kind.choices, default=TrustAnchor.Kind.ROOT)
    purpose = serializers.ChoiceField(choices=TrustAnchor.Purpose.choices, default=TrustAnchor.Purpose.DEVICE,
                                      help_text="device: GPU device certificates; rim: signers of reference manifests.")
    revocation_required = serializers.BooleanField(
        default=False, help_text="Certificates below this root pass only with a fresh imported OCSP status.")
    certificate_pem = serializers.CharField(max_length=16_384, trim_whitespace=False)


class ReferenceManifestSerializer(serializers.ModelSerializer):
    class Meta:
        model = ReferenceManifest
        fields = ["id", "kind", "version", "product", "tag_id", "signer", "measurements", "imported_by_id",
                  "imported_at"]
        read_only_fields = fields


class ReferenceManifestCreateSerializer(StrictSerializer):
    document = serializers.CharField(max_length=rim.MAX_RIM, trim_whitespace=False,
                                     help_text="The RIM (SWID tag XML) as the vendor signed it.")


class OcspStatusSerializer(serializers.ModelSerializer):
    class Meta:
        model = OcspStatus
        fields = ["id", "issuer", "serial_number", "status", "this_update", "next_update", "revoked_at",
                  "imported_at"]
        read_only_fields = fields


class OcspImportSerializer(StrictSerializer):
    response = serializers.CharField(max_length=90_000, help_text="The DER OCSP response, base64.")
    issuers = BoundedListField(
        child=serializers.CharField(max_length=16_384, trim_whitespace=False), required=False, default=list,
        max_length=4, help_text="PEM certificates of the issuers, when they are not trust anchors (they must chain "
                                "to one).")

    def validate_response(self, value):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise serializers.ValidationError("Not base64.") from None

    def validate_issuers(self, value):
        try:
            return [x509.load_pem_x509_certificate(pem.encode()) for pem in value]
        except ValueError:
            raise serializers.ValidationError("Each issuer is one PEM X.509 certificate.") from None


class RevocationSerializer(serializers.ModelSerializer):
    class Meta:
        model = RevokedCertificate
        fields = ["id", "issuer", "serial_number", "reason", "revoked_at"]
        read_only_fields = fields


class RevocationCreateSerializer(StrictSerializer):
    issuer = serializers.CharField(max_length=500, help_text="The issuer's DN as RFC 4514 writes it.")
    serial_number = serializers.RegexField(r"^(0x)?[0-9a-fA-F]{1,40}$", max_length=42, help_text="Hex.")
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class ReferenceMeasurementSerializer(serializers.ModelSerializer):
    class Meta:
        model = ReferenceMeasurement
        fields = ["id", "gpu_model", "vbios_version", "driver_version", "measurements", "registered_by_id",
                  "created_at"]
        read_only_fields = fields


class ReferenceMeasurementCreateSerializer(StrictSerializer):
    gpu_model = serializers.SlugRelatedField(slug_field="slug", queryset=GPUModel.objects.all())
    vbios_version = serializers.RegexField(r"^[0-9A-Za-z.\-_]{1,64}$", max_length=64)
    driver_version = serializers.RegexField(r"^[0-9A-Za-z.\-_]{1,64}$", max_length=64)
    measurements = BoundedDictField(child=serializers.CharField(max_length=96), allow_empty=False, max_length=64,
                                    error_messages={"max_length": "At most {max_length} measurements."},
                                    help_text='Index -> SHA-384 hex digest, e.g. {"0": "9f2c..."}.')


class AttestationReportSerializer(serializers.ModelSerializer):
    class Meta:
        model = AttestationReport
        fields = ["id", "node_id", "status", "reasons", "gpus", "nonce", "evidence_sha384", "verified_at"]
        read_only_fields = fields


class BrokenLinkSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    event = serializers.UUIDField(allow_null=True)
    reason = serializers.CharField()


class PublishedHeadSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    head_hash = serializers.CharField()
    signed_at = serializers.DateTimeField()
    source = serializers.CharField(help_text="The file and line it was read from.")


class MissingEventsSerializer(serializers.Serializer):
    first_seq = serializers.IntegerField()
    last_seq = serializers.IntegerField()
    count = serializers.IntegerField()


class AuditChainSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    events_checked = serializers.IntegerField()
    unsealed = serializers.IntegerField(help_text="Written since the last seal (sealed every few seconds).")
    checkpoints_checked = serializers.IntegerField()
    first_broken = BrokenLinkSerializer(allow_null=True)
    problems = serializers.ListField(child=serializers.CharField())
    published_head = PublishedHeadSerializer(
        allow_null=True, help_text="The newest signed head published outside the database that is the sealer's.")
    truncated = MissingEventsSerializer(
        allow_null=True, help_text="The sealed events found removed from the end of the chain (or replaced).")
    warnings = serializers.ListField(child=serializers.CharField())
