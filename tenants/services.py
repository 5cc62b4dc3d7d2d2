"""
State changes of tenants, teams, memberships, invitations, tokens and quotas.

Each service is the one door for its change: keyword-only, atomic, checks the cross-row rules
(last owner, last team admin, who may grant which role), and writes exactly one audit event in
the same transaction. Views and serializers parse input; services decide.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from core.errors import Conflict, DomainError, Forbidden
from security.audit import audit_record, snapshot
from tenants.choices import PlatformRole, QuotaResource, TeamRole, TenantRole, TokenScope
from tenants.models import (
    APIToken,
    Invitation,
    Membership,
    Quota,
    SSHKey,
    Team,
    TeamMembership,
    Tenant,
    User,
    secret_digest,
)
from tenants.scoping import Principal
from tenants.ssh_keys import parse_public_key
from tenants.token_cache import auth_changed

TOKEN_PREFIX = "mrd_"
INVITATION_PREFIX = "mri_"

LAST_OWNER = "A tenant must keep at least one owner; make someone else owner first."
LAST_TEAM_ADMIN = "A team must keep at least one team admin; make someone else team admin first."
ROLE_ABOVE_YOURS = "You cannot grant or change a role above your own."
ONLY_OWNER_GRANTS_OWNER = "Only an owner can make someone an owner or change an owner's role."


def _require_tenant_actor(actor: Principal) -> Tenant:
    if actor.tenant is None:
        raise Forbidden("This action is taken inside a tenant; choose one with the X-Meridian-Tenant header.")
    return actor.tenant


#
# Tenants and teams
#


@dataclass(frozen=True)
class TenantCreated:
    tenant: Tenant
    invitation: Invitation
    invitation_link: str
    existing_account: bool


@transaction.atomic
def tenant_create(*, actor: Principal | None, name: str, slug: str, owner_email: str) -> TenantCreated:
    """
    Create a tenant (staff only) with an owner invitation bound to ``owner_email``; its link is
    returned once. The owner joins by accepting it: a new address creates its account there, an
    existing account signs in first. Nobody becomes owner without the link, so an account that
    merely carries the address (made earlier through another tenant) gains nothing by it;
    ``existing_account`` tells staff such an account exists.
    """
    if Tenant.objects.filter(slug=slug).exists():
        raise Conflict(f"A tenant with slug '{slug}' already exists.", code="duplicate")
    tenant = Tenant.objects.create(name=name, slug=slug)
    invitation, link = _new_invitation(tenant=tenant, team=None, email=owner_email, role=TenantRole.OWNER,
                                       team_role=TeamRole.MEMBER, created_by=getattr(actor, "user", None))
    audit_record(actor=actor, action="tenant.create", target=tenant, tenant_id=tenant.pk,
                 after=snapshot(tenant, ["name", "slug"]) | {"owner_email": owner_email})
    existing = User.objects.filter(email__iexact=owner_email).exists()
    return TenantCreated(tenant=tenant, invitation=invitation, invitation_link=link, existing_account=existing)


@transaction.atomic
def tenant_update(*, actor: Principal, tenant: Tenant, name: str) -> Tenant:
    """Rename a tenant (its owners). The slug is its stable handle and does not change."""
    before = snapshot(tenant, ["name"])
    tenant.name = name
    tenant.save(update_fields=["name"])
    audit_record(actor=actor, action="tenant.update", target=tenant, tenant_id=tenant.pk, before=before,
                 after=snapshot(tenant, ["name"]))
    return tenant


@transaction.atomic
def team_create(*, actor: Principal, name: str, slug: str) -> Team:
    """Create a team in the actor's tenant. A duplicate slug is a 409."""
    tenant = _require_tenant_actor(actor)
    try:
        with transaction.atomic():
            team = Team.objects.create(tenant=tenant, name=name, slug=slug)
    except IntegrityError:
        raise Conflict(f"A team with slug '{slug}' already exists in this tenant.", code="duplicate") from None
    audit_record(actor=actor, action="team.create", target=team, after=snapshot(team, ["name", "slug"]))
    return team


