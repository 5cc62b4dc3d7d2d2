"""The audit trail (tenant admins see their tenant's events, staff see all) and what attestation trusts (staff)."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from security import services
from security.api import serializers as s
from security.api.serializers import AuditEventSerializer
from security.models import (
    AttestationReport,
    AuditEvent,
    OcspStatus,
    ReferenceManifest,
    ReferenceMeasurement,
    RevokedCertificate,
    TrustAnchor,
)
from tenants.permissions import RolePolicy
from web.api.base import PlatformViewSet, PrincipalAPIView, TenantScopedViewSet


class AuditEventViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    policy = "audit-events"
    queryset = AuditEvent.objects.all()
    serializer_class = AuditEventSerializer
    filterset_fields = ["action", "target_type", "target_id", "actor_id", "request_id"]
    ordering_fields = ["occurred_at"]
    ordering = ["-occurred_at", "-id"]
    lookup_field = "public_id"
    lookup_url_kwarg = "pk"


class AuditChainView(PrincipalAPIView):
    """Staff: verify the audit chain and its signed checkpoints; the first broken link is named."""

    policy = "audit-chain"
    permission_classes = [IsAuthenticated, RolePolicy]

    @extend_schema(responses=s.AuditChainSerializer)
    def get(self, request):
        from security.audit_chain import audit_verify

        return Response(s.AuditChainSerializer(audit_verify().as_dict()).data)


class StaffRecordViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, PlatformViewSet):
    """Staff records: list, retrieve, and a create validated by ``create_serializer_class`` and made by
    ``perform_service`` (a service call), answered 201."""

    create_serializer_class = None

    def create(self, request):
        data = self.create_serializer_class(data=request.data)
        data.is_valid(raise_exception=True)
        made = self.perform_service(data.validated_data)
        return Response(self.serializer_class(made).data, status=status.HTTP_201_CREATED)


class TrustAnchorViewSet(StaffRecordViewSet):
    """The CAs the verifier trusts for GPU device certificates (staff read; platform admins add)."""

    policy = "trust-anchors"
    queryset = TrustAnchor.objects.all()
    serializer_class = s.TrustAnchorSerializer
    filterset_fields = ["kind", "purpose", "is_active"]
    ordering = ["kind", "name"]

    create_serializer_class = s.TrustAnchorCreateSerializer

    @extend_schema(request=s.TrustAnchorCreateSerializer, responses={201: s.TrustAnchorSerializer})
    def create(self, request):
        return super().create(request)

    def perform_service(self, attrs):
        return services.trust_anchor_add(actor=self.principal, **attrs)


class RevocationViewSet(StaffRecordViewSet):
    """Revoked certificates (by issuer and serial, as a CRL lists them): every chain through one fails."""

    policy = "revocations"
    queryset = RevokedCertificate.objects.all()
    serializer_class = s.RevocationSerializer
    filterset_fields = ["issuer", "serial_number"]
    ordering = ["-revoked_at"]

    create_serializer_class = s.RevocationCreateSerializer

    @extend_schema(request=s.RevocationCreateSerializer, responses={201: s.RevocationSerializer})
    def create(self, request):
        return super().create(request)

    def perform_service(self, attrs):
        return services.certificate_revoke(actor=self.principal, **attrs)


class ReferenceMeasurementViewSet(StaffRecordViewSet):
    """
    Reference values per GPU model, VBIOS and driver. Registering the missing ones is what takes
    nodes out of ``reference_unavailable``: they are validated and attested again.
    """

    policy = "reference-measurements"
    queryset = ReferenceMeasurement.objects.all()
    serializer_class = s.ReferenceMeasurementSerializer
    filterset_fields = ["gpu_model", "vbios_version", "driver_version"]
    ordering = ["gpu_model", "vbios_version", "driver_version"]

    create_serializer_class = s.ReferenceMeasurementCreateSerializer

    @extend_schema(request=s.ReferenceMeasurementCreateSerializer, responses={201: s.ReferenceMeasurementSerializer})
    def create(self, request):
        return super().create(request)

    def perform_service(self, attrs):
        return services.reference_register(actor=self.principal, **{**attrs, "gpu_model": attrs["gpu_model"].slug})


class ReferenceManifestViewSet(StaffRecordViewSet):
    """
    Vendors' signed reference integrity manifests (NVIDIA driver and VBIOS RIMs), verified on
    import against the RIM roots and again at every attestation.
    """

    policy = "reference-manifests"
    queryset = ReferenceManifest.objects.all()
    serializer_class = s.ReferenceManifestSerializer
    filterset_fields = ["kind", "version"]
    ordering = ["kind", "version"]

    create_serializer_class = s.ReferenceManifestCreateSerializer

    @extend_schema(request=s.ReferenceManifestCreateSerializer, responses={201: s.ReferenceManifestSerializer})
    def create(self, request):
        return super().create(request)

    def perform_service(self, attrs):
        return services.rim_import(actor=self.principal, document=attrs["document"].encode("utf-8"))


class OcspStatusViewSet(StaffRecordViewSet):
    """Certificate statuses from OCSP responses staff import (the control plane cannot reach the responder)."""

    policy = "ocsp-statuses"
    queryset = OcspStatus.objects.all()
    serializer_class = s.OcspStatusSerializer
    filterset_fields = ["issuer", "serial_number", "status"]
    ordering = ["issuer", "serial_number"]

    @extend_schema(request=s.OcspImportSerializer, responses={201: s.OcspStatusSerializer(many=True)})
    def create(self, request):
        data = s.OcspImportSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        rows = services.ocsp_import(actor=self.principal, der=data.validated_data["response"],
                                    issuers=data.validated_data["issuers"])
        return Response(self.serializer_class(rows, many=True).data, status=status.HTTP_201_CREATED)


class AttestationReportViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, PlatformViewSet):
    """Every verification of a node's evidence, with one reason per failed check (staff)."""

    policy = "attestation-reports"
    queryset = AttestationReport.objects.all()
    serializer_class = s.AttestationReportSerializer
    filterset_fields = ["node_id", "status"]
    ordering = ["-verified_at"]
