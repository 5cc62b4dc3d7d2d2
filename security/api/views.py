"""The audit trail (tenant admins see their tenant's events, staff see all) and what attestation trusts (staff)."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from cloud.api.base import PlatformViewSet, PrincipalAPIView, TenantScopedViewSet
from tenants.permissions import RolePolicy

from .. import services
from ..models import AttestationReport, AuditEvent, ReferenceMeasurement, RevokedCertificate, TrustAnchor
from . import serializers as s
from .serializers import AuditEventSerializer


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
        from ..audit_chain import audit_verify

        return Response(s.AuditChainSerializer(audit_verify().as_dict()).data)


class TrustAnchorViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, PlatformViewSet):
    """The CAs the verifier trusts for GPU device certificates (staff read; platform admins add)."""

    policy = "trust-anchors"
    queryset = TrustAnchor.objects.all()
    serializer_class = s.TrustAnchorSerializer
    filterset_fields = ["kind", "is_active"]
    ordering = ["kind", "name"]

    @extend_schema(request=s.TrustAnchorCreateSerializer, responses={201: s.TrustAnchorSerializer})
    def create(self, request):
        data = s.TrustAnchorCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        anchor = services.trust_anchor_add(actor=self.principal, **data.validated_data)
        return Response(s.TrustAnchorSerializer(anchor).data, status=status.HTTP_201_CREATED)


class RevocationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, PlatformViewSet):
    """Revoked certificates (by issuer and serial, as a CRL lists them): every chain through one fails."""

    policy = "revocations"
    queryset = RevokedCertificate.objects.all()
    serializer_class = s.RevocationSerializer
    filterset_fields = ["issuer", "serial_number"]
    ordering = ["-revoked_at"]

    @extend_schema(request=s.RevocationCreateSerializer, responses={201: s.RevocationSerializer})
    def create(self, request):
        data = s.RevocationCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        revoked = services.certificate_revoke(actor=self.principal, **data.validated_data)
        return Response(s.RevocationSerializer(revoked).data, status=status.HTTP_201_CREATED)


class ReferenceMeasurementViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, PlatformViewSet):
    """
    Reference values per GPU model, VBIOS and driver. Registering the missing ones is what takes
    nodes out of ``reference_unavailable``: they are validated and attested again.
    """

    policy = "reference-measurements"
    queryset = ReferenceMeasurement.objects.all()
    serializer_class = s.ReferenceMeasurementSerializer
    filterset_fields = ["gpu_model", "vbios_version", "driver_version"]
    ordering = ["gpu_model", "vbios_version", "driver_version"]

    @extend_schema(request=s.ReferenceMeasurementCreateSerializer, responses={201: s.ReferenceMeasurementSerializer})
    def create(self, request):
        data = s.ReferenceMeasurementCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        attrs = data.validated_data
        reference = services.reference_register(actor=self.principal, gpu_model=attrs["gpu_model"].slug,
                                                vbios_version=attrs["vbios_version"],
                                                driver_version=attrs["driver_version"],
                                                measurements=attrs["measurements"])
        return Response(s.ReferenceMeasurementSerializer(reference).data, status=status.HTTP_201_CREATED)


class AttestationReportViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, PlatformViewSet):
    """Every verification of a node's evidence, with one reason per failed check (staff)."""

    policy = "attestation-reports"
    queryset = AttestationReport.objects.all()
    serializer_class = s.AttestationReportSerializer
    filterset_fields = ["node_id", "status"]
    ordering = ["-verified_at"]