@transaction.atomic
def team_update(*, actor: Principal, team: Team, **changes) -> Team:
    """Rename a team or change its slug."""
    before = snapshot(team, list(changes))
    for field, value in changes.items():
        setattr(team, field, value)
    try:
        with transaction.atomic():
            team.save(update_fields=list(changes))
    except IntegrityError:
        raise Conflict("A team with this slug already exists in this tenant.", code="duplicate") from None
    audit_record(actor=actor, action="team.update", target=team, before=before, after=snapshot(team, list(changes)))
    return team


@transaction.atomic
def team_delete(*, actor: Principal, team: Team) -> None:
    """Delete a team that owns nothing any more (its memberships go with it)."""
    from django.db.models import ProtectedError

    before = snapshot(team, ["name", "slug"])
    audit_record(actor=actor, action="team.delete", target=team, before=before)
    try:
        with transaction.atomic():
            team.delete()
    except ProtectedError:
        raise Conflict("The team still owns quotas or other objects; remove them first.", code="protected") from None


#
# Memberships
#


def _check_can_grant(actor: Principal, *, current: str | None, new: str | None) -> None:
    """An admin manages viewers, members and admins; only an owner touches owners."""
    touches_owner = TenantRole.OWNER in (current, new)
    if touches_owner and not actor.has_role(TenantRole.OWNER):
        raise Forbidden(ONLY_OWNER_GRANTS_OWNER)
    for role in (current, new):
        if role and not actor.has_role(TenantRole(role)):
            raise Forbidden(ROLE_ABOVE_YOURS)


def _owner_count(tenant: Tenant) -> int:
    """The tenant's owners (their rows are locked by _lock_membership, so two demotions cannot both pass)."""
    return Membership.objects.filter(tenant=tenant, role=TenantRole.OWNER).count()


def _lock_membership(membership: Membership) -> Membership:
    """
    Lock the membership and the tenant's owners in one query, always in primary-key order (so two
    changes never deadlock), then re-read it: the role checks see what the update will change.
    """
    list(
        Membership.objects.select_for_update(of=("self",))
        .filter(Q(pk=membership.pk) | Q(tenant_id=membership.tenant_id, role=TenantRole.OWNER))
        .order_by("pk")
    )
    return Membership.objects.select_related("user", "tenant").get(pk=membership.pk)


@transaction.atomic
def membership_set_role(*, actor: Principal, membership: Membership, role: str) -> Membership:
    """Change a member's tenant role; the last owner cannot be demoted (409)."""
    membership = _lock_membership(membership)
    if membership.role == role:
        return membership
    _check_can_grant(actor, current=membership.role, new=role)
    if membership.role == TenantRole.OWNER and _owner_count(membership.tenant) <= 1:
        raise Conflict(LAST_OWNER, code="last_owner")
    before = snapshot(membership, ["role"])
    membership.role = role
    membership.save(update_fields=["role"])
    audit_record(actor=actor, action="membership.update", target=membership, before=before,
                 after=snapshot(membership, ["role"]))
    return membership


@transaction.atomic
def membership_remove(*, actor: Principal, membership: Membership) -> None:
    """
    Remove a user from a tenant: their team memberships go, and their tokens for the tenant are
    revoked, so the removal takes effect on their next request. The last owner stays (409).
    """
    membership = _lock_membership(membership)
    _check_can_grant(actor, current=membership.role, new=None)
    if membership.role == TenantRole.OWNER and _owner_count(membership.tenant) <= 1:
        raise Conflict(LAST_OWNER, code="last_owner")
    tenant, user = membership.tenant, membership.user
    audit_record(actor=actor, action="membership.delete", target=membership,
                 before=snapshot(membership, ["user", "role"]))
    TeamMembership.objects.filter(team__tenant=tenant, user=user).delete()
    APIToken.objects.filter(tenant=tenant, user=user, revoked_at__isnull=True).update(revoked_at=timezone.now())
    membership.delete()  # its signal tells every process's token cache (tenants.token_cache)


