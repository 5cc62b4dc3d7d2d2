"""
The console's storage page: the tenant's volumes and file systems with their attachments, the
storage used against the quota, a form to create one, and per volume grow, attach, detach and
delete. Thin: every change is a ``storage.services`` call (the API's door too); a refusal comes
back onto the form or as a flash message in the service's own words.
"""

from __future__ import annotations

from uuid import UUID

from django.contrib import messages
from django.db.models import Prefetch
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_POST

from core.errors import DomainError
from provisioning.models import Reservation
from provisioning.services import team_for
from provisioning.transitions import TERMINAL_STATES
from storage import services
from storage.choices import ATTACHABLE, VolumeState
from storage.forms import VolumeForm
from storage.models import Volume, VolumeAttachment
from tenants.choices import QuotaResource
from tenants.quotas import quota_limits
from web.console import CHANGE, add_domain_error, console_page, error_text, scoped, scoped_or_404


@console_page("volumes")
def volume_list(request):
    form = VolumeForm(request.POST or None, request=request)
    if request.method == "POST" and form.is_valid():  # console_page lets only members and above post
        data = form.cleaned_data
        try:
            volume = services.volume_create(actor=request.principal, storage_class=data["storage_class"],
                                            name=data["name"], size_gib=data["size_gib"],
                                            team=team_for(request.principal, data["team"]))
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            messages.success(request, f"{volume.name} ({volume.size_gib:,} GiB) is being created.")
            return redirect("volume-list")
    volumes = list(scoped(request, Volume).exclude(state=VolumeState.DELETED)
                   .select_related("storage_class__region", "team").prefetch_related(Prefetch(
                       "attachments", queryset=VolumeAttachment.objects.filter(detached_at__isnull=True)
                       .select_related("reservation"), to_attr="live")).order_by("name"))
    regions = {v.storage_class.region.slug for v in volumes}
    waiting = list(scoped(request, Reservation).exclude(state__in=TERMINAL_STATES)
                   .filter(offering__isnull=False).only("id", "name", "regions", "region__slug").select_related(
                       "region").order_by("name")[:200]) if regions else []
    for volume in volumes:
        slug = volume.storage_class.region.slug
        attached = {a.reservation_id for a in volume.live}
        volume.attachable = volume.storage_class.kind in ATTACHABLE and volume.state == VolumeState.AVAILABLE
        volume.candidates = [r for r in waiting if r.pk not in attached
                             and slug in ([r.region.slug] if r.region_id else r.regions)]
    return render(request, "storage/volume_list.html", {"form": form, "volumes": volumes, "usage": _usage(request)})


def _usage(request) -> dict | None:
    tenant = request.principal.tenant
    if tenant is None:
        return None
    limit = min((q.limit for q in quota_limits(tenant=tenant, resource=QuotaResource.STORAGE_GIB)), default=None)
    used = services.storage_in_use(tenant.pk)
    return {"used": used, "limit": limit, "percent": min(100, round(100 * used / limit)) if limit else 0}


def _grow(request, volume):
    try:
        size = int(request.POST.get("size_gib", ""))
    except ValueError:
        raise DomainError({"size_gib": ["Give the new size in whole GiB."]}, code="invalid") from None
    volume = services.volume_resize(actor=request.principal, volume=volume, size_gib=size)
    return f"{volume.name} is growing to {volume.target_gib:,} GiB."


def _reservation(request, action: str = "view") -> Reservation:
    """The reservation the form names, among those the principal may see (or change); 404 otherwise."""
    try:
        pk = UUID(request.POST.get("reservation", ""))
    except ValueError:
        raise DomainError({"reservation": ["Choose one of your reservations."]}, code="invalid") from None
    return scoped_or_404(request, Reservation, action, pk=pk)


def _attach(request, volume):
    reservation = _reservation(request, CHANGE)
    services.volume_attach(actor=request.principal, volume=volume, reservation=reservation,
                           read_only=request.POST.get("read_only") == "on")
    return f"{volume.name} is attached to {reservation.name}: its instances mount it when they start."


def _detach(request, volume):
    reservation = _reservation(request)
    services.volume_detach(actor=request.principal, volume=volume, reservation=reservation)
    return f"{volume.name} is detached from {reservation.name}."


def _delete(request, volume):
    volume = services.volume_delete(actor=request.principal, volume=volume)
    return f"{volume.name} is being deleted; its data key is destroyed once its storage is removed."


ACTIONS = {"grow": _grow, "attach": _attach, "detach": _detach, "delete": _delete}


@require_POST
@console_page("volumes")
def volume_act(request, pk, verb):
    act = ACTIONS.get(verb)
    if act is None:
        raise Http404("No such action.")
    volume = scoped_or_404(request, Volume, CHANGE, pk=pk)
    try:
        messages.success(request, act(request, volume))
    except DomainError as exc:
        messages.error(request, f"{volume.name}: {error_text(exc)}")
    return redirect("volume-list")


urlpatterns = [
    path("volumes/", volume_list, name="volume-list"),
    path("volumes/<uuid:pk>/<str:verb>/", volume_act, name="volume-act"),
]
