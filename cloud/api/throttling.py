"""Rate limits per API token (or per user for sessions, per address for anonymous callers)."""

from rest_framework.throttling import SimpleRateThrottle


class PrincipalRateThrottle(SimpleRateThrottle):
    """One bucket per token: a leaked or runaway token cannot starve its user's other tokens."""

    scope = "principal"

    def get_cache_key(self, request, view):
        if isinstance(request.auth, object) and getattr(request.auth, "pk", None) is not None:
            ident = f"token:{request.auth.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            self.scope = "anonymous"
            self.rate = self.get_rate()
            self.num_requests, self.duration = self.parse_rate(self.rate)
            ident = f"ip:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