def _check_team_manager(actor: Principal, team: Team) -> None:
    if not actor.has_role(TenantRole.ADMIN) and not actor.is_team_admin(team.pk):
        raise Forbidden("Only tenant admins and the team's admins manage its members.")


def _lock_team_membership(tm: TeamMembership) -> TeamMembership:
    """Lock the team membership and the team's admins in primary-key order, then re-read it."""
    list(
        TeamMembership.objects.select_for_update(of=("self",))
        .filter(Q(pk=tm.pk) | Q(team_id=tm.team_id, role=TeamRole.ADMIN))
        .order_by("pk")
    )
    return TeamMembership.objects.select_related("team", "user").get(pk=tm.pk)


def _team_admin_count(team: Team) -> int:
    return TeamMembership.objects.filter(team=team, role=TeamRole.ADMIN).count()


@transaction.atomic
def team_membership_add(*, actor: Principal, team: Team, user: User, role: str = TeamRole.MEMBER) -> TeamMembership:
    """Add a member of the tenant to one of its teams."""
    _check_team_manager(actor, team)
    if not Membership.objects.filter(tenant=team.tenant_id, user=user).exists():
        raise DomainError("The user is not a member of this tenant; invite them first.", code="not_a_member")
    try:
        with transaction.atomic():
            tm = TeamMembership.objects.create(team=team, user=user, role=role)
    except IntegrityError:
        raise Conflict("The user is already in this team.", code="duplicate") from None
    audit_record(actor=actor, action="team_membership.create", target=tm, tenant_id=team.tenant_id,
                 after=snapshot(tm, ["team", "user", "role"]))
    return tm


@transaction.atomic
def team_membership_set_role(*, actor: Principal, team_membership: TeamMembership, role: str) -> TeamMembership:
    """Change a team role; the last team admin cannot be demoted (409)."""
    _check_team_manager(actor, team_membership.team)
    team_membership = _lock_team_membership(team_membership)
    if team_membership.role == role:
        return team_membership
    if team_membership.role == TeamRole.ADMIN and _team_admin_count(team_membership.team) <= 1:
        raise Conflict(LAST_TEAM_ADMIN, code="last_team_admin")
    before = snapshot(team_membership, ["role"])
    team_membership.role = role
    team_membership.save(update_fields=["role"])
    audit_record(actor=actor, action="team_membership.update", target=team_membership,
                 tenant_id=team_membership.team.tenant_id, before=before, after=snapshot(team_membership, ["role"]))
    return team_membership


@transaction.atomic
def team_membership_remove(*, actor: Principal, team_membership: TeamMembership) -> None:
    """Take a user out of a team; the last team admin stays (409) while others remain."""
    team = team_membership.team
    _check_team_manager(actor, team)
    team_membership = _lock_team_membership(team_membership)
    if team_membership.role == TeamRole.ADMIN and _team_admin_count(team) <= 1 and team.memberships.count() > 1:
        raise Conflict(LAST_TEAM_ADMIN, code="last_team_admin")
    audit_record(actor=actor, action="team_membership.delete", target=team_membership, tenant_id=team.tenant_id,
                 before=snapshot(team_membership, ["team", "user", "role"]))
    team_membership.delete()


#
# Invitations
#


def _invitation_link(secret: str) -> str:
    return f"{settings.MERIDIAN_PUBLIC_URL.rstrip('/')}/invitations/{secret}/"


def _new_invitation(*, tenant, team, email, role, team_role, created_by) -> tuple[Invitation, str]:
    secret = INVITATION_PREFIX + secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        tenant=tenant, team=team, email=(email or "").lower(), role=role, team_role=team_role,
        digest=secret_digest(secret), created_by=created_by,
        expires_at=timezone.now() + settings.MERIDIAN_INVITATION_TTL,
    )
    return invitation, _invitation_link(secret)


