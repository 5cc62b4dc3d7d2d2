"""The console's home page: the tenant dashboard (operations.dashboard)."""

from django.shortcuts import redirect, render
from django.utils import timezone

from operations import dashboard
from web.console import console_page


@console_page("reservations")
def home(request):
    """The tenant's dashboard; staff acting platform-wide land on what is wrong with the platform."""
    principal = request.principal
    if principal.tenant is None:
        return redirect("staff-home" if principal.is_platform else "console-tenants")
    return render(request, "console/dashboard.html", dashboard.summary(request, now=timezone.now()))
