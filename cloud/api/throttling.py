"""Rate limits per API token (or per user for sessions, per address for anonymous callers)."""

from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle


class PrincipalRateThrottle(SimpleRateThrottle):
    """One bucket per token: a leaked or runaway token cannot starve its user's other tokens."""

    scope = "principal"

    def __init__(self):
        # Rates are read per request, not at import, so settings changes apply (and tests can raise them).
        pass

    def allow_request(self, request, view):
        authenticated = bool(request.user and request.user.is_authenticated)
        self.scope = "principal" if authenticated else "anonymous"
        self.rate = api_settings.DEFAULT_THROTTLE_RATES[self.scope]
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request, view):
        if getattr(request.auth, "pk", None) is not None:
            ident = f"token:{request.auth.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            ident = f"ip:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