@transaction.atomic
def invitation_create(
    *, actor: Principal, role: str, email: str = "", team: Team | None = None, team_role: str = TeamRole.MEMBER
) -> tuple[Invitation, str]:
    """Invite someone to the actor's tenant; returns the invitation and its link (shown once)."""
    tenant = _require_tenant_actor(actor)
    _check_can_grant(actor, current=None, new=role)
    if email and Membership.objects.filter(tenant=tenant, user__email__iexact=email).exists():
        raise Conflict(f"{email} is already a member of this tenant.", code="already_member")
    invitation, link = _new_invitation(tenant=tenant, team=team, email=email, role=role, team_role=team_role,
                                       created_by=actor.user)
    audit_record(actor=actor, action="invitation.create", target=invitation,
                 after=snapshot(invitation, ["email", "role", "team", "team_role", "expires_at"]))
    return invitation, link


@transaction.atomic
def invitation_revoke(*, actor: Principal, invitation: Invitation) -> None:
    """Revoke a pending invitation; one no longer pending (even by a concurrent accept) is a 409."""
    now = timezone.now()
    revoked = Invitation.objects.filter(
        pk=invitation.pk, accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=now
    ).update(revoked_at=now)
    if not revoked:
        invitation.refresh_from_db()
        raise Conflict(f"The invitation is {invitation.status} and cannot be revoked.", code="invalid_state")
    audit_record(actor=actor, action="invitation.revoke", target=invitation, after={"status": "revoked"})


INVITATION_INVALID = "This invitation link is not valid: it may be mistyped, used, revoked or expired."
SIGN_IN_REQUIRED = "Sign in to accept this invitation; it is not addressed to a new account."


@transaction.atomic
def invitation_accept(*, secret: str, user: User | None, email: str = "", password: str = "") -> Membership:
    """
    Join the invitation's tenant (and team). A signed-in user joins as themselves (if the link
    names an address, it must be theirs). A new account can be made only from a link addressed
    to that very address, and never for an address that already has an account: a link can
    never be used to claim somebody's account or address. Any mismatch says only that the link
    is not valid.
    """
    invitation = (
        Invitation.objects.select_for_update().filter(digest=secret_digest(secret)).select_related("tenant").first()
    )
    if invitation is None or invitation.status != "pending":
        raise DomainError(INVITATION_INVALID, code="invitation_invalid")
    bound_to = invitation.email.lower()
    if user is None:
        if not bound_to:
            raise DomainError(SIGN_IN_REQUIRED, code="sign_in_required")
        if not email or not password:
            raise DomainError("Give the invited e-mail address and a password to create your account.",
                              code="credentials_required")
        if email.lower() != bound_to:
            raise DomainError(INVITATION_INVALID, code="invitation_invalid")
        if User.objects.filter(email__iexact=email).exists():
            raise Conflict("An account with this e-mail exists; sign in and open the link again.",
                           code="account_exists")
        user = User.objects.create_user(email, password)
    elif bound_to and bound_to != user.email.lower():
        raise DomainError(INVITATION_INVALID, code="invitation_invalid")
    membership, created = Membership.objects.get_or_create(
        tenant=invitation.tenant, user=user, defaults={"role": invitation.role}
    )
    if not created and TenantRole(invitation.role).rank > TenantRole(membership.role).rank:
        membership.role = invitation.role
        membership.save(update_fields=["role"])
    if invitation.team_id:
        TeamMembership.objects.get_or_create(team=invitation.team, user=user, defaults={"role": invitation.team_role})
    invitation.accepted_at = timezone.now()
    invitation.accepted_by = user
    invitation.save(update_fields=["accepted_at", "accepted_by"])
    audit_record(actor=user, action="invitation.accept", target=invitation,
                 after={"user": str(user.pk), "role": membership.role})
    return membership


def invitation_expire_all() -> int:
    """Drop invitations that expired more than a day ago (beat); returns how many went."""
    cutoff = timezone.now() - timedelta(days=1)
    deleted, _ = Invitation.objects.filter(accepted_at__isnull=True, expires_at__lt=cutoff).delete()
    return deleted


