"""Inventory and catalogue API. Tenants read the catalogue with aggregate availability; staff the rest."""

from django.db.models import Count, Q
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from cloud import services
from cloud.api import serializers as s
from cloud.choices import SwitchTier
from cloud.filtersets import GPUFilterSet, NodeFilterSet
from cloud.models import GPU, Fabric, GPUModel, Node, Region
from web.api.base import PlatformViewSet, ReadMixin


class CatalogueWriteMixin:
    """Create and partial update through the viewset's named services."""

    create_service = None
    update_service = None
    update_kwarg = ""

    def create(self, request):
        data = self.get_serializer(data=request.data)
        data.is_valid(raise_exception=True)
        obj = type(self).create_service(actor=request.principal, **data.validated_data)
        return Response(self.get_serializer(obj).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request, pk=None):
        obj = self.get_object()
        data = self.get_serializer(obj, data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        if data.validated_data:
            obj = type(self).update_service(actor=request.principal, **{self.update_kwarg: obj},
                                            **data.validated_data)
        return Response(self.get_serializer(obj).data)


class RegionViewSet(ReadMixin, CatalogueWriteMixin, PlatformViewSet):
    policy = "regions"
    queryset = Region.objects.all()
    serializer_class = s.RegionSerializer
    filterset_fields = ["slug", "is_active"]
    ordering_fields = ["slug", "name"]
    ordering = ["slug"]
    create_service = services.region_create
    update_service = services.region_update
    update_kwarg = "region"


class GPUModelViewSet(ReadMixin, CatalogueWriteMixin, PlatformViewSet):
    policy = "gpu-models"
    queryset = GPUModel.objects.all()
    serializer_class = s.GPUModelSerializer
    filterset_fields = ["slug", "vendor"]
    ordering_fields = ["slug", "memory_gib", "fp16_tflops", "fp8_tflops"]
    ordering = ["slug"]
    create_service = services.gpu_model_create
    update_service = services.gpu_model_update
    update_kwarg = "gpu_model"


class FabricViewSet(ReadMixin, PlatformViewSet):
    policy = "fabrics"
    queryset = Fabric.objects.select_related("region").annotate(
        leaf_count=Count("switches", filter=Q(switches__tier=SwitchTier.LEAF), distinct=True),
        spine_count=Count("switches", filter=Q(switches__tier=SwitchTier.SPINE), distinct=True),
        node_count=Count("nodes", distinct=True),
    )
    serializer_class = s.FabricSerializer
    filterset_fields = ["region"]
    ordering_fields = ["slug", "created_at"]
    ordering = ["slug"]


class NodeViewSet(ReadMixin, PlatformViewSet):
    """The fleet as the inventory holds it, read-only (staff act on nodes through ``operations.api``)."""

    policy = "nodes"
    queryset = Node.objects.select_related("region", "leaf").defer("bmc_password").annotate(gpu_count=Count("gpus"))
    serializer_class = s.NodeSerializer
    filterset_class = NodeFilterSet
    ordering_fields = ["hostname", "state", "state_changed_at", "created_at"]
    ordering = ["hostname"]


class GPUViewSet(ReadMixin, PlatformViewSet):
    policy = "gpus"
    queryset = GPU.objects.select_related("node", "model")
    serializer_class = s.GPUSerializer
    filterset_class = GPUFilterSet
    ordering_fields = ["index", "state", "health"]
    ordering = ["node__hostname", "index"]

    @extend_schema(parameters=[s.TelemetryQuerySerializer], responses=s.GPUTelemetrySerializer)
    @action(detail=True, methods=["get"])
    def telemetry(self, request, pk=None):
        """The GPU's latest sample and its series since ``since``: raw samples, 1-minute or 1-hour buckets."""
        from cloud.telemetry import gpu_series

        gpu = self.get_object()
        query = s.TelemetryQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(s.GPUTelemetrySerializer(gpu_series(gpu=gpu, **query.validated_data)).data)
