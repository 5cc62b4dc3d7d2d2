"""
Bearer-token authentication for the API.

``Authorization: Bearer mrd_<prefix>_<secret>``: one indexed lookup by prefix, a SHA-256 digest
compared in constant time, then revocation and expiry. A bad token is a 401 whose code says
which (``token_invalid``, ``token_revoked``, ``token_expired``) and reveals nothing else.
Tokens are never accepted from the query string.

Also the name console sign-in failures are counted under (``login_username``, django-axes).
"""

import re
from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed

from core import log_context
from tenants.models import APIToken

TOKEN_FORMAT = re.compile(r"^mrd_(?P<prefix>[0-9a-f]{12})_[A-Za-z0-9_-]{43}$")
LAST_USED_RESOLUTION = timedelta(minutes=1)

TOKEN_INVALID = "The API token is not valid."
TOKEN_REVOKED = "The API token has been revoked."
TOKEN_EXPIRED = "The API token has expired."


def login_username(request, credentials=None) -> str | None:
    """
    The address a sign-in attempt is counted and locked under, normalised as sign-in matches it
    (surrounding spaces dropped, any case): otherwise every spelling of one address would be a
    fresh account to axes, and a lock would last until the next capital letter.
    """
    if credentials is not None:
        raw = credentials.get(settings.AXES_USERNAME_FORM_FIELD)
    else:
        raw = getattr(request, "data", request.POST).get(settings.AXES_USERNAME_FORM_FIELD)
    return raw.strip().lower() if isinstance(raw, str) else raw


def token_invalid():
    return AuthenticationFailed(TOKEN_INVALID, code="token_invalid")


def token_revoked():
    return AuthenticationFailed(TOKEN_REVOKED, code="token_revoked")


def token_prefix(raw: str) -> str:
    """The prefix of a well-formed token (what it is looked up by), or AuthenticationFailed."""
    match = TOKEN_FORMAT.match(raw)
    if match is None:
        raise token_invalid()
    return match["prefix"]


def authenticate_token(raw: str) -> APIToken:
    """The live token for ``raw``, or AuthenticationFailed saying why not."""
    token = APIToken.objects.select_related("user", "tenant", "team").filter(prefix=token_prefix(raw)).first()
    if token is None:
        raise token_invalid()
    return check_token(token, raw)


def check_token(token: APIToken, raw: str) -> APIToken:
    """``token`` (the row of ``raw``'s prefix) if ``raw`` is its secret and it is live; else AuthenticationFailed."""
    if not token.matches(raw) or not token.user.is_active:
        raise token_invalid()
    if token.revoked_at is not None:
        raise token_revoked()
    if token.is_expired:
        raise AuthenticationFailed(TOKEN_EXPIRED, code="token_expired")
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        # Coarse on purpose: one write a minute per token, not one per request.
        APIToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


class APITokenAuthentication(BaseAuthentication):
    keyword = "bearer"

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.encode():
            return None
        if len(parts) != 2:
            raise token_invalid()
        try:
            raw = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise token_invalid() from None
        from tenants.principals import principal_for_bearer

        # The principal too, from the same remembered rows (tenants.token_cache): PrincipalMixin uses it.
        request.bearer_principal = principal = principal_for_bearer(raw)
        log_context.set_tenant(principal.tenant)  # the request's log lines say whose it is from here on
        return principal.user, principal.token

    def authenticate_header(self, request):
        return 'Bearer realm="meridian"'
