"""Tenancy API: thin views that parse input, call one service and serialize the result."""

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny
from rest_framework.response import Response

from core.errors import DomainError
from tenants import filtersets, notifications, services
from tenants.api import serializers as s
from tenants.models import (
    APIToken,
    Invitation,
    Membership,
    Notification,
    Quota,
    SSHKey,
    Team,
    TeamMembership,
    Tenant,
)
from tenants.permissions import WritableCredentials
from web.api.base import PrincipalAPIView, ReadMixin, TenantScopedViewSet

#
# Me
#


class MeView(PrincipalAPIView):
    """The signed-in user, their tenants and roles, and who this request acts as."""

    @extend_schema(responses=s.MeSerializer)
    def get(self, request):
        user = request.user
        memberships = Membership.objects.filter(user=user).select_related("tenant").order_by("tenant__name")
        data = {
            "id": user.pk, "email": user.email, "full_name": user.full_name, "platform_role": user.platform_role,
            "memberships": memberships, "acting_as": request.principal,
        }
        return Response(s.MeSerializer(data).data)


#
# Tenants
#


class TenantViewSet(ReadMixin, TenantScopedViewSet):
    """The tenant this request acts in (staff see and create all)."""

    policy = "tenants"
    queryset = Tenant.objects.all()
    serializer_class = s.TenantSerializer
    filterset_fields = ["slug"]
    ordering_fields = ["name", "slug", "created_at"]
    ordering = ["name"]

    @extend_schema(request=s.TenantCreateSerializer, responses={201: s.TenantCreatedSerializer})
    def create(self, request):
        data = s.TenantCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        created = services.tenant_create(actor=self.principal, **data.validated_data)
        tenant = created.tenant
        tenant.owner_email = created.invitation.email
        tenant.invitation_link, tenant.existing_account = created.invitation_link, created.existing_account
        return Response(s.TenantCreatedSerializer(tenant).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.TenantSerializer, responses=s.TenantSerializer)
    def partial_update(self, request, pk=None):
        tenant = self.get_object()
        data = s.TenantSerializer(tenant, data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        if "name" in data.validated_data:
            tenant = services.tenant_update(actor=self.principal, tenant=tenant, name=data.validated_data["name"])
        return Response(s.TenantSerializer(tenant).data)


#
# Teams and memberships
#


class TeamViewSet(ReadMixin, TenantScopedViewSet):
    policy = "teams"
    queryset = Team.objects.all()
    serializer_class = s.TeamSerializer
    filterset_fields = ["slug"]
    ordering_fields = ["name", "slug", "created_at"]
    ordering = ["name"]

    def create(self, request):
        data = self.get_serializer(data=request.data)
        data.is_valid(raise_exception=True)
        team = services.team_create(actor=self.principal, **data.validated_data)
        return Response(self.get_serializer(team).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request, pk=None):
        team = self.get_object()
        data = self.get_serializer(team, data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        if data.validated_data:
            team = services.team_update(actor=self.principal, team=team, **data.validated_data)
        return Response(self.get_serializer(team).data)

    def destroy(self, request, pk=None):
        services.team_delete(actor=self.principal, team=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class MembershipViewSet(ReadMixin, TenantScopedViewSet):
    """Who is in the tenant with which role. People join through invitations."""

    policy = "memberships"
    queryset = Membership.objects.select_related("user")
    serializer_class = s.MembershipSerializer
    filterset_fields = ["role"]
    ordering_fields = ["created_at", "role"]
    ordering = ["created_at"]

    def partial_update(self, request, pk=None):
        membership = self.get_object()
        data = self.get_serializer(membership, data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        if "role" in data.validated_data:
            membership = services.membership_set_role(
                actor=self.principal, membership=membership, role=data.validated_data["role"]
            )
        return Response(self.get_serializer(membership).data)

    def destroy(self, request, pk=None):
        services.membership_remove(actor=self.principal, membership=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class TeamMembershipViewSet(ReadMixin, TenantScopedViewSet):
    policy = "team-memberships"
    queryset = TeamMembership.objects.select_related("user", "team")
    serializer_class = s.TeamMembershipSerializer
    filterset_class = filtersets.TeamMembershipFilterSet
    ordering_fields = ["created_at", "role"]
    ordering = ["created_at"]

    def create(self, request):
        data = self.get_serializer(data=request.data)
        data.is_valid(raise_exception=True)
        tm = services.team_membership_add(actor=self.principal, **data.validated_data)
        return Response(self.get_serializer(tm).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.TeamMembershipUpdateSerializer)
    def partial_update(self, request, pk=None):
        tm = self.get_object()
        data = s.TeamMembershipUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        tm = services.team_membership_set_role(actor=self.principal, team_membership=tm, **data.validated_data)
        return Response(self.get_serializer(tm).data)

    def destroy(self, request, pk=None):
        services.team_membership_remove(actor=self.principal, team_membership=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


#
# Invitations
#


class InvitationViewSet(ReadMixin, TenantScopedViewSet):
    policy = "invitations"
    queryset = Invitation.objects.select_related("team")
    serializer_class = s.InvitationSerializer
    filterset_class = filtersets.InvitationFilterSet
    ordering_fields = ["created_at", "expires_at"]
    ordering = ["-created_at"]

    @extend_schema(responses={201: s.InvitationCreatedSerializer})
    def create(self, request):
        data = self.get_serializer(data=request.data)
        data.is_valid(raise_exception=True)
        invitation, link = services.invitation_create(actor=self.principal, **data.validated_data)
        invitation.link = link
        return Response(s.InvitationCreatedSerializer(invitation).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        services.invitation_revoke(actor=self.principal, invitation=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationAcceptView(PrincipalAPIView):
    """
    Accept an invitation by its secret: signed in, join as yourself; otherwise create your
    account with an e-mail address and a password. Scoped by the secret, not by a tenant.
    """

    # Open to anyone (a new person has no account yet): AllowAny says so in the schema too; a
    # caller who does send a token must send a read-write one.
    permission_classes = [AllowAny, WritableCredentials]

    @extend_schema(request=s.InvitationAcceptSerializer, responses={201: s.MyMembershipSerializer})
    def post(self, request):
        data = s.InvitationAcceptSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = request.user if request.user.is_authenticated else None
        membership = services.invitation_accept(
            secret=data.validated_data["token"], user=user,
            email=data.validated_data.get("email", ""), password=data.validated_data.get("password", ""),
        )
        return Response(s.MyMembershipSerializer(membership).data, status=status.HTTP_201_CREATED)


#
# API tokens
#


class APITokenViewSet(ReadMixin, TenantScopedViewSet):
    """Your API tokens (tenant admins and owners: every token of the tenant)."""

    policy = "api-tokens"
    queryset = APIToken.objects.select_related("user", "team")
    serializer_class = s.APITokenSerializer
    filterset_class = filtersets.APITokenFilterSet
    ordering_fields = ["created_at", "expires_at", "last_used_at", "name"]
    ordering = ["-created_at"]

    @extend_schema(responses={201: s.IssuedTokenSerializer})
    def create(self, request):
        data = self.get_serializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            issued = services.token_issue(actor=self.principal, **data.validated_data)
        except DomainError as exc:
            # The service judges expires_at; a request that gave expires_in_days is told about that field.
            if "expires_in_days" in request.data and isinstance(exc.detail, dict) and "expires_at" in exc.detail:
                exc.detail["expires_in_days"] = exc.detail.pop("expires_at")
            raise
        issued.token.token = issued.secret
        return Response(s.IssuedTokenSerializer(issued.token).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        """Revoke the token (it stays listed, with revoked_at)."""
        services.token_revoke(actor=self.principal, token=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


#
# SSH keys
#


class SSHKeyViewSet(ReadMixin, TenantScopedViewSet):
    """Saved SSH public keys: your own and the tenant's shared ones (tenant admins: every key of the tenant)."""

    policy = "ssh-keys"
    queryset = SSHKey.objects.select_related("user")
    serializer_class = s.SSHKeySerializer
    ordering_fields = ["name", "created_at"]
    ordering = ["name", "created_at"]

    @extend_schema(responses={201: s.SSHKeySerializer})
    def create(self, request):
        data = self.get_serializer(data=request.data)
        data.is_valid(raise_exception=True)
        key = services.ssh_key_add(actor=self.principal, **data.validated_data)
        return Response(self.get_serializer(key).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        """Remove the key: new instances no longer get it (running ones keep it)."""
        services.ssh_key_remove(actor=self.principal, key=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


#
# Quotas
#


class QuotaViewSet(ReadMixin, TenantScopedViewSet):
    """Quotas of the tenant and its teams; set by platform admins."""

    policy = "quotas"
    queryset = Quota.objects.select_related("gpu_model")
    serializer_class = s.QuotaSerializer
    filterset_class = filtersets.QuotaFilterSet
    ordering_fields = ["resource", "limit", "updated_at"]
    ordering = ["resource", "limit"]

    def create(self, request):
        data = self.get_serializer(data=request.data)
        data.is_valid(raise_exception=True)
        quota, created = services.quota_set(actor=self.principal, **data.validated_data)
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK  # setting an existing quota changes it
        return Response(self.get_serializer(quota).data, status=code)

    @extend_schema(request=s.QuotaUpdateSerializer)
    def partial_update(self, request, pk=None):
        quota = self.get_object()
        data = s.QuotaUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        quota, _ = services.quota_set(actor=self.principal, tenant=quota.tenant, team=quota.team,
                                   resource=quota.resource, gpu_model=quota.gpu_model, **data.validated_data)
        return Response(self.get_serializer(quota).data)

    def destroy(self, request, pk=None):
        services.quota_delete(actor=self.principal, quota=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


#
# High-priority applications
#


#
# Notifications
#


class NotificationViewSet(ReadMixin, TenantScopedViewSet):
    """Your notifications and those for everyone in your tenant (or your teams), newest first."""

    policy = "notifications"
    queryset = Notification.objects.all()
    serializer_class = s.NotificationSerializer
    filterset_class = filtersets.NotificationFilterSet
    ordering_fields = ["created_at"]
    ordering = ["-created_at"]

    @extend_schema(request=None, responses=s.NotificationSerializer)
    @action(detail=True, methods=["post"])
    def read(self, request, pk=None):
        """Mark it read (for every reader of a shared notification)."""
        notification = notifications.notification_mark_read(actor=self.principal, notification=self.get_object())
        return Response(self.get_serializer(notification).data)

    @extend_schema(request=None, responses=s.MarkedReadSerializer)
    @action(detail=False, methods=["post"], url_path="read-all")
    def read_all(self, request):
        """Mark every notification you can see read."""
        return Response({"marked_read": notifications.notification_mark_all_read(actor=self.principal)})
