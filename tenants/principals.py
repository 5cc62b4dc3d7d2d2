"""Who a request acts as: built from the token or the session, and the user's current roles."""

import uuid

from rest_framework.exceptions import NotFound

from core import log_context
from tenants.authentication import authenticate_token, check_token, token_prefix, token_revoked
from tenants.choices import PlatformRole, TenantRole
from tenants.models import APIToken, Membership, TeamMembership, User
from tenants.scoping import Principal
from tenants.token_cache import TOKENS, copies

TENANT_HEADER = "X-Meridian-Tenant"


def load_team_roles(user: User, tenant_id) -> dict:
    return dict(TeamMembership.objects.filter(user=user, team__tenant_id=tenant_id).values_list("team_id", "role"))


def principal_for_token(token: APIToken) -> Principal:
    """
    The principal of a token: its scope intersected with its user's *current* role, so a
    demotion or a removal takes effect on the next request. A token whose user left the tenant
    (or the token's team, or lost the platform role) no longer works.
    """
    return _principal(token, *_roles(token))


def principal_for_bearer(raw: str) -> Principal:
    """
    ``principal_for_token(authenticate_token(raw))``, from rows this process read a moment ago
    when nothing that decides them has changed since (tenants.token_cache): the secret, expiry
    and revocation are checked against them on every request.
    """
    def resolve():
        token = authenticate_token(raw)
        return (token, *_roles(token))

    token, role, team_roles = TOKENS.get(token_prefix(raw), resolve)
    check_token(token, raw)  # another secret under a remembered prefix, expiry, the last-used write
    return _principal(copies(token), role, dict(team_roles))


def _roles(token: APIToken) -> tuple[TenantRole | None, dict]:
    """The token's user's role in the token's tenant and team roles there (None and {} for a platform token)."""
    if token.tenant_id is None:
        if token.user.platform_role == PlatformRole.NONE:
            raise token_revoked()
        return None, {}
    membership = Membership.objects.filter(tenant_id=token.tenant_id, user=token.user).first()
    if membership is None:
        raise token_revoked()
    team_roles = load_team_roles(token.user, token.tenant_id)
    if token.team_id and token.team_id not in team_roles and not TenantRole(membership.role).at_least(TenantRole.ADMIN):
        raise token_revoked()
    return TenantRole(membership.role), team_roles


def _principal(token: APIToken, role: TenantRole | None, team_roles: dict) -> Principal:
    if token.tenant_id is None:
        return Principal(user=token.user, token=token, scope=token.scope)
    return Principal(user=token.user, tenant=token.tenant, role=role, token=token, scope=token.scope,
                     team=token.team, team_roles=team_roles)


def principal_for_session(user: User, tenant_hint: str | None) -> Principal:
    """
    A signed-in browser or session client acts in the tenant it names (by id or slug) in the
    X-Meridian-Tenant header, else in its only tenant; staff without a header act platform-wide.
    Naming a tenant the user is not in is a 404, as if it did not exist.
    """
    memberships = list(Membership.objects.filter(user=user).select_related("tenant"))
    chosen = None
    if tenant_hint:
        hint = tenant_hint.strip()
        for m in memberships:
            if m.tenant.slug == hint or str(m.tenant_id) == _as_uuid(hint):
                chosen = m
        if chosen is None:
            raise NotFound(f"No tenant '{hint[:60]}' among yours.", code="tenant_not_found")
    elif len(memberships) == 1 and user.platform_role == PlatformRole.NONE:
        chosen = memberships[0]
    if chosen is None:
        return Principal(user=user)
    log_context.set_tenant(chosen.tenant)  # the request's log lines say whose it is from here on
    return Principal(user=user, tenant=chosen.tenant, role=TenantRole(chosen.role),
                     team_roles=load_team_roles(user, chosen.tenant_id))


def _as_uuid(value: str) -> str | None:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None


def principal_for_request(request) -> Principal | None:
    """The principal of an authenticated DRF request (token or session), None when anonymous."""
    if not request.user or not request.user.is_authenticated:
        return None
    if isinstance(request.auth, APIToken):
        return getattr(request, "bearer_principal", None) or principal_for_token(request.auth)
    return principal_for_session(request.user, request.headers.get(TENANT_HEADER))
