"""
Rate limits per API token (or per user for sessions, per address for anonymous callers).

A sliding-window counter, as Cloudflare's limiter counts: the requests of the current window of
the rate's period plus the previous window's, weighted by how much of it still lies within one
period of now. Two counters per bucket, read together and one of them incremented: constant work
per request. DRF's own throttle keeps a log of every request time in the period and reads and
writes all of it on each request: at 1,200 a minute, kilobytes per request.
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
        counts = self.cache.get_many([current, previous])
        elapsed = into / self.duration
        in_period = counts.get(previous, 0) * (1 - elapsed) + counts.get(current, 0)
        if in_period >= self.num_requests:
            self.wait_s = self._wait(counts.get(previous, 0), counts.get(current, 0), elapsed)
            return False
        self._count(current)
        return True

    def _count(self, key: str) -> None:
        """One more request in ``key``'s window; the counter lives two periods (the previous window is read)."""
        try:
            self.cache.incr(key)
        except ValueError:  # the window's first request
            if self.cache.add(key, 1, timeout=2 * self.duration):
                return
            self.cache.incr(key)  # another request made it meanwhile
        if 2 * self.duration > self.cache.default_timeout:
            # Some backends' incr (the file cache's) writes the value again with their default
            # expiry: an hourly window's counter would be gone after five idle minutes.
            self.cache.touch(key, 2 * self.duration)

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
