"""
``/api/v1/incidents/`` (docs/incidents.md): staff list every incident (``?open=true``, ``kind``,
``node``, ``assignee``, ``tenant``) and acknowledge, assign and resolve them (platform admins;
security.incident_response decides); a tenant reads only its own incidents, in a shorter form
without the platform's names and evidence, and may change none (403).
"""

from __future__ import annotations

import uuid

import django_filters
from django.db.models import OuterRef, Subquery
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.response import Response

from cloud.models import Node
from security import incident_response
from security.incident_paging import severity_of
from security.models import Incident
from tenants.models import User
from web.api.base import ReadMixin, StrictSerializer, TenantScopedViewSet


def incident_state(incident: Incident) -> str:
    if incident.resolved_at:
        return "resolved"
    if incident.assignee_id:
        return "assigned"
    return "acknowledged" if incident.acknowledged_at else "open"


class TenantIncidentSerializer(serializers.ModelSerializer):
    """What a tenant reads of its own incident: what happened to its reservation and when."""

    state = serializers.SerializerMethodField()

    class Meta:
        model = Incident
        fields = ["id", "kind", "summary", "state", "reservation_id", "gpus_affected", "impact_started_at",
                  "detected_at", "acknowledged_at", "restored_at", "resolved_at"]
        read_only_fields = fields

    def get_state(self, obj) -> str:
        return incident_state(obj)


class IncidentSerializer(TenantIncidentSerializer):
    """Staff's view: where (node and region by name), the evidence, who responds, and the paging."""

    severity = serializers.SerializerMethodField()
    node = serializers.CharField(source="node_hostname", read_only=True, allow_null=True)
    region = serializers.CharField(source="node_region", read_only=True, allow_null=True)
    acknowledged_by = serializers.EmailField(source="acknowledged_by.email", read_only=True, allow_null=True)
    assignee = serializers.EmailField(source="assignee.email", read_only=True, allow_null=True)
    resolved_by = serializers.EmailField(source="resolved_by.email", read_only=True, allow_null=True)

    class Meta(TenantIncidentSerializer.Meta):
        fields = [*TenantIncidentSerializer.Meta.fields, "severity", "evidence", "tenant_id", "node_id", "node",
                  "region", "fabric_id", "gpu_ids", "acknowledged_by", "assignee", "assignee_id", "assigned_at",
                  "resolved_by", "resolution_note", "notified_at", "notify_attempts", "notify_error"]
        read_only_fields = fields

    def get_severity(self, obj) -> str:
        return severity_of(obj.kind)


class IncidentAssignSerializer(StrictSerializer):
    assignee = serializers.CharField(max_length=254, help_text="The platform admin's e-mail address or user id.")

    def validate_assignee(self, value: str) -> User:
        value = value.strip()
        try:
            lookup = {"pk": uuid.UUID(value)}
        except ValueError:
            lookup = {"email__iexact": value}
        user = User.objects.filter(**lookup).first()
        if user is None:
            raise serializers.ValidationError(f"No user {value}: give a platform admin's e-mail address or id.",
                                              code="does_not_exist")
        return user


class IncidentResolveSerializer(StrictSerializer):
    note = serializers.CharField(max_length=incident_response.NOTE_MAX,
                                 help_text="What was done, or why nothing needs doing.")


class IncidentAcknowledgeSerializer(StrictSerializer):
    """No fields: an acknowledgement carries nothing but who and when."""


class IncidentFilterSet(django_filters.FilterSet):
    open = django_filters.BooleanFilter(field_name="resolved_at", lookup_expr="isnull", label="Unresolved only.")
    kind = django_filters.CharFilter(field_name="kind", max_length=64)
    node = django_filters.UUIDFilter(field_name="node_id")
    assignee = django_filters.UUIDFilter(field_name="assignee_id")
    tenant = django_filters.UUIDFilter(field_name="tenant_id")

    class Meta:
        model = Incident
        fields = ["open", "kind", "node", "assignee", "tenant"]


class IncidentViewSet(ReadMixin, TenantScopedViewSet):
    """Incidents: staff respond to them; a tenant reads its own."""

    policy = "incidents"
    queryset = Incident.objects.select_related("acknowledged_by", "assignee", "resolved_by").annotate(
        node_hostname=Subquery(Node.objects.filter(pk=OuterRef("node_id")).values("hostname")[:1]),
        node_region=Subquery(Node.objects.filter(pk=OuterRef("node_id")).values("region__slug")[:1]))
    serializer_class = IncidentSerializer
    filterset_class = IncidentFilterSet
    ordering_fields = ["detected_at", "resolved_at", "kind"]
    ordering = ["-detected_at", "-id"]

    def get_serializer_class(self):
        if getattr(self, "swagger_fake_view", False):  # the schema describes the staff view
            return IncidentSerializer
        principal = self.principal
        return IncidentSerializer if principal is not None and principal.is_platform else TenantIncidentSerializer

    def _answer(self, incident: Incident) -> Response:
        return Response(IncidentSerializer(self.get_queryset().get(pk=incident.pk)).data)

    @extend_schema(request=None, responses=IncidentSerializer)
    @action(detail=True, methods=["post"])
    def acknowledge(self, request, pk=None):
        """Say someone is on it (the first acknowledgement stands); 409 ``incident_resolved`` once resolved."""
        IncidentAcknowledgeSerializer(data=request.data or {}).is_valid(raise_exception=True)
        return self._answer(incident_response.incident_acknowledge(actor=self.principal, incident=self.get_object()))

    @extend_schema(request=IncidentAssignSerializer, responses=IncidentSerializer)
    @action(detail=True, methods=["post"])
    def assign(self, request, pk=None):
        """Hand it to a platform admin (by e-mail or id): 400 ``not_staff`` for anyone else."""
        data = IncidentAssignSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return self._answer(incident_response.incident_assign(actor=self.principal, incident=self.get_object(),
                                                              assignee=data.validated_data["assignee"]))

    @extend_schema(request=IncidentResolveSerializer, responses=IncidentSerializer)
    @action(detail=True, methods=["post"])
    def resolve(self, request, pk=None):
        """End it with a note of what was done; a resolved incident is answered as it is."""
        data = IncidentResolveSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return self._answer(incident_response.incident_resolve(actor=self.principal, incident=self.get_object(),
                                                               note=data.validated_data["note"]))
