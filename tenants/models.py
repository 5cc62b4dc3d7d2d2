"""
Identity and tenancy: users, tenants, teams, memberships, invitations, quotas, API tokens,
high-priority applications and in-app notifications.
"""

import hashlib
import hmac
import uuid

from django.contrib.auth.models import AbstractBaseUser, BaseUserManager, PermissionsMixin
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower
from django.utils import timezone

from tenants.choices import PlatformRole, QuotaResource, TeamRole, TenantRole, TokenScope, kind_label
from tenants.scoping import TeamOwnedModel, TenantOwnedModel, TenantScopedQuerySet

SLUG_HELP = "Lower-case letters, digits and hyphens."


def secret_digest(secret: str) -> str:
    """SHA-256 of a high-entropy secret (token, invitation); never stored in the clear."""
    return hashlib.sha256(secret.encode()).hexdigest()


#
# Users
#


class UserManager(BaseUserManager):
    """Users log in by e-mail; the address is kept lower-case so it is unique regardless of case."""

    use_in_migrations = True

    def create_user(self, email, password=None, **extra):
        if not email:
            raise ValueError("An e-mail address is required.")
        user = self.model(email=self.normalize_email(email).lower(), **extra)
        if password:
            user.set_password(password)
        else:
            user.set_unusable_password()
        user.save(using=self._db)
        return user

    def create_superuser(self, email, password=None, **extra):
        extra.setdefault("platform_role", PlatformRole.ADMIN)
        extra["is_superuser"] = True
        return self.create_user(email, password, **extra)

    def get_by_natural_key(self, username):
        return self.get(email__iexact=username)


class User(AbstractBaseUser, PermissionsMixin):
    """A person. May belong to several tenants; platform staff carry a platform role."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    email = models.EmailField(max_length=254, unique=True)
    full_name = models.CharField(max_length=150, blank=True)
    platform_role = models.CharField(max_length=32, choices=PlatformRole.choices, default=PlatformRole.NONE, blank=True)
    is_active = models.BooleanField(default=True)
    date_joined = models.DateTimeField(default=timezone.now)

    objects = UserManager()

    USERNAME_FIELD = "email"
    EMAIL_FIELD = "email"
    REQUIRED_FIELDS: list[str] = []

    class Meta:
        constraints = [models.UniqueConstraint(Lower("email"), name="user_email_ci_unique")]

    def __str__(self):
        return self.email

    @property
    def is_staff(self) -> bool:
        """Django admin access: platform admins only."""
        return self.is_active and (self.is_superuser or self.platform_role == PlatformRole.ADMIN)

    def has_perm(self, perm, obj=None):
        return self.is_staff or super().has_perm(perm, obj)

    def has_module_perms(self, app_label):
        return self.is_staff or super().has_module_perms(app_label)


#
# Tenants and teams
#


class Tenant(models.Model):
    """A customer of the cloud: owns teams, reservations, VPCs and tokens; isolated from every other."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=50, unique=True, help_text=SLUG_HELP)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()
    tenant_path = "pk"
    team_path = None

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Team(TenantOwnedModel):
    """
    A group inside a tenant (a lab, a product team) that owns reservations and quotas. A team may
    hold high-priority status until ``high_priority_until`` (set by an approved application,
    cleared when it expires or is revoked; provisioning.high_priority.services changes it).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=50, help_text=SLUG_HELP)
    created_at = models.DateTimeField(auto_now_add=True)
    high_priority_until = models.DateTimeField(null=True, blank=True, db_index=True)
    high_priority_application = models.ForeignKey(
        "HighPriorityApplication", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The approved application the current high-priority status comes from.",
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "slug"], name="team_slug_unique_per_tenant",
                violation_error_message="A team with this slug already exists in the tenant.",
            )
        ]

    def __str__(self):
        return f"{self.tenant.slug}/{self.slug}"

    def is_high_priority(self, now=None) -> bool:
        """Whether the team holds high-priority status at ``now`` (default: this moment)."""
        now = now or timezone.now()
        return self.high_priority_until is not None and self.high_priority_until > now


class Membership(TenantOwnedModel):
    """A user's tenant-wide role. A tenant always keeps at least one owner (services enforce it)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=TenantRole.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_per_tenant"),
            models.CheckConstraint(condition=Q(role__in=TenantRole.values), name="membership_role_valid"),
        ]

    def __str__(self):
        return f"{self.user} in {self.tenant} as {self.role}"


