"""
The console's endpoints pages: the tenant's endpoints with a form for a new one; each endpoint's
replicas (where, in what state and why), its utilization against the target, and the autoscaler's
decisions with the figures behind them; changing its bounds, and deleting it.
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.db.models import Sum
from django.shortcuts import redirect, render
from django.urls import path
from django.utils import timezone
from django.views.decorators.http import require_POST

from cloud.choices import TimeSliceClass
from cloud.models import GPUModel, GPUSampleRollup, RollupPeriod
from core.errors import DomainError, invalid
from inference import endpoints as services
from inference.balancer import endpoint_url
from inference.choices import EndpointState, ReplicaState
from inference.models import Endpoint
from provisioning.models import Allocation
from web.charts import line_chart, time_labels
from web.console import CHANGE, console_page, error_text, may, scoped, scoped_or_404

CHART_MINUTES = 60


@console_page("endpoints")
def endpoint_list(request):
    if request.principal.tenant is None:
        return redirect("console-tenants")
    rows = scoped(request, Endpoint).exclude(state=EndpointState.DELETED).select_related("offering", "team", "tenant")
    return render(request, "inference/endpoints.html", {
        "endpoints": [(e, endpoint_url(e), _counts(e)) for e in rows.prefetch_related("replicas")],
        "gpu_models": GPUModel.objects.filter(offerings__is_active=True).distinct().order_by("name"),
        "classes": TimeSliceClass.choices, "may_write": may(request.principal, "endpoints"),
        "form": request.POST or {"min_replicas": 1, "max_replicas": 4, "fraction": 1, "health_path": "/healthz"}})


def _counts(endpoint: Endpoint) -> dict:
    counts: dict = {}
    for replica in endpoint.replicas.all():
        counts[replica.state] = counts.get(replica.state, 0) + 1
    return counts


@require_POST
@console_page("endpoints")
def endpoint_create(request):
    form = request.POST
    try:
        share = services.Share(gpu_model=form.get("gpu_model", ""), kind=form.get("kind", "gpu"),
                               fraction=_int(form, "fraction", 1), time_slice_class=form.get("time_slice_class", ""))
        endpoint = services.endpoint_create(
            actor=request.principal, name=form.get("name", "").strip(), share=share,
            regions=[r.strip() for r in form.get("regions", "").split(",") if r.strip()],
            min_replicas=_int(form, "min_replicas", 1), max_replicas=_int(form, "max_replicas", 4),
            health_path=form.get("health_path", "/healthz").strip(), port=_int(form, "port", 8000))
    except DomainError as exc:
        messages.error(request, error_text(exc))
        return endpoint_list(request)
    messages.success(request, f"Endpoint {endpoint.name} is starting its first replicas.")
    return redirect("endpoint-detail", pk=endpoint.pk)


def _int(form, name: str, default: int) -> int:
    value = (form.get(name) or "").strip()
    if not value:
        return default
    if not value.isdigit():
        raise invalid(name, f"{name.replace('_', ' ')} must be a whole number.")
    return int(value)


@console_page("endpoints")
def endpoint_detail(request, pk):
    endpoint = scoped_or_404(request, Endpoint.objects.select_related("offering", "team", "tenant"), pk=pk)
    replicas = endpoint.replicas.select_related("reservation__region").order_by("-created_at")
    return render(request, "inference/endpoint.html", {
        "endpoint": endpoint, "url": endpoint_url(endpoint),
        "replicas": [r for r in replicas if r.state != ReplicaState.GONE],
        "gone": [r for r in replicas if r.state == ReplicaState.GONE][:10],
        "decisions": endpoint.decisions.all()[:30], "chart": _chart(endpoint),
        "may_write": may(request.principal, "endpoints") and endpoint.state == EndpointState.ACTIVE})


def _chart(endpoint: Endpoint):
    """The replicas' mean GPU utilization per minute over the last hour, with the target beside it."""
    now = timezone.now()
    since = now - timedelta(minutes=CHART_MINUTES)
    reservations = endpoint.replicas.values("reservation_id")
    gpus = Allocation.objects.filter(reservation_id__in=reservations, ends_at__gt=since).values("gpu_id")
    minutes = list(GPUSampleRollup.objects.filter(gpu_id__in=gpus, period=RollupPeriod.MINUTE, bucket__gte=since)
                   .values("bucket").annotate(total=Sum("utilization_sum"), count=Sum("utilization_samples"))
                   .order_by("bucket"))
    if not minutes:
        return None
    means = [m["total"] / m["count"] if m["count"] else None for m in minutes]
    return line_chart({"Utilization": means, "Target": [float(endpoint.target_utilization)] * len(means)},
                      x_labels=time_labels([m["bucket"] for m in minutes]), x_total=len(minutes), top=100,
                      label="The replicas' mean GPU utilization per minute, percent, against the target")


@require_POST
@console_page("endpoints")
def endpoint_action(request, pk, action):
    endpoint = scoped_or_404(request, Endpoint, CHANGE, pk=pk)
    try:
        if action == "scale":
            endpoint = services.endpoint_update(
                actor=request.principal, endpoint=endpoint,
                min_replicas=_int(request.POST, "min_replicas", endpoint.min_replicas),
                max_replicas=_int(request.POST, "max_replicas", endpoint.max_replicas),
                target_utilization=_int(request.POST, "target_utilization", endpoint.target_utilization))
            messages.success(request, f"{endpoint.name} now scales between {endpoint.min_replicas} and "
                                      f"{endpoint.max_replicas} replicas at {endpoint.target_utilization} %.")
        elif action == "delete":
            services.endpoint_delete(actor=request.principal, endpoint=endpoint)
            messages.success(request, f"{endpoint.name} is out of the load balancer; its replicas drain and go.")
            return redirect("endpoints")
    except DomainError as exc:
        messages.error(request, error_text(exc))
    return redirect("endpoint-detail", pk=endpoint.pk)


urlpatterns = [
    path("endpoints/", endpoint_list, name="endpoints"),
    path("endpoints/new/", endpoint_create, name="endpoint-create"),
    path("endpoints/<uuid:pk>/", endpoint_detail, name="endpoint-detail"),
    path("endpoints/<uuid:pk>/<str:action>/", endpoint_action, name="endpoint-action"),
]
