"""
Who may do what: one table from resource and kind of request to the least role that may.

"read" covers the safe methods, "write" the others; a DRF action name (``create``, ``accept``)
overrides either for that action. A tenant role means "this role or above in the principal's
tenant". Object-level rules (an admin cannot touch an owner; a team admin manages only their
team) live in the services, next to the change they guard. Visibility is not decided here: the
tenant-scoped queryset does that, and what a principal cannot see answers 404.
"""

from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import SAFE_METHODS, BasePermission

from core.errors import DomainError
from tenants.choices import TenantRole

ANY = "any"  # any signed-in principal, in a tenant or platform-wide (catalogue reads, own tokens)
PLATFORM = "platform"  # any platform role (staff reads)
PLATFORM_ADMIN = "platform_admin"
NOBODY = "nobody"

VIEWER, MEMBER, ADMIN, OWNER = TenantRole.VIEWER, TenantRole.MEMBER, TenantRole.ADMIN, TenantRole.OWNER

POLICIES: dict[str, dict[str, str]] = {
    "tenants": {"read": VIEWER, "write": OWNER, "create": PLATFORM_ADMIN},
    "teams": {"read": VIEWER, "write": ADMIN},
    "memberships": {"read": VIEWER, "write": ADMIN},
    "team-memberships": {"read": VIEWER, "write": MEMBER},  # tenant admins, or the team's own admins (service)
    "invitations": {"read": ADMIN, "write": ADMIN},
    "api-tokens": {"read": ANY, "write": ANY},  # one's own; admins see the tenant's (queryset)
    "ssh-keys": {"read": VIEWER, "write": MEMBER},  # one's own and the shared ones; admins all (queryset)
    "quotas": {"read": VIEWER, "write": PLATFORM_ADMIN},
    # Team members and tenant admins apply (platform admins on a team's behalf) and withdraw; the
    # service decides who may apply, the review action admits platform reviewers only (views).
    "high-priority-applications": {"read": VIEWER, "write": MEMBER, "create": ANY, "review": ANY},
    "notifications": {"read": VIEWER, "write": VIEWER},  # one's own and the tenant's (queryset)
    "audit-events": {"read": ADMIN, "write": NOBODY},
    "audit-chain": {"read": PLATFORM_ADMIN, "write": NOBODY},
    # Staff's hand on waiting work (priority, hold, let go, cancel with a reason, contact): platform admins.
    "reservations": {"read": VIEWER, "write": MEMBER, "priority": PLATFORM_ADMIN, "hold": PLATFORM_ADMIN,
                     "let_go": PLATFORM_ADMIN, "operator_cancel": PLATFORM_ADMIN, "contact": PLATFORM_ADMIN},
    # The staff queue page and its actions in the console.
    "queue": {"read": PLATFORM, "write": PLATFORM_ADMIN},
    "operations": {"read": VIEWER, "write": NOBODY},
    # Console output may hold what a tenant's script printed: members and above read it.
    "instances": {"read": VIEWER, "write": NOBODY, "console": MEMBER},
    "vpcs": {"read": VIEWER, "write": MEMBER},
    "volumes": {"read": VIEWER, "write": MEMBER},
    "checkpoints": {"read": VIEWER, "write": MEMBER},
    "snapshots": {"read": VIEWER, "write": MEMBER},
    "prices": {"read": ANY, "write": PLATFORM_ADMIN},
    "spot-prices": {"read": ANY, "write": NOBODY},
    "usage": {"read": VIEWER, "write": NOBODY},
    # An invoice covers every team of the tenant: its admins and owners read it; staff issue credit notes.
    "budgets": {"read": VIEWER, "write": ADMIN},
    "commitments": {"read": VIEWER, "write": ADMIN},
    "credits": {"read": ADMIN, "write": NOBODY, "create": PLATFORM_ADMIN},
    "webhooks": {"read": ADMIN, "write": ADMIN},
    "endpoints": {"read": VIEWER, "write": MEMBER},
    "invoices": {"read": ADMIN, "write": NOBODY, "credit_notes": PLATFORM_ADMIN, "partial_update": ADMIN},
    "storage-classes": {"read": ANY, "write": PLATFORM_ADMIN},
    "regions": {"read": ANY, "write": PLATFORM_ADMIN},
    "gpu-models": {"read": ANY, "write": PLATFORM_ADMIN},
    "offerings": {"read": ANY, "write": PLATFORM_ADMIN},
    "images": {"read": ANY, "write": ANY},  # public ones by platform admins, a tenant's by its members (service)
    "fabrics": {"read": PLATFORM, "write": PLATFORM_ADMIN},
    "nodes": {"read": PLATFORM, "write": PLATFORM_ADMIN},
    "gpus": {"read": PLATFORM, "write": PLATFORM_ADMIN},
    "trust-anchors": {"read": PLATFORM, "write": PLATFORM_ADMIN},
    "revocations": {"read": PLATFORM, "write": PLATFORM_ADMIN},
    "reference-measurements": {"read": PLATFORM, "write": PLATFORM_ADMIN},
    "reference-manifests": {"read": PLATFORM, "write": PLATFORM_ADMIN},
    "ocsp-statuses": {"read": PLATFORM, "write": PLATFORM_ADMIN},
    "attestation-reports": {"read": PLATFORM, "write": NOBODY},
    # SLA figures per tenant and month: the tenant reads its own (members: their teams' reservations), staff all.
    "sla": {"read": VIEWER, "write": NOBODY},
    # Incidents: a tenant reads its own (queryset); platform admins acknowledge, assign and resolve.
    "incidents": {"read": VIEWER, "write": PLATFORM_ADMIN},
}

READ_ONLY_TOKEN = "This API token is read-only."
TENANT_REQUIRED = "Choose a tenant with the X-Meridian-Tenant header (id or slug)."


def required_role(policy: str, action: str | None, method: str) -> str:
    rules = POLICIES[policy]
    return rules.get(action or "", rules["read" if method in SAFE_METHODS else "write"])


def allows(principal, need: str, *, safe: bool) -> bool:
    """Whether ``principal`` meets ``need``; raises a 400 when a tenant must be chosen first."""
    if need == NOBODY or principal is None:
        return False
    if principal.is_platform:
        if need == PLATFORM_ADMIN:
            return principal.is_platform_admin
        # Platform staff read everything; outside platform resources they change only their own tokens.
        return safe or need == ANY
    if need in (PLATFORM, PLATFORM_ADMIN):
        return False
    if need == ANY:
        return True
    if principal.tenant is None:
        raise DomainError(TENANT_REQUIRED, code="tenant_required")
    return principal.has_role(need)


class WritableCredentials(BasePermission):
    """For views open to anyone: a caller who does send a token must send a read-write one to write."""
    def has_permission(self, request, view):
        principal = getattr(request, "principal", None)
        if request.method not in SAFE_METHODS and principal is not None and not principal.can_write:
            raise PermissionDenied(READ_ONLY_TOKEN, code="token_read_only")
        return True


class RolePolicy(BasePermission):
    """Applies POLICIES and the token's scope to every request of a Meridian viewset."""
    def has_permission(self, request, view):
        principal = getattr(request, "principal", None)
        if principal is None:
            return False
        safe = request.method in SAFE_METHODS
        if not safe and not principal.can_write:
            raise PermissionDenied(READ_ONLY_TOKEN, code="token_read_only")
        return allows(principal, required_role(view.policy, getattr(view, "action", None), request.method), safe=safe)
