"""
The console's tenant pages: API tokens, teams and members (with invitations), and quotas with
their usage. Thin, like the API's views: each parses a form, calls one service with
``actor=request.principal`` and renders; a service's refusal becomes a form error or a flash
message. Rows are read through ``web.console.scoped``, so another tenant's object is a 404.

Secrets (a new token, an invitation link) are shown once: the create handler keeps the secret
in the session only until the next page, which takes it out as it shows it, so a reload or the
back button never shows it again.
"""

from __future__ import annotations

import time

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.password_validation import validate_password
from django.core.paginator import Paginator
from django.db.models import Prefetch
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from core.errors import DomainError
from security import crypto
from tenants import services
from tenants import services as tenant_services
from tenants.choices import TeamRole, TenantRole
from tenants.forms import (
    InvitationForm,
    MembershipRoleForm,
    SSHKeyForm,
    TeamForm,
    TeamMembershipAddForm,
    TeamMembershipRoleForm,
    TokenForm,
    grantable_roles,
)
from tenants.models import APIToken, Invitation, Membership, SSHKey, Team, TeamMembership
from web.console import (
    CHANGE,
    add_domain_error,
    console_page,
    error_text,
    may,
    scoped,
    scoped_or_404,
)

PAGE_SIZE = 50
ISSUED_TOKEN = "console_issued_token"
INVITATION_LINK = "console_invitation_link"
# A new secret crosses the redirect to its one showing encrypted (sessions are signed, not
# encrypted, and live in the database) and only for this long.
SEALED_FOR_S = 120


def _sealed(object_id, secret: str) -> dict:
    return {"id": str(object_id), "sealed": crypto.encrypt(secret), "until": time.time() + SEALED_FOR_S}


def _unsealed(request, key: str, object_id) -> str | None:
    """The secret held for ``object_id``'s page, taken out of the session (shown once), if still fresh."""
    held = request.session.get(key) or {}
    if held.get("id") != str(object_id):
        return None
    request.session.pop(key)
    return crypto.decrypt(held["sealed"]) if held.get("until", 0) >= time.time() else None


def _row_or_redirect(request, template: str, context: dict, *, to: str, message: str = "", error: str = ""):
    """
    The answer to a row action: the row again for htmx (swapped in place, the outcome in it);
    otherwise a flash message and back to the page (post/redirect/get).
    """
    if request.htmx:
        return render(request, template, {**context, "row_message": message, "row_error": error})
    if error:
        messages.error(request, error)
    elif message:
        messages.success(request, message)
    return redirect(to)


#
# API tokens
#


@console_page("api-tokens")
def token_list(request):
    """Your tokens (tenant admins and owners: every token of the tenant) and a form for a new one."""
    return _token_page(request, TokenForm(principal=request.principal))


@console_page("api-tokens")
def token_create(request):
    if request.method != "POST":
        return redirect("token-list")
    form = TokenForm(request.POST, principal=request.principal)
    if form.is_valid():
        try:
            issued = services.token_issue(actor=request.principal, **form.service_arguments())
        except DomainError as exc:
            add_domain_error(form, exc, aliases={"expires_at": "expires_in_days"})
        else:
            request.session[ISSUED_TOKEN] = _sealed(issued.token.pk, issued.secret)
            return redirect("token-issued", pk=issued.token.pk)
    return _token_page(request, form)


def _token_page(request, form: TokenForm):
    principal = request.principal
    # The API's queryset (APITokenViewSet): the scoped tokens with their user and team.
    tokens = scoped(request, APIToken).select_related("user", "team").order_by("-created_at")
    page = Paginator(tokens, PAGE_SIZE).get_page(request.GET.get("page"))
    revocable = set(scoped(request, APIToken, CHANGE).filter(pk__in=[t.pk for t in page]).values_list("pk", flat=True))
    for token in page:
        token.revocable = token.pk in revocable
    return render(request, "tenants/token_list.html", {
        "page": page, "form": form, "show_owner": principal.is_platform or principal.has_role(TenantRole.ADMIN),
    })


