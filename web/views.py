"""
The console's entry pages: sign-in and sign-out, the tenant and team switchers, and the health
check. They use the same scoping and services as the API (web.console).
"""

import uuid

from django import forms
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from tenants.models import Membership
from web.console import SESSION_TEAM, SESSION_TENANT, console_principal


class EmailAuthenticationForm(AuthenticationForm):
    username = forms.EmailField(label="E-mail", widget=forms.EmailInput(attrs={"autofocus": True,
                                                                               "autocomplete": "email"}))


class LoginView(auth_views.LoginView):
    form_class = EmailAuthenticationForm
    redirect_authenticated_user = True


class LogoutView(auth_views.LogoutView):
    pass


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
