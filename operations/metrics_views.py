"""
``GET /metrics``: the Prometheus scrape (operations.metrics), for platform staff and scrapers only.

Two ways in, checked on every scrape:

- ``Authorization: Bearer mrd_...`` with a *platform* token (not bound to a tenant) whose user
  still has a platform role -- what DESIGN.md gives staff for the staff API and ``/metrics``;
- HTTP basic auth with ``MERIDIAN_METRICS_USER`` / ``MERIDIAN_METRICS_PASSWORD``, when both are
  set (Prometheus's ``basic_auth``), compared in constant time.

No credentials or bad ones are a 401 (with the challenges a scraper can answer); a valid tenant
token is a 403: it authenticates, but the fleet is not a tenant's to read. Sessions are not
accepted: a scrape is a machine's request. Errors have the API's JSON shape.
"""

from __future__ import annotations

import base64
import binascii
import hmac

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from rest_framework.exceptions import AuthenticationFailed

from core.middleware import error_body
from operations.metrics import scrape
from tenants.authentication import authenticate_token
from tenants.principals import principal_for_token

NOT_AUTHENTICATED = "Scraping /metrics needs a platform API token (Authorization: Bearer) or the metrics user."
PLATFORM_ONLY = "/metrics is for platform staff: use a platform token, not a tenant's."


def _basic_configured() -> bool:
    return bool(settings.MERIDIAN_METRICS_USER and settings.MERIDIAN_METRICS_PASSWORD)


def _refuse(status: int, code: str, detail: str) -> JsonResponse:
    response = JsonResponse(error_body("client_error", code, detail), status=status)
    if status == 401:
        challenges = ['Bearer realm="meridian"']
        if _basic_configured():
            challenges.append('Basic realm="meridian-metrics", charset="UTF-8"')
        response["WWW-Authenticate"] = ", ".join(challenges)
    return response


def _basic_ok(credentials: str) -> bool:
    try:
        user, sep, password = base64.b64decode(credentials, validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return False
    # Both compared, always, so the time taken does not tell a right user from a wrong one.
    user_ok = hmac.compare_digest(user.encode(), settings.MERIDIAN_METRICS_USER.encode())
    password_ok = hmac.compare_digest(password.encode(), settings.MERIDIAN_METRICS_PASSWORD.encode())
    return bool(sep) and user_ok and password_ok


def _refusal(request) -> JsonResponse | None:
    """None when the request may scrape; else the 401 or 403 to send."""
    scheme, _, credentials = request.headers.get("Authorization", "").strip().partition(" ")
    credentials = credentials.strip()
    if scheme.lower() == "bearer" and credentials:
        try:
            token = authenticate_token(credentials)
            if token.tenant_id is not None:
                return _refuse(403, "permission_denied", PLATFORM_ONLY)
            principal = principal_for_token(token)  # refuses a user who lost the platform role
        except AuthenticationFailed as exc:
            return _refuse(401, exc.get_codes() if isinstance(exc.get_codes(), str) else "not_authenticated",
                           str(exc.detail))
        return None if principal.is_platform else _refuse(403, "permission_denied", PLATFORM_ONLY)
    if scheme.lower() == "basic" and _basic_configured() and _basic_ok(credentials):
        return None
    return _refuse(401, "not_authenticated", NOT_AUTHENTICATED)


def may_scrape(request) -> bool:
    """A platform token or the metrics user: who may read the fleet's and the control plane's internals."""
    return _refusal(request) is None


@require_GET
def metrics(request):
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    body, content_type = scrape(accept=request.headers.get("Accept", ""))
    response = HttpResponse(body, content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response