#
# API tokens
#


@dataclass(frozen=True)
class IssuedToken:
    token: APIToken
    secret: str


@transaction.atomic
def token_issue(
    *, actor: Principal, name: str, scope: str = TokenScope.READ, expires_at: datetime | None = None,
    team: Team | None = None,
) -> IssuedToken:
    """
    Issue a token for the acting user in the acting tenant (or a platform token for staff acting
    platform-wide). Its expiry may not pass MERIDIAN_TOKEN_MAX_TTL, nor the expiry of the token
    that issues it; a team-bound token needs the user to be in that team; a tenant viewer's
    tokens only read (403 ``token_scope_exceeds_role`` for read_write). The plaintext is
    returned here and never again.
    """
    if actor.tenant is None and actor.platform_role == PlatformRole.NONE:
        raise Forbidden("Choose a tenant with the X-Meridian-Tenant header to issue a token.")
    now = timezone.now()
    if expires_at is not None and expires_at <= now:
        raise DomainError({"expires_at": "The expiry must be in the future."}, code="invalid")
    if expires_at is not None and expires_at > now + settings.MERIDIAN_TOKEN_MAX_TTL:
        raise DomainError({"expires_at": f"A token may live at most {settings.MERIDIAN_TOKEN_MAX_TTL.days} days."},
                          code="invalid")
    parent_expiry = actor.token.expires_at if actor.token is not None else None
    if parent_expiry is not None and (expires_at is None or expires_at > parent_expiry):
        raise DomainError({"expires_at": "A token cannot outlive the token that issues it, which expires "
                                         f"{parent_expiry:%Y-%m-%d %H:%M} UTC: ask for an earlier expiry (or issue "
                                         "the token from a console session)."}, code="invalid")
    if team is not None and team.pk not in actor.team_roles and not actor.sees_all_teams:
        raise Forbidden("You can bind a token only to a team you belong to.")
    if actor.team is not None and (team is None or team.pk != actor.team.pk):
        raise Forbidden("A team-bound token can only issue tokens for its own team.")
    if scope == TokenScope.READ_WRITE and not actor.can_write:
        raise Forbidden("A read-only token cannot issue a read-write token.")
    if scope == TokenScope.READ_WRITE and actor.tenant is not None and not actor.has_role(TenantRole.MEMBER):
        raise Forbidden("A viewer's tokens only read: ask for scope 'read'.", code="token_scope_exceeds_role")
    prefix = secrets.token_hex(6)
    secret = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    # A token issued by a token lives only as long as the token it came from (revoking that one
    # revokes this one too); chains are kept one level deep, pointing at the root.
    parent = None if actor.token is None else (actor.token.parent or actor.token)
    token = APIToken.objects.create(
        user=actor.user, tenant=actor.tenant, team=team, name=name, scope=scope, prefix=prefix,
        digest=secret_digest(secret), expires_at=expires_at, parent=parent,
    )
    audit_record(actor=actor, action="api_token.create", target=token,
                 after=snapshot(token, ["name", "scope", "team", "expires_at", "prefix"]))
    return IssuedToken(token=token, secret=secret)


@transaction.atomic
def token_revoke(*, actor: Principal, token: APIToken) -> None:
    """
    Revoke a token and the tokens it issued; they stop working on the next request. Revoking
    twice changes nothing.
    """
    now = timezone.now()
    updated = APIToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now)
    auth_changed()  # an UPDATE sends no signal: every process's token cache is told here
    if updated:
        children = APIToken.objects.filter(parent=token, revoked_at__isnull=True).update(revoked_at=now)
        audit_record(actor=actor, action="api_token.revoke", target=token,
                     after={"revoked": True, "issued_tokens_revoked": children})


#
# Quotas
#


