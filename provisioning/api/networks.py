"""IB-VPC API: list, create and delete VPCs, their members (instances), and the isolation report."""

from __future__ import annotations

from django.db.models import Count, Q
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from cloud.models import Fabric, Region
from core.errors import DomainError
from provisioning import services
from provisioning.api.idempotency import IdempotentCreateMixin
from provisioning.api.views import IDEMPOTENCY_PARAMETER
from provisioning.choices import VPCState
from provisioning.drivers.fabric import MTUS, PKEY_MAX, PKEY_MIN
from provisioning.models import VPC
from provisioning.networks import vpcs
from provisioning.networks.ports import isolation_report, vpc_members
from tenants.models import Team
from web.api.base import (
    SLUG_PATTERN,
    NumberChoiceField,
    ReadMixin,
    ScopedRelatedField,
    StrictFloatField,
    StrictIntegerField,
    StrictSerializer,
    TenantScopedViewSet,
)

NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


@extend_schema_field({"type": "string", "pattern": "^0x[0-9a-f]{4}$", "example": "0x0012"})
class PKeyField(serializers.Field):
    """A P_Key as a number, a decimal string or a hex string ("0x0012"); 0x0001-0x7FFE (0x7FFF is the default)."""

    default_error_messages = {"invalid": "A P_Key is a number or a hex string like 0x0012.",
                              "range": "A P_Key is 0x0001-0x7ffe (0x7fff is the default partition)."}

    def to_internal_value(self, data):
        if isinstance(data, bool):
            self.fail("invalid")
        try:
            if isinstance(data, str):
                value = int(data, 16) if data.lower().startswith("0x") else int(data, 10)
            else:
                value = int(data)
        except (TypeError, ValueError):
            self.fail("invalid")
        if isinstance(data, float) and data != value:
            self.fail("invalid")
        if not PKEY_MIN <= value <= PKEY_MAX:
            raise serializers.ValidationError(self.error_messages["range"], code="pkey_out_of_range")
        return value

    def to_representation(self, value):
        return f"{value:#06x}"


class VPCCreateSerializer(StrictSerializer):
    name = serializers.RegexField(NAME, max_length=63, help_text="Lower-case letters, digits and dashes.")
    region = serializers.SlugRelatedField(slug_field="slug", queryset=Region.objects.filter(is_active=True))
    fabric = serializers.RegexField(SLUG_PATTERN, max_length=50, required=False,
                                    help_text="A fabric of the region; the region's largest when left out.")
    cidr = serializers.CharField(max_length=43, required=False,
                                 help_text="IPoIB subnet, /16 to /28 of a private range; a free /24 if left out.")
    pkey = PKeyField(required=False, help_text="A P_Key of the fabric's pool; drawn for you if left out.")
    mtu = NumberChoiceField(choices=MTUS, default=4096)
    service_level = StrictIntegerField(min_value=0, max_value=15, default=0)
    rate_gbps = StrictFloatField(required=False, allow_null=True, min_value=1)
    team = ScopedRelatedField(queryset=Team.objects.all(), required=False, allow_null=True)

    def validate(self, attrs):
        region = attrs["region"]
        fabrics = Fabric.objects.filter(region=region)
        if "fabric" in attrs:
            fabric = fabrics.filter(slug=attrs["fabric"]).first()
            if fabric is None:
                raise serializers.ValidationError(
                    {"fabric": f"Region {region.slug} has no fabric '{attrs['fabric']}'."})
        else:
            fabric = fabrics.annotate(size=Count("nodes")).order_by("-size", "slug").first()
            if fabric is None:
                raise serializers.ValidationError({"region": f"Region {region.slug} has no InfiniBand fabric."})
        attrs["fabric"] = fabric
        return attrs


