"""The high-priority applications API: a team applies or withdraws, platform reviewers approve or reject."""

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.response import Response

from core.errors import Forbidden
from provisioning.high_priority import services as high_priority
from tenants import filtersets
from tenants.api import serializers as s
from tenants.models import (
    HighPriorityApplication,
)
from tenants.permissions import RolePolicy
from tenants.scoping import VIEW
from web.api.base import ReadMixin, TenantScopedViewSet


class PlatformReviewer(BasePermission):
    """Only platform reviewers get as far as looking the application up: the same 403 for any id."""

    def has_permission(self, request, view):
        if not high_priority.is_reviewer(request.principal):
            raise Forbidden(high_priority.REVIEWERS_ONLY)
        return True


class HighPriorityApplicationViewSet(ReadMixin, TenantScopedViewSet):
    """
    High-priority applications: the team's members and the tenant's admins apply and withdraw;
    platform approvers and admins review. Each shows the team's record frozen when it was filed.
    """

    policy = "high-priority-applications"
    queryset = HighPriorityApplication.objects.select_related("team", "applied_by")
    serializer_class = s.HighPriorityApplicationSerializer
    create_serializer_class = s.HighPriorityApplySerializer
    filterset_class = filtersets.HighPriorityApplicationFilterSet
    ordering_fields = ["created_at", "state", "reviewed_at"]
    ordering = ["-created_at"]

    def get_queryset(self):
        if self.action == "review":
            # Reviewers read every tenant's applications but change none by the scoping rule; the
            # review is their one write, admitted by PlatformReviewer and decided by the service.
            return self.queryset.visible_to(self.principal, VIEW)
        return super().get_queryset()

    @extend_schema(request=s.HighPriorityApplySerializer, responses={201: s.HighPriorityApplicationSerializer})
    def create(self, request):
        """Apply for the team: 409 ``hp_thresholds_not_met`` with the reasons when its record falls short."""
        data = s.HighPriorityApplySerializer(data=request.data, context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        application = high_priority.hp_apply(actor=self.principal, **data.validated_data)
        return Response(self.get_serializer(application).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=s.HighPriorityApplicationSerializer)
    @action(detail=True, methods=["post"])
    def withdraw(self, request, pk=None):
        """Take back a pending application."""
        application = high_priority.hp_withdraw(actor=self.principal, application=self.get_object())
        return Response(self.get_serializer(application).data)

    @extend_schema(request=s.HighPriorityReviewSerializer, responses=s.HighPriorityApplicationSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated, RolePolicy, PlatformReviewer])
    def review(self, request, pk=None):
        """Approve or reject (platform approvers and admins not in the team); the note is shown to the team."""
        data = s.HighPriorityReviewSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        application = high_priority.hp_review(actor=self.principal, application=self.get_object(),
                                              **data.validated_data)
        return Response(self.get_serializer(application).data)
