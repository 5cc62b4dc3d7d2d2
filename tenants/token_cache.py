"""
Who a bearer token acts as, remembered by each process for a few seconds.

Resolving a token is three queries (the token with its user, tenant and team; the membership;
the team roles): on a small API call a quarter of its time. A process keeps what they returned
for MERIDIAN_AUTH_CACHE_SECONDS, and only while the auth epoch (cloud.epochs) is the one it read
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
import threading
import time
from dataclasses import dataclass

from django.conf import settings

from cloud.epochs import UNREADABLE, Epoch

AUTH_EPOCH = Epoch("meridian:auth-epoch")


def read_epoch():
    return AUTH_EPOCH.read()


def auth_changed() -> None:
    """Forget every process's remembered tokens (a change no model signal tells of, e.g. an UPDATE)."""
    AUTH_EPOCH.changed()


@dataclass(frozen=True)
class Resolved:
    """What the three queries returned for one token: the token (user, tenant, team loaded) and its roles."""

    token: object
    role: object  # TenantRole, or None for a platform token
    team_roles: dict
    epoch: object
    loaded_at: float


class TokenCache:
    """Per process, thread-safe: token prefix -> Resolved."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[str, Resolved] = {}

    def get(self, prefix: str, epoch) -> Resolved | None:
        entry = self._entries.get(prefix)
        if entry is None or epoch is UNREADABLE or entry.epoch != epoch:
            return None
        if time.monotonic() - entry.loaded_at > settings.MERIDIAN_AUTH_CACHE_SECONDS:
            return None
        return entry

    def put(self, prefix: str, entry: Resolved) -> None:
        if entry.epoch is UNREADABLE or settings.MERIDIAN_AUTH_CACHE_SECONDS <= 0:
            return
        with self._lock:
            self._entries[prefix] = entry

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


TOKENS = TokenCache()


def copies(token):
    """A copy of ``token`` with its own copies of its user, tenant and team (each request changes only its own)."""
    mine = copy.copy(token)
    for name in ("user", "tenant", "team"):
        related = getattr(token, name)
        setattr(mine, name, copy.copy(related) if related is not None else None)
    return mine


def connect_signals() -> None:
    """Every saved or deleted row that decides what a token may do changes the epoch."""
    from .models import APIToken, Membership, Team, TeamMembership, Tenant, User

    AUTH_EPOCH.watch(APIToken, User, Membership, TeamMembership, Team, Tenant)