class TeamMembership(models.Model):
    """A user's role in one team; the user must be a member of the team's tenant."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="team_memberships")
    role = models.CharField(max_length=16, choices=TeamRole.choices, default=TeamRole.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()
    tenant_path = "team__tenant"
    team_path = "team"

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(fields=["user", "team"], name="team_membership_unique"),
            models.CheckConstraint(condition=Q(role__in=TeamRole.values), name="team_membership_role_valid"),
        ]

    def __str__(self):
        return f"{self.user} in {self.team} as {self.role}"


class Invitation(TenantOwnedModel):
    """
    A one-time link that lets a person join a tenant (and optionally a team) with a role.

    Only the digest of the link's secret is stored; the link is shown once, to its creator.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField(blank=True, help_text="When set, only this address may accept.")
    role = models.CharField(max_length=16, choices=TenantRole.choices, default=TenantRole.MEMBER)
    team_role = models.CharField(max_length=16, choices=TeamRole.choices, default=TeamRole.MEMBER)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created_by = models.ForeignKey(User, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    revoked_at = models.DateTimeField(null=True, blank=True)

    team_path = "team"

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"invitation to {self.tenant} as {self.role}"

    @property
    def status(self) -> str:
        if self.accepted_at:
            return "accepted"
        if self.revoked_at:
            return "revoked"
        if self.expires_at <= timezone.now():
            return "expired"
        return "pending"


#
# Quotas
#


class Quota(TeamOwnedModel):
    """
    A limit on a tenant (team empty) or on one of its teams. GPU quotas may name a GPU model;
    without one they cap all models together. Read through ``tenants.quotas``, never directly.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    resource = models.CharField(max_length=16, choices=QuotaResource.choices)
    gpu_model = models.ForeignKey("cloud.GPUModel", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    limit = models.PositiveIntegerField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["resource", "limit"]
        constraints = [
            models.CheckConstraint(
                condition=Q(gpu_model__isnull=True) | Q(resource=QuotaResource.GPUS),
                name="quota_gpu_model_only_for_gpus",
                violation_error_message="Only a GPU quota may name a GPU model.",
            ),
            models.CheckConstraint(condition=Q(resource__in=QuotaResource.values), name="quota_resource_valid"),
            models.UniqueConstraint(
                fields=["tenant", "resource"], condition=Q(team__isnull=True, gpu_model__isnull=True),
                name="quota_unique_tenant",
                violation_error_message="This tenant already has a quota for this resource.",
            ),
            models.UniqueConstraint(
                fields=["tenant", "resource", "gpu_model"], condition=Q(team__isnull=True, gpu_model__isnull=False),
                name="quota_unique_tenant_model",
                violation_error_message="This tenant already has a quota for this GPU model.",
            ),
            models.UniqueConstraint(
                fields=["team", "resource"], condition=Q(team__isnull=False, gpu_model__isnull=True),
                name="quota_unique_team",
                violation_error_message="This team already has a quota for this resource.",
            ),
            models.UniqueConstraint(
                fields=["team", "resource", "gpu_model"], condition=Q(team__isnull=False, gpu_model__isnull=False),
                name="quota_unique_team_model",
                violation_error_message="This team already has a quota for this GPU model.",
            ),
        ]

    def __str__(self):
        owner = self.team or self.tenant
        model = f" {self.gpu_model.slug}" if self.gpu_model_id else ""
        return f"{owner}: {self.limit} {self.resource}{model}"

    def clean(self):
        super().clean()
        if self.gpu_model_id and self.resource != QuotaResource.GPUS:
            raise ValidationError({"gpu_model": "Only a GPU quota may name a GPU model."})


#
# API tokens
#


class APITokenQuerySet(TenantScopedQuerySet):
    def visible_to(self, principal, action="view"):
        """
        Members see their own tokens; tenant admins and owners see every token of the tenant;
        platform admins see and revoke any token, platform approvers read all and revoke their own.
        """
        if principal is not None and principal.is_platform and not principal.is_platform_admin:
            # Approvers read every token but change (revoke) only their own.
            return self.all() if action == "view" else self.filter(user=principal.user)
        qs = super().visible_to(principal, action)
        if principal is not None and not principal.is_platform and not principal.has_role(TenantRole.ADMIN):
            qs = qs.filter(user=principal.user)
        return qs


class APIToken(models.Model):
    """
    A bearer credential ``mrd_<prefix>_<secret>`` bound to one user and one tenant (optionally a
    team), or a platform token (no tenant) for staff. Stored as a lookup prefix and a SHA-256
    digest; the plaintext is returned once, when issued.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_tokens")
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="api_tokens")
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    scope = models.CharField(max_length=16, choices=TokenScope.choices, default=TokenScope.READ)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    digest = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="issued",
        help_text="The token that issued this one, if any: revoking it revokes this one.",
    )

    objects = APITokenQuerySet.as_manager()
    tenant_path = "tenant"
    team_path = "team"

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(scope__in=TokenScope.values), name="token_scope_valid"),
            models.CheckConstraint(
                condition=Q(team__isnull=True) | Q(tenant__isnull=False), name="token_team_needs_tenant"
            ),
        ]

    def __str__(self):
        return f"{self.name} (mrd_{self.prefix}_…)"

    def matches(self, secret_token: str) -> bool:
        return hmac.compare_digest(self.digest, secret_digest(secret_token))

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()


