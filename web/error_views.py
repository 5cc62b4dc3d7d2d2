"""
The error pages (Django's handler403/404/500): under /api/ the API's JSON error, elsewhere a
console page in the console's shell that says what happened and offers a way back.
"""

from __future__ import annotations

import logging
import sys

from django.http import HttpResponse, HttpResponseServerError
from django.shortcuts import render
from django.template.loader import render_to_string

from core.transient import RETRY_AFTER_S, fresh_connections, transient_database_error
from web.api.errors import api_not_found, api_server_error
from web.console import console_principal, forbidden

log = logging.getLogger(__name__)


def _with_principal(request) -> None:
    """The shell's navigation needs the principal; a URL no view matched never resolved one."""
    if getattr(request, "principal", None) is not None or not request.user.is_authenticated:
        return
    try:
        request.principal = console_principal(request)
    except Exception:  # the page must still be drawn: without the navigation, then
        log.warning("error page: no principal for %s", request.path, exc_info=True)


def not_found(request, exception=None) -> HttpResponse:
    """404: the same page for what does not exist and what this user may not see (another tenant's)."""
    if request.path.startswith("/api/"):
        return api_not_found(request, exception)
    _with_principal(request)
    return render(request, "404.html", {"path": request.path}, status=404)


def permission_denied(request, exception=None) -> HttpResponse:
    """403 for a refusal raised outside a console page (console pages answer their own: web.console.forbidden)."""
    _with_principal(request)
    return forbidden(request, str(exception or "") or "You may not do this here.")


def server_error(request) -> HttpResponse:
    """
    500: drawn from the request alone (no session, no principal, no database: it may be what
    failed), with the request id to quote to the operator; 503 with Retry-After when the database
    was away a moment (``core.transient``).
    """
    if request.path.startswith("/api/"):
        return api_server_error(request)
    page = render_to_string("500.html", {"request_id": getattr(request, "id", "")})
    if transient_database_error(sys.exc_info()[1]):  # the database was away a moment: nothing was changed
        fresh_connections()
        return HttpResponse(page, status=503, headers={"Retry-After": str(RETRY_AFTER_S)})
    return HttpResponseServerError(page)
