"""
Rate limits per API token (or per user for sessions, per address for anonymous callers).

A sliding-window counter, as Cloudflare's limiter counts: the requests of the current window of
the rate's period plus the previous window's, weighted by how much of it still lies within one
period of now. Two counters per bucket, one incremented and the other read: constant work per
request. DRF's own throttle keeps a log of every request time in the period and reads and writes
all of it on each request: at 1,200 a minute, kilobytes per request.

A request is counted first (an atomic increment: Redis's INCR, the embedded file cache's locked
one) and judged by the count it got, then uncounted if refused; reading the count and then
incrementing it would let every request racing on one token through at the limit.
"""

from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle


class PrincipalRateThrottle(SimpleRateThrottle):
    """One bucket per token: a leaked or runaway token cannot starve its user's other tokens."""

    scope = "principal"

    def __init__(self):
        # Rates are read per request, not at import, so settings changes apply (and tests can raise them).
        self.wait_s = None

    def allow_request(self, request, view):
        authenticated = bool(request.user and request.user.is_authenticated)
        self.scope = "principal" if authenticated else "anonymous"
        self.rate = api_settings.DEFAULT_THROTTLE_RATES[self.scope]
        self.num_requests, self.duration = self.parse_rate(self.rate)
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        now = self.timer()
        window, into = divmod(now, self.duration)
        current, previous = f"{key}:{int(window)}", f"{key}:{int(window) - 1}"
        before = self._count(current) - 1  # this window's requests before this one
        earlier = self.cache.get(previous, 0)
        elapsed = into / self.duration
        if earlier * (1 - elapsed) + before >= self.num_requests:
            self.cache.decr(current)
            self.wait_s = self._wait(earlier, before, elapsed)
            return False
        return True

    def _count(self, key: str) -> int:
        """
        One more request in ``key``'s window: the count with it. The counter lives two periods (the
        previous window is read); every supported cache's incr keeps an entry's expiry.
        """
        try:
            return self.cache.incr(key)
        except ValueError:  # the window's first request
            if self.cache.add(key, 1, timeout=2 * self.duration):
                return 1
            return self.cache.incr(key)  # another request made it meanwhile

    def _wait(self, previous: int, current: int, elapsed: float) -> float:
        """Seconds until the weighted count falls below the limit again (a second at least: Retry-After says it)."""
        if current >= self.num_requests:
            return max((1 - elapsed) * self.duration, 1.0)  # not before the next window
        # The previous window's weight falls linearly to zero over this one.
        below_at = 1 - (self.num_requests - current) / previous
        return max((below_at - elapsed) * self.duration, 1.0)

    def wait(self):
        return self.wait_s

    def get_cache_key(self, request, view):
        if getattr(request.auth, "pk", None) is not None:
            ident = f"token:{request.auth.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            ident = f"ip:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