@never_cache
@console_page("api-tokens")
def token_issued(request, pk):
    """The new token's secret, once: taken out of the session as it is shown."""
    token = scoped_or_404(request, APIToken.objects.select_related("team"), pk=pk)
    secret = _unsealed(request, ISSUED_TOKEN, token.pk)
    return render(request, "tenants/token_issued.html", {"token": token, "secret": secret})


@require_POST
@console_page("api-tokens")
def token_revoke(request, pk):
    token = scoped_or_404(request, APIToken.objects.select_related("user", "team"), CHANGE, pk=pk)
    error = message = ""
    try:
        services.token_revoke(actor=request.principal, token=token)
    except DomainError as exc:
        error = error_text(exc)
    else:
        message = f"Token {token.name} is revoked; it stops working on its next request."
    token.refresh_from_db(fields=["revoked_at"])
    token.revocable = token.revoked_at is None
    show_owner = request.principal.is_platform or request.principal.has_role(TenantRole.ADMIN)
    return _row_or_redirect(request, "tenants/_token_row.html", {"token": token, "show_owner": show_owner},
                            to="token-list", message=message, error=error)


#
# SSH keys
#


@console_page("ssh-keys")
def ssh_key_list(request):
    """Your saved SSH keys and the tenant's shared ones (tenant admins: every key), and a form for a new one."""
    if request.principal.tenant is None:
        return redirect("console-tenants")
    return _ssh_keys_page(request, SSHKeyForm(principal=request.principal))


@require_POST
@console_page("ssh-keys")
def ssh_key_create(request):
    form = SSHKeyForm(request.POST, principal=request.principal)
    if form.is_valid():
        try:
            key = services.ssh_key_add(actor=request.principal, name=form.cleaned_data["name"],
                                       public_key=form.cleaned_data["public_key"],
                                       shared=form.cleaned_data.get("shared", False))
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            messages.success(request, f"Key {key.name} is saved ({key.fingerprint}).")
            return redirect("ssh-key-list")
    return _ssh_keys_page(request, form, status=400)


@require_POST
@console_page("ssh-keys")
def ssh_key_remove(request, pk):
    key = scoped_or_404(request, SSHKey, CHANGE, pk=pk)
    try:
        services.ssh_key_remove(actor=request.principal, key=key)
    except DomainError as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(request, f"Key {key.name} is removed: new instances no longer get it.")
    return redirect("ssh-key-list")


def _ssh_keys_page(request, form: SSHKeyForm, status: int = 200):
    keys = list(scoped(request, SSHKey).select_related("user").order_by("name", "created_at"))
    removable = set(scoped(request, SSHKey, CHANGE).filter(pk__in=[k.pk for k in keys]).values_list("pk", flat=True))
    for key in keys:
        key.removable = key.pk in removable
    return render(request, "tenants/ssh_key_list.html", {"keys": keys, "form": form}, status=status)


#
# Teams and members
#


@console_page("teams")
def team_list(request):
    """The tenant's teams with their members, the tenant's members, invitations and the forms."""
    if request.principal.tenant is None:
        return redirect("console-tenants")
    return _teams_page(request)


def _teams_page(request, *, team_form=None, invitation_form=None, add_errors=None):
    principal = request.principal
    can_manage_members = may(principal, "memberships")
    memberships = list(scoped(request, Membership).select_related("user").order_by("user__email"))
    for membership in memberships:
        membership.manageable = can_manage_members and principal.has_role(TenantRole(membership.role))
    teams = list(
        scoped(request, Team).order_by("name").prefetch_related(Prefetch(
            "memberships", to_attr="members",
            queryset=scoped(request, TeamMembership).select_related("user").order_by("user__email"),
        ))
    )
    tenant_admin = principal.has_role(TenantRole.ADMIN)
    for team in teams:
        team.manageable = tenant_admin or principal.is_team_admin(team.pk)
        team.members_visible = principal.sees_all_teams or team.pk in principal.team_ids
        in_team = {tm.user_id for tm in team.members}
        team.addable = [m.user for m in memberships if m.user_id not in in_team]
        team.add_errors = (add_errors or {}).get(team.pk, [])
    can_invite = may(principal, "invitations")
    invitations = []
    if may(principal, "invitations", write=False):
        invitations = list(
            scoped(request, Invitation).filter(accepted_at__isnull=True, revoked_at__isnull=True,
                                               expires_at__gt=timezone.now())
            .select_related("team", "created_by").order_by("-created_at")
        )
    return render(request, "tenants/team_list.html", {
        "teams": teams, "memberships": memberships, "invitations": invitations,
        "roles": grantable_roles(principal), "team_roles": TeamRole.choices,
        "can_manage_members": can_manage_members, "can_invite": can_invite,
        "can_read_invitations": may(principal, "invitations", write=False),
        "invitation_ttl_days": settings.MERIDIAN_INVITATION_TTL.days,
        "team_form": team_form or TeamForm(auto_id="team_%s"),
        "invitation_form": invitation_form or (InvitationForm(principal=principal, auto_id="invite_%s")
                                               if can_invite else None),
    })


