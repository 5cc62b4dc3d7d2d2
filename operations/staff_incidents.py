"""
The staff console's incidents (docs/incidents.md): the open ones, oldest first, with where they
are (node and region by name), how long they have been open and who is on them; one incident with
its evidence and paging; and the response, as the API offers it: acknowledge, assign to me, assign
to another platform admin, resolve with a note (security.incident_response decides and audits).
Any platform role reads; platform admins act (the role table's ``incidents`` row).
"""

from __future__ import annotations

import json
import uuid

from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import OuterRef, Subquery
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from cloud.models import Node
from core.errors import DomainError
from operations.incident_api import incident_state
from security import incident_response
from security.incident_paging import severity_of
from security.models import Incident
from tenants.choices import PlatformRole
from tenants.models import Tenant, User
from web.console import CHANGE, console_page, error_text, may, scoped, scoped_or_404, words

PER_PAGE = 50
SHOWN = {"open": "Open", "all": "All, newest first"}


def _named(queryset):
    """Incidents with their node's hostname and region, their tenant's name, and the people on them, in one query."""
    nodes = Node.objects.filter(pk=OuterRef("node_id"))
    return queryset.select_related("acknowledged_by", "assignee", "resolved_by").annotate(
        node_hostname=Subquery(nodes.values("hostname")[:1]), node_region=Subquery(nodes.values("region__slug")[:1]),
        tenant_name=Subquery(Tenant.objects.filter(pk=OuterRef("tenant_id")).values("name")[:1]))


def _dressed(incident: Incident, now) -> Incident:
    incident.kind_words = words(incident.kind)
    incident.severity = severity_of(incident.kind)
    incident.state = incident_state(incident)
    incident.age = now - incident.detected_at
    return incident


def _staff_admins():
    return User.objects.filter(platform_role=PlatformRole.ADMIN, is_active=True).order_by("email")


@console_page("incidents", platform=True)
def incidents(request):
    """``/staff/incidents/``: open incidents oldest first (``?show=all``: all, newest first); ``?node=``, ``?kind=``."""
    show = request.GET.get("show") if request.GET.get("show") in SHOWN else "open"
    found = _named(scoped(request, Incident))
    found = found.filter(resolved_at__isnull=True).order_by("detected_at") if show == "open" else found.order_by(
        "-detected_at")
    node = request.GET.get("node", "")
    if node:
        try:
            found = found.filter(node_id=uuid.UUID(node))
        except ValueError:  # not an id: nothing matches, as a wrong one would
            found = found.none()
    kind = request.GET.get("kind", "")[:64]
    if kind:
        found = found.filter(kind=kind)
    page = Paginator(found, PER_PAGE).get_page(request.GET.get("page"))
    now = timezone.now()
    rows = [_dressed(incident, now) for incident in page]
    return render(request, "staff/incidents.html", {
        "page": page, "rows": rows, "show": show, "shown": SHOWN, "kind": kind, "kind_words": words(kind),
        "kinds": [(k, words(k)) for k in Incident.objects.order_by("kind").values_list("kind", flat=True).distinct()],
        "node": node,
        "can_act": may(request.principal, "incidents"), "admins": list(_staff_admins()) if rows else [],
        "me_id": request.principal.user.pk, "here": request.get_full_path()})


@console_page("incidents", platform=True)
def incident_detail(request, pk):
    """One incident: what, where, the evidence, who responded, and whether the on-call address was paged."""
    incident = _dressed(scoped_or_404(request, _named(Incident.objects.all()), pk=pk), timezone.now())
    return render(request, "staff/incident.html", {
        "i": incident, "evidence": json.dumps(incident.evidence, indent=2, sort_keys=True, default=str),
        "can_act": may(request.principal, "incidents"), "admins": list(_staff_admins()),
        "me_id": request.principal.user.pk, "here": request.get_full_path()})


def _acknowledge(request, incident):
    incident_response.incident_acknowledge(actor=request.principal, incident=incident)
    return f"{words(incident.kind)} acknowledged."


def _assign_me(request, incident):
    incident_response.incident_assign(actor=request.principal, incident=incident, assignee=request.principal.user)
    return f"{words(incident.kind)} is yours."


def _assign(request, incident):
    email = request.POST.get("assignee", "").strip()
    assignee = User.objects.filter(email__iexact=email).first() if email else None
    if assignee is None:
        raise DomainError({"assignee": ["Choose a platform admin to assign it to."]}, code="does_not_exist")
    incident_response.incident_assign(actor=request.principal, incident=incident, assignee=assignee)
    return f"{words(incident.kind)} assigned to {assignee.email}; they are told by e-mail."


def _resolve(request, incident):
    incident_response.incident_resolve(actor=request.principal, incident=incident,
                                       note=request.POST.get("note", ""))
    return f"{words(incident.kind)} resolved."


ACTIONS = {"acknowledge": _acknowledge, "assign-me": _assign_me, "assign": _assign, "resolve": _resolve}


@console_page("incidents", platform=True)
@require_POST
def incident_act(request, pk, verb: str):
    """One of ACTIONS (platform admins); back to where the form was, with the outcome."""
    act = ACTIONS.get(verb)
    if act is None:
        raise Http404("No such action.")
    incident = scoped_or_404(request, Incident, CHANGE, pk=pk)
    try:
        messages.success(request, act(request, incident))
    except DomainError as exc:
        messages.error(request, f"{words(incident.kind)}: {error_text(exc)}")
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        back = reverse("staff-incident", args=[incident.pk])
    return redirect(back)
