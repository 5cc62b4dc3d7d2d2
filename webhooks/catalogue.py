"""
The event types a webhook endpoint may ask for (docs/webhooks.md, "Events"): ``reservation.state``
for every state a reservation moves to, and each kind of notification a tenant is sent, by family.
An endpoint names exact types, a family with ``.*`` ("reservation.*"), or ``*`` for everything.
"""

from __future__ import annotations

import re

from core.errors import invalid

FAMILIES = {
    "reservation": "state changes (reservation.state) and notices: ready, queued, failed, ending soon, evicted "
                   "(spot), no-show warnings, hardware failed or replaced, held, cancelled by an operator",
    "high_priority": "decisions on the team's high-priority application",
    "budget": "budget thresholds crossed",
    "endpoint": "the autoscaler's decisions on the tenant's inference endpoints: endpoint.scale_out, "
                "endpoint.scale_in, endpoint.hold, endpoint.burst, endpoint.return, endpoint.replace",
    "node": "incidents on a node running the tenant's work (suspect, drained, back)",
    "gpu": "incidents on a GPU of the tenant's work (reset, back)",
    "operator": "messages from the operator",
    "webhook": "the endpoint's own: ping, disabled",
}
TYPE = re.compile(r"^(\*|[a-z_]+(\.[a-z_]+)*(\.\*)?)$")
MAX_TYPES = 32


def types_check(types) -> list[str]:
    """The endpoint's event types, checked: a list of 1 to MAX_TYPES known types, families or ``*``."""
    if not isinstance(types, list) or not 1 <= len(types) <= MAX_TYPES or not all(isinstance(t, str) for t in types):
        raise invalid("event_types", f"Give 1 to {MAX_TYPES} event types, e.g. [\"reservation.state\", "
                                     "\"budget.*\"], or [\"*\"] for all.", code="invalid")
    for name in types:
        if not TYPE.match(name) or (name != "*" and name.split(".")[0] not in FAMILIES):
            raise invalid("event_types", f"{name!r} is no event type: use one of the families "
                                         f"{', '.join(sorted(FAMILIES))} (e.g. 'reservation.*'), or '*'.",
                          code="unknown_event_type")
    return sorted(set(types))


def wants(types: list[str], event_type: str) -> bool:
    """Whether an endpoint asking for ``types`` is sent ``event_type``."""
    return any(t == "*" or t == event_type or (t.endswith(".*") and event_type.startswith(t[:-1])) for t in types)
