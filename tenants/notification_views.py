"""
The console's notification pages: the principal's notifications, newest first, each linked to the
console page it is about; mark one or all read (htmx swaps the row).
"""

from __future__ import annotations

import re

from django.contrib import messages
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from core.errors import DomainError
from tenants.models import Notification
from tenants.notifications import notification_mark_all_read, notification_mark_read
from web.console import (
    CHANGE,
    console_page,
    error_text,
    scoped,
    scoped_or_404,
)

PAGE_SIZE = 50
HP_API_LINK = re.compile(r"^/api/v1/high-priority-applications/(?P<pk>[0-9a-fA-F-]{36})/$")


def console_link(link: str) -> str:
    """
    A notification's link as a console page: an application's API path becomes its page here;
    anything that is not a path on this site is dropped (links are the services', but an href is
    only ever a local path).
    """
    match = HP_API_LINK.match(link or "")
    if match:
        return reverse("high-priority-application", args=[match["pk"]])
    return link if link.startswith("/") and not link.startswith("//") else ""


def _with_links(notifications):
    for notification in notifications:
        notification.console_link = console_link(notification.link)
    return notifications


def unread_notifications(request, limit: int = 8) -> list[Notification]:
    """The principal's newest unread notifications, each with its ``console_link`` (for the dashboard)."""
    rows = scoped(request, Notification).filter(read_at__isnull=True).order_by("-created_at")[:limit]
    return _with_links(list(rows))


@console_page("notifications")
def notification_list(request):
    """Yours and your tenant's (narrowed to your teams), newest first, unread marked."""
    if request.principal.tenant is None:
        return redirect("console-tenants")
    rows = scoped(request, Notification).select_related("team").order_by("-created_at", "pk")
    page = Paginator(rows, PAGE_SIZE).get_page(request.GET.get("page"))
    _with_links(page.object_list)
    unread = scoped(request, Notification).filter(read_at__isnull=True).count()
    return render(request, "tenants/notifications.html", {"page": page, "unread": unread})


def _list_page(request) -> str:
    """Back to the page of the list the form was on (post/redirect/get)."""
    page = request.POST.get("page", "")
    url = reverse("notification-list")
    return f"{url}?page={page}" if page.isdigit() and page != "1" else url


@require_POST
@console_page("notifications")
def notification_read(request, pk):
    notification = scoped_or_404(request, Notification.objects.select_related("team"), CHANGE, pk=pk)
    error = ""
    try:
        notification = notification_mark_read(actor=request.principal, notification=notification)
    except DomainError as exc:
        error = error_text(exc)
    if request.htmx:
        _with_links([notification])
        return render(request, "tenants/_notification_row.html", {
            "n": notification, "page_number": request.POST.get("page", ""), "row_error": error})
    if error:
        messages.error(request, error)
    return redirect(_list_page(request))


@require_POST
@console_page("notifications")
def notification_read_all(request):
    try:
        marked = notification_mark_all_read(actor=request.principal)
    except DomainError as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(request, f"{marked} notification{'' if marked == 1 else 's'} marked read."
                         if marked else "Nothing was unread.")
    return redirect("notification-list")
