"""
The console's storage page: the tenant's volumes and file systems with their attachments, the
storage used against the quotas, a form to create one, and per volume grow, attach, detach,
snapshot, access keys (buckets), checkpoint tiers (file systems) and delete; the snapshots (restore,
delete) and the checkpoints (where each is, a move's progress, restore). Thin: every change is a
``storage.services`` or ``storage.checkpoints`` call (the API's doors too); a refusal comes back
onto the form or as a flash message in the service's own words.
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
from storage import checkpoints, services
from storage.choices import ATTACHABLE, StorageKind, VolumeState
from storage.forms import VolumeForm
from storage.models import Checkpoint, CheckpointPolicy, Volume, VolumeAttachment, VolumeSnapshot
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
    waiting = list(scoped(request, Reservation).exclude(state__in=TERMINAL_STATES | services.STARTED)
                   .filter(offering__isnull=False).only("id", "name", "regions", "region__slug").select_related(
                       "region").order_by("name")[:200]) if regions else []
    policies = {p.volume_id: p for p in scoped(request, CheckpointPolicy).select_related("cold_volume")}
    buckets = [v for v in volumes if v.storage_class.kind == StorageKind.OBJECT and v.state == VolumeState.AVAILABLE]
    for volume in volumes:
        slug = volume.storage_class.region.slug
        attached = {a.reservation_id for a in volume.live}
        volume.attachable = volume.storage_class.kind in ATTACHABLE and volume.state == VolumeState.AVAILABLE
        volume.candidates = [r for r in waiting if r.pk not in attached
                             and slug in ([r.region.slug] if r.region_id else r.regions)]
        volume.policy = policies.get(volume.pk)
        volume.cold_choices = [b for b in buckets if b.storage_class.region_id == volume.storage_class.region_id]
    snapshots = list(scoped(request, VolumeSnapshot).exclude(state=VolumeState.DELETED)
                     .select_related("volume").order_by("volume__name", "-created_at")[:200])
    moving = list(scoped(request, Checkpoint).select_related("volume__checkpoint_policy__cold_volume")
                  .order_by("volume__name", "-written_at")[:200])
    for checkpoint in moving:
        checkpoint.progress = checkpoints.progress(checkpoint)
    return render(request, "storage/volume_list.html", {
        "form": form, "volumes": volumes, "usage": _usage(request), "snapshots": snapshots, "checkpoints": moving})


def _usage(request) -> list[dict]:
    """Storage used against each storage limit of the tenant: overall, then per kind of class."""
    tenant = request.principal.tenant
    if tenant is None:
        return []
    lines = []
    for resource in (QuotaResource.STORAGE_GIB, *services.KIND_QUOTAS.values()):
        limit = min((q.limit for q in quota_limits(tenant=tenant, resource=resource)), default=None)
        kind = next((k for k, r in services.KIND_QUOTAS.items() if r == resource), None)
        used = services.storage_in_use(tenant.pk, kind=kind)
        lines.append({"label": QuotaResource(resource).label.removesuffix(" (GiB)"), "used": used, "limit": limit,
                      "percent": min(100, round(100 * used / limit)) if limit else 0})
    return lines


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


def _snapshot(request, volume):
    taken = services.snapshot_create(actor=request.principal, volume=volume, name=request.POST.get("name", "").strip())
    return f"A snapshot {taken.name} of {volume.name} is being taken."


def _tiers(request, volume):
    try:
        cold = scoped_or_404(request, Volume, "view", pk=UUID(request.POST.get("cold_volume", "")))
        hours, keep = int(request.POST.get("demote_after_hours", "")), int(request.POST.get("keep_hot", ""))
    except ValueError:
        raise DomainError({"cold_volume": ["Choose a bucket, and give hours and a count as whole numbers."]},
                          code="invalid") from None
    if not (1 <= hours <= 24 * 365 and 0 <= keep <= 1000):
        raise DomainError({"demote_after_hours": ["Hours 1 to 8,760; keep 0 to 1,000 hot."]}, code="invalid")
    checkpoints.policy_set(actor=request.principal, volume=volume, cold_volume=cold, demote_after_hours=hours,
                           keep_hot=keep)
    return (f"{volume.name}: the newest {keep} checkpoint{'s' if keep != 1 else ''} stay hot; older ones unused for "
            f"{hours} h move to {cold.name}.")


ACTIONS = {"grow": _grow, "attach": _attach, "detach": _detach, "delete": _delete, "snapshot": _snapshot,
           "tiers": _tiers}


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


@require_POST
@console_page("volumes")
def volume_keys(request, pk):
    """New access keys to a bucket, shown once on a page of their own (never kept in a message or the session)."""
    volume = scoped_or_404(request, Volume, CHANGE, pk=pk)
    try:
        keys = services.volume_credentials(actor=request.principal, volume=volume)
    except DomainError as exc:
        messages.error(request, f"{volume.name}: {error_text(exc)}")
        return redirect("volume-list")
    response = render(request, "storage/volume_keys.html", {"volume": volume, "keys": keys})
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@console_page("volumes")
def snapshot_act(request, pk, verb):
    snapshot = scoped_or_404(request, VolumeSnapshot, CHANGE, pk=pk)
    try:
        if verb == "restore":
            restored = services.volume_create(
                actor=request.principal, storage_class=snapshot.volume.storage_class, snapshot=snapshot,
                name=request.POST.get("name", "").strip(), size_gib=snapshot.size_gib, team=snapshot.volume.team)
            messages.success(request, f"{restored.name} is being restored from {snapshot.name}.")
        elif verb == "delete":
            services.snapshot_delete(actor=request.principal, snapshot=snapshot)
            messages.success(request, f"Snapshot {snapshot.name} is being deleted.")
        else:
            raise Http404("No such action.")
    except DomainError as exc:
        messages.error(request, f"{snapshot.name}: {error_text(exc)}")
    return redirect("volume-list")


@require_POST
@console_page("volumes")
def checkpoint_restore(request, pk):
    checkpoint = scoped_or_404(request, Checkpoint, CHANGE, pk=pk)
    try:
        checkpoint = checkpoints.restore(actor=request.principal, checkpoint=checkpoint)
        messages.success(request, f"{checkpoint.name} is on its way back to {checkpoint.volume.name}.")
    except DomainError as exc:
        messages.error(request, f"{checkpoint.name}: {error_text(exc)}")
    return redirect("volume-list")


urlpatterns = [
    path("volumes/", volume_list, name="volume-list"),
    path("volumes/<uuid:pk>/keys/", volume_keys, name="volume-keys"),
    path("volumes/<uuid:pk>/<str:verb>/", volume_act, name="volume-act"),
    path("snapshots/<uuid:pk>/<str:verb>/", snapshot_act, name="snapshot-act"),
    path("checkpoints/<uuid:pk>/restore/", checkpoint_restore, name="checkpoint-restore"),
]
