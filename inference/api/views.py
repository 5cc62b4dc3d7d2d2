"""Inference endpoints API: a team's endpoints, their replicas and the autoscaler's decisions."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from cloud.telemetry import gpus_series
from inference import endpoints as services
from inference.api import serializers as s
from inference.choices import EndpointState
from inference.models import Endpoint
from provisioning.models import Allocation
from web.api.base import ReadMixin, TenantScopedViewSet


class EndpointViewSet(ReadMixin, TenantScopedViewSet):
    """The tenant's inference endpoints (members see their teams' and the tenant-wide ones)."""

    policy = "endpoints"
    queryset = Endpoint.objects.select_related("tenant", "offering").prefetch_related("replicas")
    serializer_class = s.EndpointSerializer
    filterset_fields = ["state"]
    ordering = ["name"]

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action == "list" and "state" not in self.request.query_params:
            queryset = queryset.exclude(state=EndpointState.DELETED)
        return queryset

    @extend_schema(request=s.EndpointWriteSerializer, responses={201: s.EndpointSerializer})
    def create(self, request):
        """Create an endpoint: its first replicas are reserved at once and serve once active and healthy."""
        data = s.EndpointWriteSerializer(data=request.data, context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        share = services.Share(**fields.pop("share"))
        endpoint = services.endpoint_create(actor=self.principal, share=share, **fields)
        return Response(s.EndpointSerializer(endpoint).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.EndpointUpdateSerializer, responses=s.EndpointSerializer)
    def partial_update(self, request, pk=None):
        """Change its scaling, regions or health check; the replicas follow on the autoscaler's next pass."""
        data = s.EndpointUpdateSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        endpoint = services.endpoint_update(actor=self.principal, endpoint=self.get_object(), **data.validated_data)
        return Response(s.EndpointSerializer(endpoint).data)

    @extend_schema(responses={202: s.EndpointSerializer})
    def destroy(self, request, pk=None):
        """Delete it: out of the load balancer at once, its replicas drained and released."""
        endpoint = services.endpoint_delete(actor=self.principal, endpoint=self.get_object())
        return Response(s.EndpointSerializer(endpoint).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=s.ReplicaSerializer(many=True))
    @action(detail=True, methods=["get"])
    def replicas(self, request, pk=None):
        """Its replicas, newest first (``?all=1``: the gone ones too)."""
        replicas = self.get_object().replicas.select_related("reservation__region").order_by("-created_at")
        if request.query_params.get("all") != "1":
            replicas = replicas.exclude(state="gone")
        return Response(s.ReplicaSerializer(replicas[:200], many=True).data)

    @extend_schema(responses=s.ScalingDecisionSerializer(many=True))
    @action(detail=True, methods=["get"])
    def decisions(self, request, pk=None):
        """The autoscaler's decisions, newest first, each with the figures it decided on."""
        decisions = self.get_object().decisions.all()[:200]
        return Response(s.ScalingDecisionSerializer(decisions, many=True).data)

    @extend_schema(responses=dict)
    @action(detail=True, methods=["get"])
    def utilization(self, request, pk=None):
        """Per-minute GPU utilization of its live replicas' GPUs (the last hour)."""
        endpoint = self.get_object()
        live = endpoint.replicas.exclude(state="gone").values("reservation_id")
        gpus = list(Allocation.objects.filter(reservation_id__in=live).values_list("gpu_id", flat=True).distinct())
        series = gpus_series(gpus)
        return Response({"endpoint": endpoint.pk, "gpus": [{"gpu": gpu, **series[gpu]} for gpu in gpus]})