@require_POST
@console_page("teams")
def team_create(request):
    form = TeamForm(request.POST, auto_id="team_%s")
    if form.is_valid():
        try:
            team = services.team_create(actor=request.principal, **form.cleaned_data)
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            messages.success(request, f"Team {team.name} is created. Add its members below.")
            return redirect("team-list")
    return _teams_page(request, team_form=form)


def _membership_row(request, membership: Membership, *, message="", error=""):
    membership.manageable = may(request.principal, "memberships") and request.principal.has_role(
        TenantRole(membership.role))
    return _row_or_redirect(request, "tenants/_member_row.html",
                            {"m": membership, "roles": grantable_roles(request.principal)},
                            to="team-list", message=message, error=error)


@require_POST
@console_page("memberships")
def membership_role(request, pk):
    membership = scoped_or_404(request, Membership.objects.select_related("user"), CHANGE, pk=pk)
    form = MembershipRoleForm(request.POST)
    if not form.is_valid():
        return _membership_row(request, membership, error="Choose one of the roles: owner, admin, member or viewer.")
    try:
        membership = services.membership_set_role(actor=request.principal, membership=membership,
                                                  role=form.cleaned_data["role"])
    except DomainError as exc:
        return _membership_row(request, membership, error=error_text(exc))
    return _membership_row(request, membership,
                           message=f"{membership.user.email} is now {membership.get_role_display().lower()}.")


@require_POST
@console_page("memberships")
def membership_remove(request, pk):
    membership = scoped_or_404(request, Membership.objects.select_related("user"), CHANGE, pk=pk)
    try:
        services.membership_remove(actor=request.principal, membership=membership)
    except DomainError as exc:
        return _membership_row(request, membership, error=error_text(exc))
    message = f"{membership.user.email} left the tenant; their tokens for it are revoked."
    return _row_or_redirect(request, "tenants/_removed_row.html", {"columns": 4}, to="team-list", message=message)


@require_POST
@console_page("team-memberships")
def team_membership_add(request, team_pk):
    team = scoped_or_404(request, Team, CHANGE, pk=team_pk)
    form = TeamMembershipAddForm(request.POST, principal=request.principal)
    if form.is_valid():
        try:
            tm = services.team_membership_add(actor=request.principal, team=team, **form.cleaned_data)
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            messages.success(request, f"{tm.user.email} joined {team.name} as {tm.get_role_display().lower()}.")
            return redirect("team-list")
    errors = [f"{form.fields[name].label}: {' '.join(errs)}" if name in form.fields else " ".join(errs)
              for name, errs in form.errors.items()]
    return _teams_page(request, add_errors={team.pk: errors})


def _team_member_row(request, tm: TeamMembership, *, message="", error=""):
    principal = request.principal
    tm.team.manageable = principal.has_role(TenantRole.ADMIN) or principal.is_team_admin(tm.team_id)
    return _row_or_redirect(request, "tenants/_team_member_row.html",
                            {"tm": tm, "team": tm.team, "team_roles": TeamRole.choices},
                            to="team-list", message=message, error=error)


@require_POST
@console_page("team-memberships")
def team_membership_role(request, pk):
    tm = scoped_or_404(request, TeamMembership.objects.select_related("user", "team"), CHANGE, pk=pk)
    form = TeamMembershipRoleForm(request.POST)
    if not form.is_valid():
        return _team_member_row(request, tm, error="Choose team admin or team member.")
    try:
        tm = services.team_membership_set_role(actor=request.principal, team_membership=tm,
                                               role=form.cleaned_data["role"])
    except DomainError as exc:
        return _team_member_row(request, tm, error=error_text(exc))
    return _team_member_row(request, tm, message=f"{tm.user.email} is now {tm.get_role_display().lower()}.")


