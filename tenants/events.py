"""
Events for the outside world (docs/webhooks.md): what happened to a tenant's objects, written as
``Event`` rows in the transaction of the change (an outbox), for the webhooks app to send.

Only tenants that listen are written for: the webhooks app registers ``listeners()`` (the tenants
with an active endpoint), kept in the cache for LISTENERS_TTL seconds and dropped whenever an
endpoint changes; with nothing registered, nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.core.cache import cache
from django.utils import timezone

from tenants.models import Event

CACHE_KEY = "meridian:webhook-listeners"
LISTENERS_TTL = 60
_listeners: Callable[[], set] | None = None


@dataclass
class Happened:
    tenant_id: object
    type: str
    data: dict
    team_id: object = None
    at: object = field(default=None)


def listeners_source(source: Callable[[], set]) -> None:
    """Register what says which tenants listen (their ids, as strings)."""
    global _listeners
    _listeners = source


def listeners_changed() -> None:
    cache.delete(CACHE_KEY)


def listening() -> set:
    if _listeners is None:
        return set()
    known = cache.get(CACHE_KEY)
    if known is None:
        known = {str(tenant_id) for tenant_id in _listeners()}
        cache.set(CACHE_KEY, known, LISTENERS_TTL)
    return known


def emit(tenant_id, type: str, data: dict, *, team_id=None) -> int:
    return emit_many([Happened(tenant_id=tenant_id, type=type, data=data, team_id=team_id)])


def emit_many(happened: Iterable[Happened]) -> int:
    """Write the events of listening tenants (one INSERT); returns how many."""
    ears = listening()
    if not ears:
        return 0
    now = timezone.now()
    rows = [Event(tenant_id=h.tenant_id, team_id=h.team_id, type=h.type, data=h.data, created_at=h.at or now)
            for h in happened if str(h.tenant_id) in ears]
    if rows:
        Event.objects.bulk_create(rows)
    return len(rows)