#
# High-priority applications
#


class HighPriorityState(models.TextChoices):
    """Lifecycle of a high-priority application; the legal moves are HP_TRANSITIONS."""

    PENDING = "pending", "Pending review"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    WITHDRAWN = "withdrawn", "Withdrawn"
    REVOKED = "revoked", "Revoked"
    EXPIRED = "expired", "Expired"


HP_TRANSITIONS = {
    HighPriorityState.PENDING: frozenset({HighPriorityState.APPROVED, HighPriorityState.REJECTED,
                                          HighPriorityState.WITHDRAWN}),
    HighPriorityState.APPROVED: frozenset({HighPriorityState.REVOKED, HighPriorityState.EXPIRED}),
}


class HighPriorityApplication(TenantOwnedModel):
    """
    A team's request for high-priority status, with the team's record frozen at application time
    (``snapshot``: the three figures, the thresholds, which were met, the verdict and its reasons)
    so the reviewer decides on what the team saw. One pending application per team (constraint);
    state moves only through provisioning.high_priority.services. ``override_note`` is set when a platform admin
    filed it for a team below the thresholds.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="high_priority_applications")
    applied_by = models.ForeignKey(User, null=True, on_delete=models.SET_NULL, related_name="+")
    note = models.TextField(max_length=2000, help_text="Why the team needs high priority.")
    state = models.CharField(max_length=16, choices=HighPriorityState.choices, default=HighPriorityState.PENDING)
    state_reason = models.TextField(blank=True, help_text="Why it was revoked or expired.")
    state_changed_at = models.DateTimeField(auto_now_add=True)
    snapshot = models.JSONField(default=dict, blank=True)
    override_note = models.TextField(max_length=2000, blank=True)
    reviewed_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    review_note = models.TextField(max_length=2000, blank=True)
    reviewed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    team_path = "team"

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["team"], condition=Q(state=HighPriorityState.PENDING), name="hp_application_one_pending",
                violation_error_message="The team already has a pending high-priority application.",
            ),
            models.CheckConstraint(condition=Q(state__in=HighPriorityState.values), name="hp_application_state_valid"),
        ]

    def __str__(self):
        return f"high priority for {self.team_id} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state not in HP_TRANSITIONS


#
# Notifications
#


class NotificationQuerySet(TenantScopedQuerySet):
    def visible_to(self, principal, action="view"):
        """
        A tenant principal sees the notifications addressed to it and those for everyone in its
        tenant (narrowed to its teams, as every team-owned row), and may mark those read whatever
        the action; staff read every tenant's but mark none (they are not the audience).
        """
        if principal is not None and principal.is_platform:
            return self.all() if action == "view" else self.none()
        qs = super().visible_to(principal, "view")
        if principal is None or principal.tenant is None:
            return qs
        return qs.filter(Q(user__isnull=True) | Q(user=principal.user))


class Notification(TenantOwnedModel):
    """
    An in-app message to a tenant: to one user (``user``), or to everyone in the tenant who may
    see it (no user; with ``team``, the team's members and the tenant's admins). Read state is
    per row: a tenant-wide notification marked read by one member is read for all of them, as a
    shared inbox would be (per-user read receipts can come with outbound delivery).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(User, null=True, blank=True, on_delete=models.CASCADE, related_name="notifications")
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="notifications")
    kind = models.CharField(max_length=64, help_text="What happened, dotted: 'high_priority.approved'.")
    title = models.CharField(max_length=200)
    body = models.TextField(blank=True)
    link = models.CharField(max_length=500, blank=True, help_text="A path on this site to the object concerned.")
    key = models.CharField(max_length=160, blank=True, default="",
                           help_text="What it reports, for a message sent once: a second one with the same key is "
                                     "not stored ('reservation.ready:<id>'); empty for messages that may repeat.")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    read_at = models.DateTimeField(null=True, blank=True)

    objects = NotificationQuerySet.as_manager()
    team_path = "team"

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant", "-created_at"], name="notification_tenant_recent_idx"),
            # The top bar counts a principal's unread ones on every page: only the unread are indexed.
            models.Index(fields=["tenant"], condition=Q(read_at__isnull=True), name="notification_unread_idx"),
        ]
        constraints = [
            # A retried step or a second tick that reports the same thing writes nothing (tenants.notifications).
            models.UniqueConstraint(fields=["key"], condition=~Q(key=""), name="notification_once_per_key"),
        ]

    def __str__(self):
        return f"{self.kind}: {self.title}"

    @property
    def kind_label(self) -> str:
        """The kind in words, for the console ('Reservation ready', not ``reservation.ready``)."""
        return kind_label(self.kind)