@require_POST
@console_page("team-memberships")
def team_membership_remove(request, pk):
    tm = scoped_or_404(request, TeamMembership.objects.select_related("user", "team"), CHANGE, pk=pk)
    try:
        services.team_membership_remove(actor=request.principal, team_membership=tm)
    except DomainError as exc:
        return _team_member_row(request, tm, error=error_text(exc))
    message = f"{tm.user.email} left {tm.team.name}."
    return _row_or_redirect(request, "tenants/_removed_row.html", {"columns": 3}, to="team-list", message=message)


#
# Invitations
#


@require_POST
@console_page("invitations")
def invitation_create(request):
    form = InvitationForm(request.POST, principal=request.principal, auto_id="invite_%s")
    if form.is_valid():
        try:
            invitation, link = services.invitation_create(actor=request.principal, **form.cleaned_data)
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            request.session[INVITATION_LINK] = _sealed(invitation.pk, link)
            return redirect("invitation-created", pk=invitation.pk)
    return _teams_page(request, invitation_form=form)


@never_cache
@console_page("invitations")
def invitation_created(request, pk):
    """The new invitation's link, once: taken out of the session as it is shown."""
    invitation = scoped_or_404(request, Invitation.objects.select_related("team"), pk=pk)
    link = _unsealed(request, INVITATION_LINK, invitation.pk)
    return render(request, "tenants/invitation_created.html", {"invitation": invitation, "link": link})


@require_POST
@console_page("invitations")
def invitation_revoke(request, pk):
    invitation = scoped_or_404(request, Invitation.objects.select_related("team", "created_by"), CHANGE, pk=pk)
    error = message = ""
    try:
        services.invitation_revoke(actor=request.principal, invitation=invitation)
    except DomainError as exc:
        error = error_text(exc)
    else:
        message = f"The invitation{f' for {invitation.email}' if invitation.email else ''} is revoked."
    invitation.refresh_from_db(fields=["revoked_at", "accepted_at"])
    return _row_or_redirect(request, "tenants/_invitation_row.html", {"i": invitation, "can_invite": True},
                            to="team-list", message=message, error=error)


#
# Quotas and usage
#


class AcceptInvitationForm(forms.Form):
    email = forms.EmailField(label="E-mail (the address you were invited at)")
    password = forms.CharField(label="Choose a password", widget=forms.PasswordInput, min_length=10)

    def clean_password(self):
        password = self.cleaned_data["password"]
        validate_password(password)
        return password


INVITATION_SESSION_KEY = "invitation_secret"


def invitation_open(request, secret: str):
    """
    The link in an invitation. Its secret moves into the session at once and the browser is
    sent on, so the secret stays out of later requests, Referer headers and page URLs.
    """
    request.session[INVITATION_SESSION_KEY] = secret
    return redirect("invitation-accept-page")


def invitation_accept(request):
    """Join a tenant from the invitation opened in this session: signed-in users join as themselves."""
    secret = request.session.get(INVITATION_SESSION_KEY)
    if not secret:
        messages.error(request, tenant_services.INVITATION_INVALID)
        return redirect("login")
    signed_in = request.user.is_authenticated
    form = None if signed_in else AcceptInvitationForm(request.POST or None)
    if request.method == "POST" and (signed_in or form.is_valid()):
        try:
            membership = tenant_services.invitation_accept(
                secret=secret, user=request.user if signed_in else None,
                email="" if signed_in else form.cleaned_data["email"],
                password="" if signed_in else form.cleaned_data["password"],
            )
        except DomainError as exc:
            messages.error(request, str(exc.detail))
        else:
            request.session.pop(INVITATION_SESSION_KEY, None)
            if not signed_in:
                login(request, membership.user, backend="django.contrib.auth.backends.ModelBackend")
            messages.success(request, f"You joined {membership.tenant.name} as {membership.role}.")
            return redirect("home")
    return render(request, "tenants/invitation_accept.html", {"form": form})
