"""
The console's webhooks page (tenant admins and owners): the endpoints, a form for a new one, each
endpoint's ping, rotation, on/off and removal, and the latest deliveries with a button to send a
failed one again. A secret is shown once, on the page that answers its create or rotation.
"""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from core.errors import DomainError
from web.console import CHANGE, console_page, error_text, scoped, scoped_or_404
from webhooks import catalogue, services
from webhooks.models import WebhookDelivery, WebhookEndpoint

RECENT = 25


@console_page("webhooks")
def webhook_list(request):
    if request.principal.tenant is None:
        return redirect("console-tenants")
    return render(request, "webhooks/webhooks.html", {
        "endpoints": scoped(request, WebhookEndpoint).order_by("created_at"),
        "deliveries": scoped(request, WebhookDelivery).select_related("endpoint").order_by("-created_at")[:RECENT],
        "families": catalogue.FAMILIES, "form": request.POST or {"event_types": "reservation.*"}})


@never_cache
@require_POST
@console_page("webhooks")
def webhook_create(request):
    types = [t.strip() for t in request.POST.get("event_types", "").replace(" ", ",").split(",") if t.strip()]
    try:
        endpoint, secret = services.endpoint_create(actor=request.principal, url=request.POST.get("url", "").strip(),
                                                    event_types=types,
                                                    description=request.POST.get("description", "").strip())
    except DomainError as exc:
        messages.error(request, error_text(exc))
        return webhook_list(request)
    return render(request, "webhooks/secret.html", {"endpoint": endpoint, "secret": secret, "new": True})


@never_cache
@require_POST
@console_page("webhooks")
def webhook_action(request, pk, action):
    endpoint = scoped_or_404(request, WebhookEndpoint, CHANGE, pk=pk)
    try:
        if action == "rotate":
            endpoint, secret = services.secret_rotate(actor=request.principal, endpoint=endpoint)
            return render(request, "webhooks/secret.html", {"endpoint": endpoint, "secret": secret, "new": False})
        if action == "ping":
            services.ping(actor=request.principal, endpoint=endpoint)
            messages.success(request, f"A webhook.ping is on its way to {endpoint.url}.")
        elif action in ("on", "off"):
            services.endpoint_update(actor=request.principal, endpoint=endpoint, is_active=action == "on")
            messages.success(request, f"{endpoint.url} is {'on' if action == 'on' else 'off'}.")
        elif action == "remove":
            services.endpoint_delete(actor=request.principal, endpoint=endpoint)
            messages.success(request, f"{endpoint.url} is removed: it is sent nothing more.")
    except DomainError as exc:
        messages.error(request, error_text(exc))
    return redirect("webhooks")


@require_POST
@console_page("webhooks")
def delivery_resend(request, pk):
    delivery = scoped_or_404(request, WebhookDelivery.objects.select_related("endpoint"), CHANGE, pk=pk)
    try:
        services.redeliver(actor=request.principal, delivery=delivery)
    except DomainError as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(request, f"The {delivery.event_type} delivery is sent again.")
    return redirect("webhooks")


urlpatterns = [
    path("webhooks/", webhook_list, name="webhooks"),
    path("webhooks/new/", webhook_create, name="webhook-create"),
    path("webhooks/<uuid:pk>/<str:action>/", webhook_action, name="webhook-action"),
    path("webhooks/deliveries/<uuid:pk>/resend/", delivery_resend, name="webhook-resend"),
]