@transaction.atomic
def quota_set(
    *, actor: Principal, tenant: Tenant, resource: str, limit: int, team: Team | None = None, gpu_model=None
) -> tuple[Quota, bool]:
    """
    Create or change a quota (platform admins); returns it and whether it is new. One row per
    tenant/team, resource and GPU model.
    """
    if team is not None and team.tenant_id != tenant.pk:
        raise DomainError({"team": "The team belongs to another tenant."}, code="invalid")
    if gpu_model is not None and resource != QuotaResource.GPUS:
        raise DomainError({"gpu_model": "Only a GPU quota may name a GPU model."}, code="invalid")
    quota = Quota.objects.select_for_update().filter(
        tenant=tenant, team=team, resource=resource, gpu_model=gpu_model
    ).first()
    before = snapshot(quota, ["limit"]) if quota else None
    if quota is None:
        quota = Quota.objects.create(tenant=tenant, team=team, resource=resource, gpu_model=gpu_model, limit=limit)
    else:
        quota.limit = limit
        quota.save(update_fields=["limit", "updated_at"])
    audit_record(actor=actor, action="quota.set", target=quota, before=before,
                 after=snapshot(quota, ["team", "resource", "gpu_model", "limit"]))
    return quota, before is None


@transaction.atomic
def quota_delete(*, actor: Principal, quota: Quota) -> None:
    """Remove a quota row; the tenant's (or the default) limit applies again."""
    audit_record(actor=actor, action="quota.delete", target=quota,
                 before=snapshot(quota, ["team", "resource", "gpu_model", "limit"]))
    quota.delete()


#
# SSH keys
#


@transaction.atomic
def ssh_key_add(*, actor: Principal, name: str, public_key: str, shared: bool = False) -> SSHKey:
    """
    Save an OpenSSH public key for the principal (``shared``: for the whole tenant; tenant admins
    only). 400 names what is wrong with the key; 409 when the tenant holds that key already.
    """
    if actor.tenant is None or actor.user is None:
        raise Forbidden("SSH keys belong to a tenant's users: choose a tenant.", code="tenant_required")
    if shared and not actor.has_role(TenantRole.ADMIN):
        raise Forbidden("Only tenant admins and owners add keys shared by the whole tenant.",
                        code="insufficient_role", required_role=TenantRole.ADMIN)
    try:
        parsed = parse_public_key(public_key)
    except ValueError as exc:
        raise DomainError({"public_key": [str(exc)]}, code="invalid") from None
    if SSHKey.objects.filter(tenant_id=actor.tenant.pk, fingerprint=parsed.fingerprint).exists():
        raise Conflict(f"This tenant holds this key already ({parsed.fingerprint}).", code="ssh_key_exists")
    try:
        with transaction.atomic():
            key = SSHKey.objects.create(
                tenant_id=actor.tenant.pk, user=None if shared else actor.user, name=name.strip()[:64],
                kind=parsed.kind, bits=parsed.bits, public_key=parsed.line, comment=parsed.comment,
                fingerprint=parsed.fingerprint)
    except IntegrityError:
        raise Conflict(f"This tenant holds this key already ({parsed.fingerprint}).", code="ssh_key_exists") from None
    audit_record(actor=actor, action="ssh_key.add", target=key,
                 after={"name": key.name, "fingerprint": key.fingerprint, "kind": key.kind, "shared": shared})
    return key


@transaction.atomic
def ssh_key_remove(*, actor: Principal, key: SSHKey) -> None:
    """
    Remove a key: its owner, or a tenant admin (who alone may remove a shared one). Instances
    running keep it; new instances, of any reservation that named it, no longer get it.
    """
    if (key.user_id is None or key.user_id != getattr(actor.user, "pk", None)) and not (
            actor.is_platform_admin or actor.has_role(TenantRole.ADMIN)):
        raise Forbidden("Only the key's owner or a tenant admin removes it.", code="insufficient_role",
                        required_role=TenantRole.ADMIN)
    audit_record(actor=actor, action="ssh_key.remove", target=key,
                 before={"name": key.name, "fingerprint": key.fingerprint, "shared": key.user_id is None})
    key.delete()
