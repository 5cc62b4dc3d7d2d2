"""
Security pages outside the API: the public JWKS of receipt keys (no authentication, nothing
tenant-specific) and the console's audit log (tenant admins and owners; staff see all).
"""

import json
import re
from datetime import UTC

from django.apps import apps
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.dateparse import parse_datetime
from django.utils.text import capfirst
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET

from security.models import AuditEvent
from security.receipts import jwks
from web.console import console_page, scoped, words


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
    named = targets(request, page.object_list)
    for event in page:
        event.changes = changes(event.before, event.after)
        event.action_words = words(event.action)
        event.target = named[(event.target_type, event.target_id)]
    return render(request, "security/audit_log.html", {
        "page": page, "actions": [(a, words(a)) for a in actions], "actors": actors, "action": action,
        "actor": actor, "system_actor": SYSTEM_ACTOR,
    })


#
# Events as a person reads them
#

# What an audited object is called, where its name is, and the console page that shows it (a URL
# name: with the object's id, or "-" for a list page). Only objects the reader may see are named.
TARGETS = {
    "provisioning.reservation": ("Reservation", "name", "reservation-detail"),
    "provisioning.vpc": ("VPC", "name", "vpc-detail"),
    "provisioning.instance": ("Instance", "name", ""),
    "tenants.tenant": ("Tenant", "name", ""),
    "tenants.team": ("Team", "name", "-team-list"),
    "tenants.membership": ("Member", "user__email", "-team-list"),
    "tenants.teammembership": ("Team member", "user__email", "-team-list"),
    "tenants.invitation": ("Invitation", "email", "-team-list"),
    "tenants.apitoken": ("API token", "name", "-token-list"),
    "tenants.quota": ("Quota", "", "-quota-list"),
    "tenants.highpriorityapplication": ("High-priority application of", "team__name", "high-priority-application"),
    "tenants.notification": ("Notification", "title", "-notification-list"),
    "cloud.node": ("Node", "hostname", "staff-node"),
    "cloud.fabric": ("Fabric", "name", ""),
    "cloud.region": ("Region", "name", ""),
    "cloud.offering": ("Offering", "name", ""),
    "cloud.gpumodel": ("GPU model", "name", ""),
    "security.trustanchor": ("Trust anchor", "name", ""),
}
def targets(request, events) -> dict:
    """
    Each event's target as ``{"label", "name", "url"}``: its kind in words, and -- when the reader
    may see it -- its name and the page that shows it. One query per kind of target on the page.
    """
    ids_of: dict[str, set[str]] = {}
    for event in events:
        ids_of.setdefault(event.target_type, set()).add(event.target_id)
    named = {}
    for target_type, ids in ids_of.items():
        label, field, url_name = TARGETS.get(target_type, (None, "", ""))
        found = _visible_names(request, target_type, field, ids) if label else {}
        label = label or _model_label(target_type)
        for target_id in ids:
            name = found.get(target_id)
            url = ""
            if name is not None and url_name:
                url = reverse(url_name[1:]) if url_name.startswith("-") else reverse(url_name, args=[target_id])
            named[(target_type, target_id)] = {"label": label, "name": name or "", "url": url,
                                               "found": name is not None}
    return named


def _visible_names(request, target_type: str, field: str, ids: set[str]) -> dict[str, str]:
    model = apps.get_model(target_type)
    valid = set()
    for target_id in ids:
        try:
            valid.add(model._meta.pk.to_python(target_id))
        except ValidationError:
            continue
    rows = scoped(request, model).filter(pk__in=valid)
    return {str(pk): str(name) for pk, name in rows.values_list("pk", field or "pk")} if field else \
        {str(pk): "" for pk in rows.values_list("pk", flat=True)}


def _model_label(target_type: str) -> str:
    try:
        return capfirst(apps.get_model(target_type)._meta.verbose_name)
    except (LookupError, ValueError):
        return words(target_type.rpartition(".")[2])


def changes(before, after) -> list[dict]:
    """Field by field, what an event changed: each value as JSON text (objects pretty-printed)."""
    if not isinstance(before, dict | None) or not isinstance(after, dict | None):
        return [{"field": "", "before": _shown(before), "after": _shown(after)}]
    before, after = before or {}, after or {}
    return [{"field": key, "before": _shown(before[key]) if key in before else "",
             "after": _shown(after[key]) if key in after else ""}
            for key in sorted(before.keys() | after.keys())]


ISO_MOMENT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d")


def _shown(value) -> str:
    """A value as a person reads it: times in UTC to the second, fractions to three places, the rest as JSON."""
    value = _readable(value)
    if value is None:
        return "null"
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _readable(value):
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, str) and ISO_MOMENT.match(value):
        moment = parse_datetime(value)
        if moment is not None:
            return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC" if moment.tzinfo else f"{moment:%Y-%m-%d %H:%M:%S}"
    if isinstance(value, dict):
        return {key: _readable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_readable(item) for item in value]
    return value
