"""Serializers of the tenancy API: input shape and output fields only; services decide."""

from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from cloud.models import GPUModel
from tenants.choices import PlatformRole, QuotaResource, TeamRole, TenantRole, TokenScope
from tenants.models import (
    APIToken,
    HighPriorityApplication,
    Invitation,
    Membership,
    Notification,
    Quota,
    SSHKey,
    Team,
    TeamMembership,
    Tenant,
    User,
)
from tenants.ssh_keys import MAX_LENGTH as MAX_KEY_LENGTH
from web.api.base import (
    SLUG_PATTERN,
    ScopedRelatedField,
    StrictIntegerField,
    StrictModelSerializer,
    StrictSerializer,
)

SLUG_MESSAGE = "Use lower-case letters, digits and single hyphens (for example 'vision-lab')."


def slug_field(**kwargs):
    return serializers.RegexField(SLUG_PATTERN, max_length=50, error_messages={"invalid": SLUG_MESSAGE}, **kwargs)


class TenantMemberField(serializers.PrimaryKeyRelatedField):
    """A user id, accepted only when the user is a member of the principal's tenant."""

    def get_queryset(self):
        principal = self.context["request"].principal
        if principal is None or principal.tenant is None:
            return User.objects.none()
        return User.objects.filter(memberships__tenant=principal.tenant)


#
# Tenants
#


class TenantSerializer(StrictModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "name", "slug", "created_at"]
        read_only_fields = ["id", "slug", "created_at"]


class TenantCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100)
    slug = slug_field()
    owner_email = serializers.EmailField(max_length=254)


class TenantCreatedSerializer(TenantSerializer):
    owner_email = serializers.EmailField(read_only=True)
    invitation_link = serializers.CharField(
        read_only=True, help_text="Shown once: the owner accepts it (a new address creates its account there)."
    )
    existing_account = serializers.BooleanField(
        read_only=True, help_text="An account with this address exists; its holder must sign in to accept."
    )

    class Meta(TenantSerializer.Meta):
        fields = TenantSerializer.Meta.fields + ["owner_email", "invitation_link", "existing_account"]


#
# Teams and memberships
#


class TeamSerializer(StrictModelSerializer):
    slug = slug_field()
    high_priority_until = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="The team holds high-priority status until then (null: it does not)."
    )

    class Meta:
        model = Team
        fields = ["id", "name", "slug", "high_priority_until", "created_at"]
        read_only_fields = ["id", "created_at"]
        validators = []  # the (tenant, slug) rule is the service's 409, not a 400 here


class MembershipSerializer(StrictModelSerializer):
    user = serializers.UUIDField(source="user_id", read_only=True)
    email = serializers.EmailField(source="user.email", read_only=True)
    full_name = serializers.CharField(source="user.full_name", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "user", "email", "full_name", "role", "created_at"]
        read_only_fields = ["id", "created_at"]


class TeamMembershipSerializer(StrictModelSerializer):
    team = ScopedRelatedField(queryset=Team.objects.all())
    user = TenantMemberField()
    email = serializers.EmailField(source="user.email", read_only=True)
    role = serializers.ChoiceField(choices=TeamRole.choices, default=TeamRole.MEMBER)

    class Meta:
        model = TeamMembership
        fields = ["id", "team", "user", "email", "role", "created_at"]
        read_only_fields = ["id", "created_at"]
        validators = []


class TeamMembershipUpdateSerializer(StrictSerializer):
    role = serializers.ChoiceField(choices=TeamRole.choices)


#
# Invitations
#


class InvitationSerializer(StrictModelSerializer):
    team = ScopedRelatedField(queryset=Team.objects.all(), required=False, allow_null=True)
    status = serializers.CharField(read_only=True)
    email = serializers.EmailField(max_length=254, required=False, allow_blank=True)

    class Meta:
        model = Invitation
        fields = ["id", "email", "role", "team", "team_role", "status", "created_at", "expires_at"]
        read_only_fields = ["id", "status", "created_at", "expires_at"]


class InvitationCreatedSerializer(InvitationSerializer):
    link = serializers.CharField(read_only=True, help_text="Shown once; give it to the person you invite.")

    class Meta(InvitationSerializer.Meta):
        fields = InvitationSerializer.Meta.fields + ["link"]


