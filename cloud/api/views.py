"""Inventory and catalogue API. Tenants read the catalogue with aggregate availability; staff the rest."""

from django.db import transaction
from django.db.models import Count, Q
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from provisioning.api.serializers import OperationSerializer, StepRunSerializer

from .. import services
from ..capacity import availability
from ..choices import SwitchTier
from ..filtersets import GPUFilterSet, NodeFilterSet, OfferingFilterSet
from ..models import GPU, Fabric, GPUModel, Node, Offering, Region
from . import serializers as s
from .base import PlatformViewSet, ReadMixin


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


class OfferingViewSet(ReadMixin, CatalogueWriteMixin, PlatformViewSet):
    """Offerings with list prices and, per region, how many units could start now."""

    policy = "offerings"
    queryset = Offering.objects.select_related("gpu_model")
    serializer_class = s.OfferingSerializer
    filterset_class = OfferingFilterSet
    ordering_fields = ["slug", "price_per_gpu_hour", "kind"]
    ordering = ["slug"]
    create_service = services.offering_create
    update_service = services.offering_update
    update_kwarg = "offering"

    def get_serializer_context(self):
        return super().get_serializer_context() | {"availability": getattr(self, "_availability", {})}

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        self._availability = availability(list(page if page is not None else queryset))
        return page

    def get_object(self):
        obj = super().get_object()
        self._availability = availability([obj])
        return obj


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
    """The fleet (staff): enrol, validate, hold for maintenance, and each node's step history."""

    policy = "nodes"
    queryset = Node.objects.select_related("region", "leaf").defer("bmc_password").annotate(gpu_count=Count("gpus"))
    serializer_class = s.NodeSerializer
    filterset_class = NodeFilterSet
    ordering_fields = ["hostname", "state", "state_changed_at", "created_at"]
    ordering = ["hostname"]

    @extend_schema(request=s.NodeEnrolSerializer, responses={201: s.NodeSerializer})
    def create(self, request, *args, **kwargs):
        """Enrol a node with its GPUs; its validation (burn-in) starts at once, then it is sold."""
        from provisioning.lifecycle import node_validate

        data = s.NodeEnrolSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        with transaction.atomic():
            node = services.node_enrol(actor=request.principal, **data.validated_data)
            node_validate(actor=None, node=node)  # the system's next move, audited as such
        return Response(self.get_serializer(self.get_queryset().get(pk=node.pk)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.NodeMaintenanceSerializer, responses=s.NodeSerializer, methods=["POST"])
    @extend_schema(request=None, responses=s.NodeSerializer, methods=["DELETE"])
    @action(detail=True, methods=["post", "delete"])
    def maintenance(self, request, pk=None):
        """POST holds the node for maintenance (with a reason); DELETE returns it to its pool."""
        node = self.get_object()
        if request.method == "POST":
            data = s.NodeMaintenanceSerializer(data=request.data)
            data.is_valid(raise_exception=True)
            services.node_maintenance_start(actor=request.principal, node=node, reason=data.validated_data["reason"])
        else:
            services.node_maintenance_end(actor=request.principal, node=node)
        return Response(self.get_serializer(self.get_object()).data)

    @extend_schema(request=None, responses={202: OperationSerializer})
    @action(detail=True, methods=["post"])
    def validate(self, request, pk=None):
        """Run validation (burn-in): BMC, GPUs as the catalogue says, memory exercised -> available."""
        from provisioning.lifecycle import node_validate

        operation = node_validate(actor=request.principal, node=self.get_object())
        return Response(OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=StepRunSerializer(many=True))
    @action(detail=True, methods=["get"])
    def steps(self, request, pk=None):
        """The node's step history, newest first: validation, provisioning and cleaning, with every error."""
        from provisioning.models import StepRun

        node = self.get_object()
        history = (StepRun.objects.filter(Q(node=node) | Q(operation__reservation__instances__node=node))
                   .distinct().order_by("-id"))
        page = self.paginate_queryset(history)
        return self.get_paginated_response(StepRunSerializer(page, many=True).data)


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
        from ..telemetry import gpu_series

        gpu = self.get_object()
        query = s.TelemetryQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(s.GPUTelemetrySerializer(gpu_series(gpu=gpu, **query.validated_data)).data)
