"""
The console's entry pages: sign-in, the dashboard, the tenant and team switchers, and accepting
an invitation. They use the same scoping and services as the API (cloud.console).
"""

import uuid

from django import forms
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.password_validation import validate_password
from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from cloud import dashboard
from cloud.console import SESSION_TEAM, SESSION_TENANT, console_page, console_principal
from cloud.errors import DomainError
from tenants import services as tenant_services
from tenants.models import Membership


class EmailAuthenticationForm(AuthenticationForm):
    username = forms.EmailField(label="E-mail", widget=forms.EmailInput(attrs={"autofocus": True,
                                                                               "autocomplete": "email"}))


class LoginView(auth_views.LoginView):
    form_class = EmailAuthenticationForm
    redirect_authenticated_user = True


class LogoutView(auth_views.LogoutView):
    pass


@console_page("reservations")
def home(request):
    """The tenant's dashboard; staff acting platform-wide land on the fleet."""
    principal = request.principal
    if principal.tenant is None:
        return redirect("staff-fleet" if principal.is_platform else "console-tenants")
    return render(request, "console/dashboard.html", dashboard.summary(request, now=timezone.now()))


@login_required
def tenants_choose(request):
    """Where a user in several tenants (or none) picks one."""
    memberships = Membership.objects.filter(user=request.user).select_related("tenant").order_by("tenant__name")
    request.principal = console_principal(request)
    return render(request, "console/tenants.html", {"memberships": memberships})


@login_required
@require_POST
def switch(request):
    """The switchers: act in another tenant (by slug; empty is the platform view for staff) or team."""
    tenant = request.POST.get("tenant", "").strip()
    if tenant != request.session.get(SESSION_TENANT, ""):
        request.session.pop(SESSION_TEAM, None)
    if tenant:
        if not Membership.objects.filter(user=request.user, tenant__slug=tenant).exists():
            messages.error(request, f"You are not a member of a tenant '{tenant[:60]}'.")
            return redirect("console-tenants")
        request.session[SESSION_TENANT] = tenant
    else:
        request.session.pop(SESSION_TENANT, None)
    team = request.POST.get("team", "").strip()
    request.session[SESSION_TEAM] = team if tenant and _is_uuid(team) else ""
    target = request.POST.get("next") or "/"
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}, require_https=False):
        target = "/"
    return redirect(target)


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


@require_GET
def health(request):
    """Liveness and database reachability, for load balancers and the run supervisor."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


@require_GET
def no_icon(request):
    """No icon (yet): an empty answer, so a browser's automatic request is not a 404 in its console."""
    return HttpResponse(status=204)
