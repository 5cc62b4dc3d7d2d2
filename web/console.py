"""
The console's plumbing: who a page acts as, what it may do, and the tenant and team switchers.

A console page is a plain Django view wrapped in :func:`console_page`. The wrapper resolves the
principal exactly as a session API call does (``principal_for_session``, the tenant chosen by the
switcher instead of a header), applies the API's role table (``tenants.permissions.POLICIES``)
to the request, and hands the page :func:`scoped` for its queries, so a page can only read what
the same user could read through the API: another tenant's object is a 404, a viewer's post a 403.
"""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from rest_framework.exceptions import NotFound
from rest_framework.permissions import SAFE_METHODS

from core.errors import DomainError
from tenants.choices import PlatformRole, TenantRole
from tenants.models import Membership, Team
from tenants.notifications import unread_count
from tenants.permissions import PLATFORM, PLATFORM_ADMIN, allows, required_role
from tenants.principals import principal_for_session
from tenants.scoping import CHANGE, VIEW, Principal

SESSION_TENANT = "console_tenant"
SESSION_TEAM = "console_team"


def console_principal(request) -> Principal:
    """The signed-in user in the tenant chosen with the switcher (a tenant they left is forgotten)."""
    hint = request.session.get(SESSION_TENANT)
    try:
        return principal_for_session(request.user, hint)
    except NotFound:
        request.session.pop(SESSION_TENANT, None)
        request.session.pop(SESSION_TEAM, None)
        return principal_for_session(request.user, None)


def may(principal: Principal | None, policy: str, *, write: bool = True, action: str | None = None) -> bool:
    """Whether ``principal`` may read (or write) ``policy``'s resource, by the API's own table."""
    try:
        return allows(principal, required_role(policy, action, "POST" if write else "GET"), safe=not write)
    except DomainError:  # a tenant must be chosen first
        return False


def console_page(policy: str, *, action: str | None = None, platform: bool = False):
    """
    Wrap a console view: signed in, a principal on ``request.principal``, the role table applied
    (reads need ``read``, posts ``write`` or ``action``). ``platform`` pages are staff pages: a
    tenant member gets a 404 there, as the API answers for what one cannot see.
    """
    def wrap(view):
        @login_required
        @wraps(view)
        def page(request, *args, **kwargs):
            principal = console_principal(request)
            request.principal = principal
            if platform and principal.platform_role == PlatformRole.NONE:
                raise Http404("No such page.")
            if platform and not principal.is_platform:
                # Staff acting in a tenant switch to the platform view for staff pages.
                request.session.pop(SESSION_TENANT, None)
                request.principal = principal = console_principal(request)
            safe = request.method in SAFE_METHODS
            try:
                allowed = allows(principal, required_role(policy, action, request.method), safe=safe)
            except DomainError:
                return redirect("console-tenants")
            if not allowed:
                return forbidden(request, refusal(principal, required_role(policy, action, request.method)))
            try:
                return view(request, *args, **kwargs)
            except PermissionDenied as exc:  # a view's own refusal: its words on the console's page
                return forbidden(request, str(exc) or refusal(principal, None))

        page.console_policy = policy
        return page

    return wrap


def refusal(principal: Principal, need: str | None) -> str:
    """Why ``principal`` may not do this, in a person's words: the role it has, the one it needs, whom to ask."""
    if need in (PLATFORM, PLATFORM_ADMIN):
        return "Only platform admins may do this."
    if principal.tenant is None:
        return "Your platform role may read this page but not change it."
    tenant, role = principal.tenant.name, TenantRole(principal.role).label.lower() if principal.role else "none"
    wanted = f"; this needs {TenantRole(need).label.lower()} or above" if need in TenantRole.values else ""
    return f"Your role in {tenant} is {role}{wanted}. An owner or admin of {tenant} can change your role."


def forbidden(request, reason: str) -> HttpResponse:
    """
    The console's 403: its page, with the reason and a way back. Answered, not raised, so Django
    logs one warning line for it rather than a traceback.
    """
    return render(request, "403.html", {"reason": reason}, status=403)


