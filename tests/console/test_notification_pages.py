"""The notifications page: one's own and the tenant's, newest first, unread marked; mark one or all read."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from security.models import AuditEvent
from tenants.models import HighPriorityApplication, Notification
from tenants.notifications import notify

pytestmark = pytest.mark.django_db

PAGE = "/notifications/"


def read_url(notification) -> str:
    return reverse("notification-read", args=[notification.pk])


def many(tenant, n: int, *, team=None, prefix="Note") -> list[Notification]:
    """``n`` unread tenant-wide notifications, one a minute apart, the last the newest."""
    made = Notification.objects.bulk_create([
        Notification(tenant=tenant, team=team, kind="test.note", title=f"{prefix} {i:03d}", body=f"Body {i}.")
        for i in range(n)
    ])
    now = timezone.now()
    for i, notification in enumerate(made):
        Notification.objects.filter(pk=notification.pk).update(created_at=now - timedelta(minutes=n - i))
    return made


def test_list_shows_ones_own_and_the_tenants_only(console, world):
    mine = notify(world.t1.tenant, user=world.users["t1_member"], kind="test.mine", title="For the member", body="")
    theirs = notify(world.t1.tenant, user=world.users["t1_admin"], kind="test.theirs", title="For the admin only",
                    body="")
    team_wide = notify(world.t1.tenant, team=world.t1.team, kind="test.team", title="For the team", body="")
    other = notify(world.t2.tenant, kind="test.other", title="Tenant two's news", body="")

    body = console("t1_member").get(PAGE).content.decode()

    for shown in (mine, team_wide, world.t1.objects[Notification]):
        assert f'id="notification-{shown.pk}"' in body
    for hidden in (theirs, other, world.t2.objects[Notification]):
        assert f'id="notification-{hidden.pk}"' not in body
    assert "Tenant two&#x27;s news" not in body
    viewer = console("t1_viewer").get(PAGE).content.decode()  # not in the team: no team notifications
    assert f'id="notification-{team_wide.pk}"' not in viewer and f'id="notification-{mine.pk}"' not in viewer


def test_newest_first_unread_marked_and_paginated_by_50(console, world):
    made = many(world.t1.tenant, 55)
    Notification.objects.filter(pk=made[-1].pk).update(read_at=timezone.now())
    client = console("t1_member")
    body = client.get(PAGE).content.decode()
    assert body.index("Note 054") < body.index("Note 053")
    assert f'<tr id="notification-{made[-1].pk}" class="read">' in body
    assert f'<tr id="notification-{made[-2].pk}" class="unread">' in body and ">Unread</span>" in body
    assert body.count('<tr id="notification-') == 50 and "Page 1 of 2" in body
    older = client.get(PAGE, {"page": 2}).content.decode()
    assert older.count('<tr id="notification-') == 6 and "Note 000" in older  # 55 + the world's welcome


def test_mark_read_without_script_goes_back_to_the_page(console, world):
    notification = world.t1.objects[Notification]
    response = console("t1_viewer").post(read_url(notification), {"page": "2"})
    assert response.status_code == 302 and response["Location"] == f"{PAGE}?page=2"
    notification.refresh_from_db()
    assert notification.read_at is not None
    assert AuditEvent.objects.filter(action="notification.read", target_id=str(notification.pk)).count() == 1


def test_mark_read_with_htmx_swaps_the_row(console, world):
    notification = world.t1.objects[Notification]
    response = console("t1_member").post(read_url(notification), HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith(f'<tr id="notification-{notification.pk}" class="read">')
    assert "Marked read." in body and "hx-post" not in body
    notification.refresh_from_db()
    assert notification.read_at is not None


def test_mark_all_read_reads_only_what_one_sees(console, world):
    many(world.t1.tenant, 3)
    theirs = notify(world.t1.tenant, user=world.users["t1_admin"], kind="test.theirs", title="The admin's", body="")
    response = console("t1_member").post(reverse("notification-read-all"), follow=True)
    assert "4 notifications marked read." in response.content.decode()
    assert not Notification.objects.filter(tenant=world.t1.tenant, read_at__isnull=True).exclude(pk=theirs.pk).exists()
    theirs.refresh_from_db()
    assert theirs.read_at is None
    assert Notification.objects.get(pk=world.t2.objects[Notification].pk).read_at is None
    again = console("t1_member").post(reverse("notification-read-all"), follow=True).content.decode()
    assert "Nothing was unread." in again


def test_another_tenants_notification_is_a_404(console, world):
    notification = world.t2.objects[Notification]
    for persona in ("t1_member", "t1_owner"):
        assert console(persona).post(read_url(notification)).status_code == 404
    addressed = notify(world.t1.tenant, user=world.users["t1_admin"], kind="test.theirs", title="The admin's", body="")
    assert console("t1_member").post(read_url(addressed)).status_code == 404  # another user's
    notification.refresh_from_db()
    addressed.refresh_from_db()
    assert notification.read_at is None and addressed.read_at is None


def test_high_priority_links_open_the_console_page(console, world):
    application = world.t1.objects[HighPriorityApplication]
    notify(world.t1.tenant, team=world.t1.team, kind="high_priority.approved", title="High priority approved", body="",
           link=f"/api/v1/high-priority-applications/{application.pk}/")
    notify(world.t1.tenant, kind="test.odd", title="Odd link", body="", link="javascript:alert(1)")
    body = console("t1_member").get(PAGE).content.decode()
    assert f'href="{reverse("high-priority-application", args=[application.pk])}">High priority approved' in body
    assert "javascript:" not in body


def test_staff_are_sent_to_choose_a_tenant(console):
    response = console("platform_admin").get(PAGE)
    assert response.status_code == 302 and response["Location"] == reverse("console-tenants")


def test_list_query_count_does_not_grow_with_notifications(console, world, django_assert_max_num_queries):
    many(world.t1.tenant, 2, team=world.t1.team)
    client = console("t1_member")
    client.get(PAGE)
    with CaptureQueriesContext(connection) as few:
        client.get(PAGE)
    many(world.t1.tenant, 40, team=world.t1.team, prefix="More")
    with django_assert_max_num_queries(len(few)):
        body = client.get(PAGE).content.decode()
    assert "More 039" in body


def unread_badge(page: str) -> str | None:
    """The top bar's unread count as drawn (None when it shows none)."""
    import re

    found = re.search(r'<a [^>]*id="topbar-notifications"[^>]*>.*?<span class="count"[^>]*>(\d+)</span>', page, re.S)
    return found[1] if found else None


