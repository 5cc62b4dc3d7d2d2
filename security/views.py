"""
Security pages outside the API: the public JWKS of receipt keys (no authentication, nothing
tenant-specific) and the console's audit log (tenant admins and owners; staff see all).
"""

import json

from django.core.paginator import Paginator
from django.http import JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET

from cloud.console import console_page, scoped

from .models import AuditEvent
from .receipts import jwks


@require_GET
@cache_control(public=True, max_age=300)
def jwks_view(request):
    """
    The receipt keys' JWKS, public so tenants can verify receipts offline. Cached briefly: a
    client that meets an unknown kid should fetch it again.
    """
    return JsonResponse(jwks())


#
# The console's audit log
#

AUDIT_PAGE_SIZE = 50
SYSTEM_ACTOR = "system"


@console_page("audit-events")
def audit_log(request):
    """
    The tenant's audit events (staff acting platform-wide: all), newest first, 50 a page, filtered
    by action and by actor; each with what changed, before and after.
    """
    events = scoped(request, AuditEvent)
    actions = list(events.order_by("action").values_list("action", flat=True).distinct())
    actors = list(events.exclude(actor_email="").order_by("actor_email").values_list("actor_email", flat=True)
                  .distinct())
    action, actor = request.GET.get("action", ""), request.GET.get("actor", "")
    if action:
        events = events.filter(action=action)
    if actor == SYSTEM_ACTOR:
        events = events.filter(actor_email="")
    elif actor:
        events = events.filter(actor_email=actor)
    page = Paginator(events.order_by("-occurred_at", "-id"), AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    for event in page:
        event.changes = changes(event.before, event.after)
    return render(request, "security/audit_log.html", {
        "page": page, "actions": actions, "actors": actors, "action": action, "actor": actor,
        "system_actor": SYSTEM_ACTOR,
    })


def changes(before, after) -> list[dict]:
    """Field by field, what an event changed: each value as JSON text (objects pretty-printed)."""
    if not isinstance(before, dict | None) or not isinstance(after, dict | None):
        return [{"field": "", "before": _shown(before), "after": _shown(after)}]
    before, after = before or {}, after or {}
    return [{"field": key, "before": _shown(before[key]) if key in before else "",
             "after": _shown(after[key]) if key in after else ""}
            for key in sorted(before.keys() | after.keys())]


def _shown(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, sort_keys=True, default=str)