def scoped(request, model_or_queryset, action: str = VIEW):
    """The rows of a model (or a queryset of it) this page's principal may see (or change): the one scoping rule."""
    queryset = model_or_queryset.objects.all() if isinstance(model_or_queryset, type) else model_or_queryset
    return queryset.visible_to(request.principal, action)


def scoped_or_404(request, model, action: str = VIEW, **lookup):
    return get_object_or_404(scoped(request, model, action), **lookup)


def chosen_team_id(request):
    """The team picked in the switcher, if it is still one of the principal's (else None: all)."""
    team_id = request.session.get(SESSION_TEAM)
    principal = getattr(request, "principal", None)
    if not team_id or principal is None or principal.tenant is None:
        return None

    try:
        if scoped(request, Team).filter(pk=team_id).exists():
            return team_id
    except (ValueError, ValidationError):  # not a team id at all
        pass
    request.session.pop(SESSION_TEAM, None)
    return None


def messages_of(detail) -> list[str]:
    """A DomainError's detail (a text, a list, or a mapping of field -> messages) as plain sentences."""
    if isinstance(detail, dict):
        return [text for value in detail.values() for text in messages_of(value)]
    if isinstance(detail, list | tuple):
        return [text for value in detail for text in messages_of(value)]
    return [str(detail)]


def error_text(exc: DomainError) -> str:
    """A service's refusal as one sentence, for a flash message."""
    return " ".join(messages_of(exc.detail))


def add_domain_error(form, exc: DomainError, aliases: dict[str, str] | None = None) -> None:
    """
    Put a service's refusal on ``form``: a field mapping lands on the fields it names (through
    ``aliases`` where the service's name differs from the form's), anything else above the form.
    """
    detail = exc.detail
    if isinstance(detail, dict):
        for name, value in detail.items():
            field = (aliases or {}).get(name, name)
            form.add_error(field if field in form.fields else None, messages_of(value))
        return
    form.add_error(None, messages_of(detail))


ACRONYMS = {"api": "API", "vpc": "VPC", "vpcs": "VPCs", "gpu": "GPU", "gpus": "GPUs", "ib": "IB", "bmc": "BMC",
            "sla": "SLA", "mig": "MIG", "hp": "high-priority"}


def words(code: str) -> str:
    """A dotted or snake-case code in words, for a page: 'api_token.create' reads 'API token create'."""
    parts = [ACRONYMS.get(word, word) for word in code.replace(".", " ").replace("_", " ").split()]
    text = " ".join(parts)
    return text[:1].upper() + text[1:]


class Abilities:
    """``{% if can.reservations %}``: whether the page's principal may write that resource."""
    def __init__(self, principal: Principal | None):
        self.principal = principal

    def __getitem__(self, policy: str) -> bool:
        return may(self.principal, policy)

    def __contains__(self, policy: str) -> bool:
        return self[policy]


def context(request) -> dict:
    """Template context for every page: the principal, the switchers' choices and ``can``."""
    principal = getattr(request, "principal", None)
    if principal is None:
        return {}

    def tenants():
        rows = Membership.objects.filter(user=request.user).select_related("tenant").order_by("tenant__name")
        return [m.tenant for m in rows]

    def teams():
        return list(Team.objects.visible_to(principal).order_by("name")) if principal.tenant else []

    def unread():
        return unread_count(principal)

    # The switchers and the unread count are read only by pages that draw the top bar (templates
    # call a callable): the htmx partials polled every few seconds run no query for them.
    return {
        "principal": principal,
        "can": Abilities(principal),
        "switch_tenants": tenants,
        "switch_teams": teams,
        "unread_notifications": unread,
        "chosen_team": request.session.get(SESSION_TEAM) or "",
        "is_staff_view": principal.is_platform,
        "sees_audit": may(principal, "audit-events", write=False),
        "sees_billing": may(principal, "invoices", write=False),
        "sees_webhooks": may(principal, "webhooks", write=False),
        "staff": principal.platform_role != PlatformRole.NONE,
    }


__all__ = ["CHANGE", "VIEW", "add_domain_error", "chosen_team_id", "console_page", "context", "error_text", "forbidden",
           "may", "messages_of", "refusal", "scoped", "scoped_or_404", "words"]
