"""
The nodes API's staff actions: enrol a node (its validation starts at once), hold it for
maintenance or return it, validate it again, and read its step history and acceptance checks.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import Q
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from cloud import services
from cloud.api import serializers as s
from cloud.api.views import NodeViewSet as InventoryNodeViewSet
from operations import nodes
from provisioning.api.serializers import NodeValidationSerializer, OperationSerializer, StepRunSerializer
from provisioning.lifecycle.validate import node_validate
from provisioning.models import NodeValidation, StepRun


class NodeViewSet(InventoryNodeViewSet):
    """The fleet (staff): enrol, validate, hold for maintenance, and each node's step history."""

    @extend_schema(request=s.NodeEnrolSerializer, responses={201: s.NodeSerializer})
    def create(self, request, *args, **kwargs):
        """Enrol a node with its GPUs; its validation (burn-in) starts at once, then it is sold."""
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
            nodes.node_maintenance_start(actor=request.principal, node=node, reason=data.validated_data["reason"])
        else:
            services.node_maintenance_end(actor=request.principal, node=node)
        return Response(self.get_serializer(self.get_object()).data)

    @extend_schema(request=None, responses={202: OperationSerializer})
    @action(detail=True, methods=["post"])
    def validate(self, request, pk=None):
        """Run validation (burn-in): BMC, GPUs as the catalogue says, memory exercised -> available."""
        operation = node_validate(actor=request.principal, node=self.get_object())
        return Response(OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=StepRunSerializer(many=True))
    @action(detail=True, methods=["get"])
    def steps(self, request, pk=None):
        """The node's step history, newest first: validation, provisioning and cleaning, with every error."""
        node = self.get_object()
        history = (StepRun.objects.filter(Q(node=node) | Q(operation__reservation__instances__node=node))
                   .distinct().order_by("-id"))
        page = self.paginate_queryset(history)
        return self.get_paginated_response(StepRunSerializer(page, many=True).data)

    @extend_schema(responses=NodeValidationSerializer(many=True))
    @action(detail=True, methods=["get"])
    def validations(self, request, pk=None):
        """The node's acceptance checks, newest first: each check's GPU, value and bound, and whether it passed."""
        page = self.paginate_queryset(NodeValidation.objects.filter(node=self.get_object()).order_by("-measured_at"))
        return self.get_paginated_response(NodeValidationSerializer(page, many=True).data)