class InvitationAcceptSerializer(StrictSerializer):
    token = serializers.RegexField(r"^mri_[A-Za-z0-9_-]{43}$", max_length=64,
                                   error_messages={"invalid": "This is not an invitation token."})
    email = serializers.EmailField(max_length=254, required=False)
    password = serializers.CharField(max_length=128, required=False, write_only=True, trim_whitespace=False)

    def validate_password(self, value):
        from django.contrib.auth.password_validation import validate_password

        validate_password(value)
        return value


#
# API tokens
#


class APITokenSerializer(StrictModelSerializer):
    team = ScopedRelatedField(queryset=Team.objects.all(), required=False, allow_null=True)
    scope = serializers.ChoiceField(choices=TokenScope.choices, default=TokenScope.READ)
    user = serializers.EmailField(source="user.email", read_only=True)
    display = serializers.SerializerMethodField(help_text="The token's public prefix, to recognise it.")
    expires_at = serializers.DateTimeField(required=False, allow_null=True)
    expires_in_days = StrictIntegerField(
        required=False, min_value=1, max_value=36_500, write_only=True,
        help_text="Alternative to expires_at; at most the configured maximum (365 days by default).",
    )

    class Meta:
        model = APIToken
        fields = ["id", "name", "scope", "team", "user", "display", "created_at", "expires_at", "expires_in_days",
                  "revoked_at", "last_used_at"]
        read_only_fields = ["id", "created_at", "revoked_at", "last_used_at"]

    @extend_schema_field(serializers.CharField())
    def get_display(self, token) -> str:
        return f"mrd_{token.prefix}_…"

    def validate(self, attrs):
        days = attrs.pop("expires_in_days", None)
        if days is not None:
            if attrs.get("expires_at"):
                raise serializers.ValidationError({"expires_in_days": "Give expires_at or expires_in_days, not both."})
            if timedelta(days=days) > settings.MERIDIAN_TOKEN_MAX_TTL:
                raise serializers.ValidationError(
                    {"expires_in_days": f"A token may live at most {settings.MERIDIAN_TOKEN_MAX_TTL.days} days."}
                )
            attrs["expires_at"] = timezone.now() + timedelta(days=days)
        return attrs


