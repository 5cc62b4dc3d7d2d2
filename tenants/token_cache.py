"""
Who a bearer token acts as, remembered by each process for a few seconds.

Resolving a token is three queries (the token with its user, tenant and team; the membership;
the team roles): on a small API call a quarter of its time. A process keeps what they returned
for MERIDIAN_AUTH_CACHE_SECONDS, and only while the auth epoch (core.epochs) is the one it read
before it loaded them: every change to a token, a user, a membership, a team membership, a team
or a tenant replaces it. So a revocation, a demotion or a removal is seen by the next request in
every process, as when every request read the database.

What is checked on every request all the same: the raw token against its digest, expiry, and
the once-a-minute ``last_used_at`` write. Every request gets its own copies of the model
instances, so a view that changes them changes nothing another request sees. When the shared
cache cannot be read, nothing is remembered: every request reads the database.
"""

from __future__ import annotations

import copy

from django.conf import settings

from core.epochs import Epoch, KeptUnder

AUTH_EPOCH = Epoch("meridian:auth-epoch")
# Token prefix -> (the token with its user, tenant and team; the tenant role; the team roles).
TOKENS = KeptUnder(AUTH_EPOCH, lambda: settings.MERIDIAN_AUTH_CACHE_SECONDS)


def auth_changed() -> None:
    """Forget every process's remembered tokens (a change no model signal tells of, e.g. an UPDATE)."""
    AUTH_EPOCH.changed()


def copies(token):
    """A copy of ``token`` with its own copies of its user, tenant and team (each request changes only its own)."""
    mine = copy.copy(token)
    for name in ("user", "tenant", "team"):
        related = getattr(token, name)
        setattr(mine, name, copy.copy(related) if related is not None else None)
    return mine


def watch_auth() -> None:
    """Every saved or deleted row that decides what a token may do changes the epoch."""
    from tenants.models import APIToken, Membership, Team, TeamMembership, Tenant, User

    AUTH_EPOCH.watch(APIToken, User, Membership, TeamMembership, Team, Tenant)