def test_the_top_bar_counts_what_the_user_has_unread_on_every_page(console, world):
    Notification.objects.filter(tenant=world.t1.tenant).delete()
    notify(world.t1.tenant, user=world.users["t1_member"], kind="test.mine", title="Mine", body="")
    notify(world.t1.tenant, team=world.t1.team, kind="test.team", title="The team's", body="")
    notify(world.t1.tenant, user=world.users["t1_admin"], kind="test.theirs", title="The admin's", body="")
    read = notify(world.t1.tenant, kind="test.read", title="Read already", body="")
    Notification.objects.filter(pk=read.pk).update(read_at=timezone.now())
    member = console("t1_member")

    for page in ("/", "/reservations/", "/vpcs/"):
        assert unread_badge(member.get(page).content.decode()) == "2", page
    assert 'aria-label="Notifications, 2 unread"' in member.get("/").content.decode()
    assert unread_badge(console("t1_viewer").get("/").content.decode()) is None  # not in the team

    member.post(reverse("notification-read-all"))
    assert unread_badge(member.get("/").content.decode()) is None


def test_the_top_bar_count_is_one_query(console, world):
    member = console("t1_member")
    member.get("/reservations/")
    with CaptureQueriesContext(connection) as queries:
        member.get("/reservations/")
    counting = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"] and "notification" in q["sql"]]
    assert len(counting) == 1


def test_a_notification_says_what_happened_in_words_not_its_code(console, world):
    notify(world.t1.tenant, team=world.t1.team, kind="reservation.ready", title="job is ready", body="Running.")
    notify(world.t1.tenant, team=world.t1.team, kind="high_priority.approved", title="Approved", body="")

    page = console("t1_member").get(PAGE).content.decode()

    assert "<code>reservation.ready</code>" not in page and "<code>high_priority.approved</code>" not in page
    assert "Reservation ready" in page and "High priority approved" in page