class IssuedTokenSerializer(APITokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once: store it now.")

    class Meta(APITokenSerializer.Meta):
        fields = APITokenSerializer.Meta.fields + ["token"]


#
# Quotas
#


class QuotaSerializer(StrictModelSerializer):
    tenant = ScopedRelatedField(queryset=Tenant.objects.all())
    team = ScopedRelatedField(queryset=Team.objects.all(), required=False, allow_null=True)
    gpu_model = serializers.SlugRelatedField(
        slug_field="slug", queryset=GPUModel.objects.all(), required=False, allow_null=True
    )
    resource = serializers.ChoiceField(choices=QuotaResource.choices)
    limit = StrictIntegerField(min_value=0, max_value=1_000_000)

    class Meta:
        model = Quota
        fields = ["id", "tenant", "team", "resource", "gpu_model", "limit", "updated_at"]
        read_only_fields = ["id", "updated_at"]
        validators = []


class QuotaUpdateSerializer(StrictSerializer):
    limit = StrictIntegerField(min_value=0, max_value=1_000_000)


#
# High-priority applications
#


class HPFiguresSerializer(serializers.Serializer):
    fulfilment_rate_30d = serializers.FloatField(
        allow_null=True, help_text="Share of the last 30 days' scheduled reservations used as booked (null: none).")
    avg_release_delay_s = serializers.FloatField(
        help_text="Average seconds after their booked end that reservations gave their GPUs back (early: 0).")
    unplanned_changes_month = serializers.IntegerField(
        help_text="This calendar month's cancellations after scheduling and extensions.")


class HPThresholdsSerializer(serializers.Serializer):
    min_fulfilment = serializers.FloatField()
    max_avg_release_delay_s = serializers.FloatField()
    max_unplanned_changes = serializers.IntegerField()


class HPCheckSerializer(serializers.Serializer):
    name = serializers.CharField()
    value = serializers.FloatField(allow_null=True)
    rule = serializers.ChoiceField(choices=["above", "below", "at_most"])
    threshold = serializers.FloatField()
    met = serializers.BooleanField()


class HPSnapshotSerializer(serializers.Serializer):
    """The team's record as it was when the application was filed."""

    computed_at = serializers.DateTimeField()
    figures = HPFiguresSerializer()
    thresholds = HPThresholdsSerializer()
    checks = HPCheckSerializer(many=True)
    eligible = serializers.BooleanField()
    reasons = serializers.ListField(child=serializers.CharField(), help_text="One per threshold not met.")


class HighPriorityApplicationSerializer(serializers.ModelSerializer):
    team = serializers.UUIDField(source="team_id", read_only=True)
    team_name = serializers.CharField(source="team.name", read_only=True)
    applied_by = serializers.EmailField(source="applied_by.email", read_only=True, allow_null=True, default=None)
    reviewed_by = serializers.UUIDField(source="reviewed_by_id", read_only=True, allow_null=True)
    snapshot = HPSnapshotSerializer(read_only=True)

    class Meta:
        model = HighPriorityApplication
        fields = ["id", "team", "team_name", "state", "state_reason", "note", "override_note", "snapshot",
                  "applied_by", "created_at", "reviewed_by", "review_note", "reviewed_at", "expires_at",
                  "state_changed_at"]
        read_only_fields = fields


class HighPriorityApplySerializer(StrictSerializer):
    team = ScopedRelatedField(queryset=Team.objects.all())
    note = serializers.CharField(max_length=2000, help_text="Why the team needs high priority.")
    override_note = serializers.CharField(
        max_length=2000, required=False, allow_blank=True, default="",
        help_text="Platform admins only: why a team below the thresholds may apply anyway.",
    )


class HighPriorityReviewSerializer(StrictSerializer):
    decision = serializers.ChoiceField(choices=["approve", "reject"])
    note = serializers.CharField(max_length=2000, help_text="Why; shown to the team.")


#
# Notifications
#


class NotificationSerializer(serializers.ModelSerializer):
    user = serializers.UUIDField(source="user_id", read_only=True, allow_null=True,
                                 help_text="Addressed to this user; null: to everyone in the tenant (or team).")
    team = serializers.UUIDField(source="team_id", read_only=True, allow_null=True)

    class Meta:
        model = Notification
        fields = ["id", "kind", "title", "body", "link", "user", "team", "created_at", "read_at"]
        read_only_fields = fields


class MarkedReadSerializer(serializers.Serializer):
    marked_read = serializers.IntegerField()


#
# Me
#


class MyMembershipSerializer(serializers.Serializer):
    tenant = TenantSerializer()
    role = serializers.ChoiceField(choices=TenantRole.choices)


class PrincipalSerializer(serializers.Serializer):
    tenant = serializers.UUIDField(source="tenant.pk", allow_null=True, default=None)
    role = serializers.CharField(allow_null=True)
    scope = serializers.ChoiceField(choices=TokenScope.choices)
    team = serializers.UUIDField(source="team.pk", allow_null=True, default=None)
    token = serializers.UUIDField(source="token.pk", allow_null=True, default=None)
    platform = serializers.BooleanField(source="is_platform")


class MeSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    email = serializers.EmailField()
    full_name = serializers.CharField()
    platform_role = serializers.ChoiceField(choices=PlatformRole.choices)
    memberships = MyMembershipSerializer(many=True)
    acting_as = PrincipalSerializer()


class SSHKeySerializer(StrictModelSerializer):
    public_key = serializers.CharField(max_length=MAX_KEY_LENGTH, write_only=True, trim_whitespace=True,
                                       help_text="One OpenSSH public key line: ssh-ed25519, "
                                                 "ecdsa-sha2-nistp256/384/521 or ssh-rsa of at least 3072 bits.")
    shared = serializers.BooleanField(default=False, write_only=True,
                                      help_text="Shared by the whole tenant (tenant admins and owners only).")
    is_shared = serializers.SerializerMethodField(help_text="Whether the key is the tenant's (else its user's).")
    user = serializers.EmailField(source="user.email", read_only=True, allow_null=True, default=None)
    authorized_key = serializers.CharField(source="authorized_keys_line", read_only=True,
                                           help_text="The line an instance's authorized_keys gets.")

    class Meta:
        model = SSHKey
        fields = ["id", "name", "public_key", "shared", "is_shared", "user", "kind", "bits", "fingerprint", "comment",
                  "authorized_key", "created_at"]
        read_only_fields = ["id", "kind", "bits", "fingerprint", "comment", "created_at"]

    @extend_schema_field(serializers.BooleanField())
    def get_is_shared(self, key) -> bool:
        return key.user_id is None
