"""
Tenant scoping, enforced once at the queryset.

A request is served on behalf of a :class:`Principal`: a user acting inside one tenant (with the
rights of their current role there, narrowed by the token's scope and team), or platform staff
acting platform-wide. Every query a tenant can reach goes through
``Model.objects.visible_to(principal, action)``; the API base viewset and the console mixin are
its only callers, so a view never filters by tenant by hand. Internal code (tasks, scheduler,
admin) works platform-wide on purpose and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from uuid import UUID

from django.db import models
from django.db.models import Q

from tenants.choices import PlatformRole, TeamRole, TenantRole, TokenScope

if TYPE_CHECKING:
    from tenants.models import APIToken, Team, Tenant, User

VIEW = "view"
CHANGE = "change"


@dataclass(frozen=True)
class Principal:
    """Who a request acts as, from the current memberships (a token's: see tenants.token_cache)."""

    user: User
    tenant: Tenant | None = None
    role: TenantRole | None = None
    token: APIToken | None = None
    scope: TokenScope = TokenScope.READ_WRITE
    # A token bound to one team narrows the principal to that team.
    team: Team | None = None
    team_roles: dict[UUID, TeamRole] = field(default_factory=dict)

    @property
    def platform_role(self) -> PlatformRole:
        return PlatformRole(self.user.platform_role)

    @property
    def is_platform(self) -> bool:
        """Acting platform-wide: staff with no tenant chosen (a platform token, or a staff session)."""
        return self.tenant is None and self.platform_role != PlatformRole.NONE

    @property
    def is_platform_admin(self) -> bool:
        return self.is_platform and self.platform_role == PlatformRole.ADMIN

    @property
    def can_write(self) -> bool:
        return self.scope == TokenScope.READ_WRITE

    def has_role(self, minimum: TenantRole) -> bool:
        """The tenant role reaches ``minimum``. A team-bound token acts inside its team only, so
        tenant-wide it counts as a member at most, whatever its user's role."""
        if self.role is None:
            return False
        role = TenantRole(self.role)
        if self.team is not None and role.at_least(TenantRole.ADMIN):
            role = TenantRole.MEMBER
        return role.at_least(minimum)

    @property
    def sees_all_teams(self) -> bool:
        """Tenant admins and owners see every team's objects, unless a team-bound token narrows them."""
        return self.has_role(TenantRole.ADMIN)

    @property
    def team_ids(self) -> frozenset[UUID]:
        if self.team is not None:
            return frozenset({self.team.pk})
        return frozenset(self.team_roles)

    def is_team_admin(self, team_id: UUID) -> bool:
        if self.team is not None and self.team.pk != team_id:
            return False
        return self.team_roles.get(team_id) == TeamRole.ADMIN


class PlatformQuerySet(models.QuerySet):
    """Platform-owned rows: staff see all of them; tenants see them only where a model opts in."""

    tenant_readable = False

    def visible_to(self, principal, action="view"):
        if principal is None:
            return self.none()
        if principal.is_platform:
            return self.all() if (action == "view" or principal.is_platform_admin) else self.none()
        return self.all() if (self.tenant_readable and action == "view") else self.none()


class TenantScopedQuerySet(models.QuerySet):
    """QuerySet of a tenant-owned model; ``visible_to`` is the one scoping rule."""

    def visible_to(self, principal: Principal | None, action: str = VIEW) -> TenantScopedQuerySet:
        """
        Rows the principal may see (``view``) or act on (``change``).

        Platform admins see everything; platform approvers may see but not change; a principal in
        a tenant sees that tenant's rows, narrowed to its teams where the model is team-owned and
        the principal is not a tenant admin; anyone else sees nothing.
        """
        if principal is None:
            return self.none()
        if principal.is_platform:
            if action == VIEW or principal.is_platform_admin:
                return self.all()
            return self.none()
        if principal.tenant is None:
            return self.none()
        qs = self.filter(**{self.model.tenant_path: principal.tenant.pk})
        team_path = self.model.team_path
        if team_path and principal.team is not None and action == CHANGE:
            # A team-bound token reads tenant-wide objects but changes only its team's.
            return qs.filter(**{f"{team_path}__in": principal.team_ids})
        if team_path and not principal.sees_all_teams:
            qs = qs.filter(Q(**{f"{team_path}__isnull": True}) | Q(**{f"{team_path}__in": principal.team_ids}))
        return qs


class TenantOwnedModel(models.Model):
    """Abstract base of every model a tenant owns: a tenant FK and the scoped manager."""

    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="%(app_label)s_%(class)s_set"
    )

    objects = TenantScopedQuerySet.as_manager()

    # Lookup from this model to its tenant's primary key, and to its owning team (None: not team-owned).
    tenant_path = "tenant"
    team_path: str | None = None

    class Meta:
        abstract = True


class TeamOwnedModel(TenantOwnedModel):
    """A tenant-owned model that may also belong to one team of that tenant."""

    team = models.ForeignKey(
        "tenants.Team", null=True, blank=True, on_delete=models.PROTECT, related_name="%(app_label)s_%(class)s_set"
    )

    team_path = "team"

    class Meta:
        abstract = True

    def clean(self):
        super().clean()
        from django.core.exceptions import ValidationError

        if self.team_id and self.tenant_id and self.team.tenant_id != self.tenant_id:
            raise ValidationError({"team": "The team belongs to another tenant."})
