"""
In-app notifications (DESIGN.md "Money and messages"): a list per tenant and user, shown in the
console and the API. Services write them inside the transaction of the change they report, so a
rolled-back change never notifies. Each is also an event of its kind for the tenant's webhooks
(``tenants.events``).
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from security.audit import audit_record
from tenants.events import Happened, emit_many
from tenants.models import Notification, Team, Tenant, User
from tenants.scoping import CHANGE, Principal

TITLE_MAX = Notification._meta.get_field("title").max_length


def unread_count(principal: Principal) -> int:
    """How many notifications the principal has unread (one COUNT on the unread index; staff read none)."""
    if principal is None or principal.tenant is None:
        return 0
    return Notification.objects.visible_to(principal).filter(read_at__isnull=True).count()


def notify(tenant: Tenant, *, user: User | None = None, team: Team | None = None, kind: str, title: str, body: str,
           link: str = "", key: str = "") -> Notification | None:
    """
    Leave a notification for ``user`` in ``tenant``, or for everyone there who may see ``team``'s
    objects (no user), or for the whole tenant (neither). A system message: not audited itself,
    the change it reports is. With a ``key`` it is sent once: when a notification with that key
    exists already (a retried step, a second tick), nothing is stored and None comes back.
    """
    if team is not None and team.tenant_id != tenant.pk:
        raise ValueError(f"team {team.pk} is not in tenant {tenant.pk}")
    notification = Notification(tenant=tenant, user=user, team=team, kind=kind, title=title[:TITLE_MAX], body=body,
                                link=link, key=key)
    if not key:
        notification.save(force_insert=True)
        _tell([notification])
        return notification
    return notification if notify_once([notification]) else None


def notify_once(notifications: list[Notification]) -> int:
    """
    Store keyed notifications, each only if no notification has its key yet: those already sent
    are left out, the rest go in one INSERT ... ON CONFLICT DO NOTHING (the unique key), so a
    racing writer's copy makes this one wait and then skip. Returns how many were sent (a copy
    that lost such a race still counts).
    """
    if any(not n.key for n in notifications):
        raise ValueError("notify_once needs a key on every notification")
    sent = set(Notification.objects.filter(key__in=[n.key for n in notifications]).values_list("key", flat=True))
    new = [n for n in notifications if n.key not in sent]
    for n in new:
        n.title = n.title[:TITLE_MAX]
    if new:
        Notification.objects.bulk_create(new, ignore_conflicts=True)
        _tell(new)
    return len(new)


def _tell(notifications: list[Notification]) -> None:
    """Each notification as an event of its kind, for the tenant's webhooks."""
    emit_many(Happened(tenant_id=n.tenant_id, team_id=n.team_id, type=n.kind, data={
        "notification": str(n.pk), "title": n.title, "body": n.body, "link": n.link,
        "user": str(n.user_id) if n.user_id else None}) for n in notifications)


@transaction.atomic
def notification_mark_read(*, actor: Principal, notification: Notification) -> Notification:
    """Mark one notification read (for every reader of a shared one). Marking it again changes nothing."""
    now = timezone.now()
    if Notification.objects.filter(pk=notification.pk, read_at__isnull=True).update(read_at=now):
        audit_record(actor=actor, action="notification.read", target=notification, after={"read_at": now.isoformat()})
    notification.refresh_from_db(fields=["read_at"])
    return notification


@transaction.atomic
def notification_mark_all_read(*, actor: Principal) -> int:
    """Mark every unread notification the actor can see as read; returns how many. One audit event."""
    marked = Notification.objects.visible_to(actor, CHANGE).filter(read_at__isnull=True).update(
        read_at=timezone.now())
    if marked and actor.tenant is not None:
        audit_record(actor=actor, action="notification.read_all", target=actor.tenant, tenant_id=actor.tenant.pk,
                     after={"marked_read": marked})
    return marked