class VPCSerializer(serializers.ModelSerializer):
    region = serializers.SlugRelatedField(source="fabric.region", slug_field="slug", read_only=True)
    fabric = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pkey = PKeyField(read_only=True)
    team = serializers.UUIDField(source="team_id", read_only=True, allow_null=True)
    instances = serializers.SerializerMethodField()

    class Meta:
        model = VPC
        fields = ["id", "name", "region", "fabric", "pkey", "cidr", "mtu", "service_level", "rate_gbps", "is_default",
                  "state", "state_reason", "team", "instances", "created_at", "deleted_at"]
        read_only_fields = fields

    @extend_schema_field(serializers.IntegerField())
    def get_instances(self, vpc) -> int:
        return getattr(vpc, "live_instances", None) or 0


class MemberSerializer(serializers.Serializer):
    """An instance in the VPC: never its port GUIDs (they say which host a VM shares)."""

    instance = serializers.UUIDField()
    name = serializers.CharField()
    reservation = serializers.UUIDField()
    state = serializers.CharField()
    ports = serializers.IntegerField()
    addresses = serializers.ListField(child=serializers.IPAddressField())
    joined_at = serializers.DateTimeField()


class VPCViewSet(ReadMixin, IdempotentCreateMixin, TenantScopedViewSet):
    """The tenant's IB-VPCs (members see their teams' and the tenant-wide ones)."""

    policy = "vpcs"
    queryset = VPC.objects.select_related("fabric__region").annotate(
        live_instances=Count("memberships__instance", filter=Q(memberships__left_at__isnull=True), distinct=True))
    serializer_class = VPCSerializer
    create_serializer_class = VPCCreateSerializer
    filterset_fields = ["state", "is_default"]
    ordering_fields = ["name", "created_at"]
    ordering = ["name"]

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action == "list" and "state" not in self.request.query_params:
            queryset = queryset.exclude(state=VPCState.DELETED)  # history on request (?state=deleted)
        return queryset

    @extend_schema(request=VPCCreateSerializer, responses={201: VPCSerializer}, parameters=[IDEMPOTENCY_PARAMETER])
    def create(self, request, *args, **kwargs):
        """Create a VPC: its P_Key and subnet are chosen (or checked) now, its partition made on the fabric next."""
        return super().create(request, *args, **kwargs)

    def create_once(self, request):
        data = VPCCreateSerializer(data=request.data, context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        attrs = data.validated_data
        team = services.team_for(self.principal, attrs.get("team"))
        vpc = vpcs.vpc_create(actor=self.principal, fabric=attrs["fabric"], name=attrs["name"], cidr=attrs.get("cidr"),
                              pkey=attrs.get("pkey"), mtu=attrs["mtu"], service_level=attrs["service_level"],
                              rate_gbps=attrs.get("rate_gbps"), team=team)
        return Response(VPCSerializer(vpc).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={202: VPCSerializer})
    def destroy(self, request, pk=None):
        """Delete a VPC nothing uses (409 otherwise): ``deleting`` until the fabric confirms the partition is gone."""
        vpc = vpcs.vpc_delete(actor=self.principal, vpc=self.get_object())
        return Response(VPCSerializer(vpc).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=MemberSerializer(many=True))
    @action(detail=True, methods=["get"])
    def members(self, request, pk=None):
        """The instances in the VPC now, with their IPoIB addresses, in address order; paginated like every list."""
        members, _ = vpc_members(self.get_object())
        page = self.paginate_queryset(members)
        return self.get_paginated_response(MemberSerializer([{
            "instance": m.instance.pk, "name": m.instance.name, "reservation": m.instance.reservation_id,
            "state": m.instance.state, "ports": m.ports, "addresses": m.addresses, "joined_at": m.joined_at,
        } for m in page], many=True).data)

    @action(detail=True, methods=["get"], url_path="isolation-report")
    def isolation_report(self, request, pk=None):
        """Partition, members, what the fabric shows now and the reconciler's findings: for your auditors."""
        vpc = self.get_object()
        if vpc.state == VPCState.DELETED:
            raise DomainError("The VPC is deleted; its partition is gone.", code="vpc_deleted")
        return Response(isolation_report(vpc))