class SSHKeyQuerySet(TenantScopedQuerySet):
    def visible_to(self, principal, action="view"):
        """
        A member sees the tenant's shared keys and their own; tenant admins and owners see every
        key of the tenant (and change the shared ones); platform staff as for any tenant object.
        """
        qs = super().visible_to(principal, action)
        if principal is not None and not principal.is_platform and not principal.has_role(TenantRole.ADMIN):
            mine = Q(user=principal.user)
            qs = qs.filter(mine if action != "view" else (mine | Q(user__isnull=True)))
        return qs


class SSHKey(TenantOwnedModel):
    """
    An OpenSSH public key saved once and picked by id when reserving: a user's own (``user``) or
    shared by the whole tenant (no user; tenant admins add those). Parsed and fingerprinted when
    saved (``tenants.ssh_keys``); a tenant holds a key once. A removed key is no longer put on new
    instances (the reservations that named it lose it with it).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(User, null=True, blank=True, on_delete=models.CASCADE, related_name="ssh_keys",
                             help_text="Whose key it is; empty: shared by the tenant.")
    name = models.CharField(max_length=64)
    kind = models.CharField(max_length=32, help_text="The OpenSSH key type, e.g. ssh-ed25519.")
    bits = models.PositiveIntegerField()
    public_key = models.TextField(help_text="'<type> <base64>', as authorized_keys takes it (the comment apart).")
    comment = models.CharField(max_length=200, blank=True)
    fingerprint = models.CharField(max_length=64, help_text="SHA256:..., as ssh-keygen -l prints it.")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = SSHKeyQuerySet.as_manager()

    class Meta:
        ordering = ["name", "created_at"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "fingerprint"], name="ssh_key_once_per_tenant"),
        ]

    def __str__(self):
        return f"{self.name} ({self.fingerprint})"

    @property
    def authorized_keys_line(self) -> str:
        return f"{self.public_key} {self.comment}".strip()



class Event(TenantOwnedModel):
    """
    Something a tenant may be told of outside Meridian (``tenants.events``; webhooks send it): written
    in the transaction of the change it reports, so a rolled-back change tells nobody and a committed
    one is picked up (``dispatched_at``) by the webhooks' dispatcher.
    """

    id = models.BigAutoField(primary_key=True)
    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                             db_constraint=False)
    type = models.CharField(max_length=64, help_text="Dotted: 'reservation.state', 'budget.crossed'.")
    data = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)
    dispatched_at = models.DateTimeField(null=True, blank=True)

    team_path = "team"

    class Meta:
        indexes = [models.Index(fields=["id"], condition=Q(dispatched_at__isnull=True), name="event_undispatched_idx"),
                   models.Index(fields=["created_at"], name="event_created_idx")]

    def __str__(self):
        return f"{self.type} {self.public_id}"
