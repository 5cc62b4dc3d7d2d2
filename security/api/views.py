"""The audit trail, read-only: tenant admins see their tenant's events, staff see all."""

from rest_framework import mixins

from cloud.api.base import TenantScopedViewSet

from ..models import AuditEvent
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
