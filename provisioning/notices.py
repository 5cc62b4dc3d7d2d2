"""
What a tenant is told about its reservations, in the console's notifications and the API's: it is
ready, it is queued, it failed, it ends soon, it was evicted. One service for all five, called
inside the transaction of the change it reports, so a rolled-back change tells nobody.

Each notice is sent once: its key names the event and the reservation (``reservation.ready:<id>``;
an ending-soon notice also names the end, so an extended reservation is told again before its new
end), and a retried step, a redelivered task or a second tick finds the key taken and writes
nothing (tenants.notifications.notify_once).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.conf import settings
from django.db.models import F
from django.urls import reverse

from provisioning.choices import ReservationState as R
from provisioning.models import Reservation
from tenants.models import Notification
from tenants.notifications import notify_once

READY = "reservation.ready"
QUEUED = "reservation.queued"
FAILED = "reservation.failed"
ENDING_SOON = "reservation.ending_soon"
EVICTED = "reservation.evicted"


def _utc(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M} UTC" if moment else "an unknown time"


def _held(reservation: Reservation) -> str:
    """What the reservation holds, in the words of its form: GPUs, or GPU slices of a shared GPU."""
    if reservation.gpus:
        return f"{reservation.gpus} GPU{'s' if reservation.gpus != 1 else ''}"
    return f"{reservation.units} GPU slice{'s' if reservation.units != 1 else ''}"


def _ready(reservation: Reservation, **_) -> tuple[str, str]:
    return (f"{reservation.name} is ready",
            f"Its {_held(reservation)} are running until {_utc(reservation.ends_at)}. Addresses and the SSH user "
            "are on its page.")


def _queued(reservation: Reservation, **_) -> tuple[str, str]:
    return (f"{reservation.name} is queued",
            f"No capacity for its {_held(reservation)} could be taken when it was made, so it waits in the queue "
            "and starts as soon as the scheduler places it; you are told here when it is ready. Its page shows its "
            "place in the queue and why it waits.")


def _failed(reservation: Reservation, **_) -> tuple[str, str]:
    reason = reservation.state_reason or "Provisioning could not be completed."
    return (f"{reservation.name} failed",
            f"{reason.rstrip('.')}. Its capacity was given back and nothing more is billed for it. Reserve again to "
            "try once more.")


def _ending_soon(reservation: Reservation, *, now: datetime, **_) -> tuple[str, str]:
    minutes = max(1, round((reservation.ends_at - now).total_seconds() / 60))
    return (f"{reservation.name} ends in {minutes} minutes",
            f"It ends at {_utc(reservation.ends_at)}; its instances are then released and their disks and GPU "
            "memory wiped. Save your work, or extend the reservation from its page if you need longer.")


def _evicted(reservation: Reservation, *, at: datetime, now: datetime, **_) -> tuple[str, str]:
    if reservation.state == R.PREEMPTED:
        body = ("Its spot capacity was needed by higher-priority work before it started: nothing ran and nothing is "
                "billed. Reserve again, or choose on-demand or reserved billing for work that must not be "
                "interrupted.")
    elif at > now:
        body = (f"Its spot capacity is needed by higher-priority work: its instances are stopped and released at "
                f"{_utc(at)}, after the grace period. Save your work before then.")
    else:
        body = ("Its spot capacity was needed by higher-priority work: its instances were stopped and are being "
                "released. Billing stopped with them.")
    return f"{reservation.name} was preempted", body


TEXTS = {READY: _ready, QUEUED: _queued, FAILED: _failed, ENDING_SOON: _ending_soon, EVICTED: _evicted}


def notice_key(event: str, reservation: Reservation) -> str:
    """The key that makes ``event`` a once-only notice for ``reservation``."""
    key = f"{event}:{reservation.pk}"
    return f"{key}:{reservation.ends_at:%Y%m%d%H%M}" if event == ENDING_SOON else key


def reservations_notify(reservations: Iterable[Reservation], event: str, **facts) -> int:
    """
    Tell each reservation's team (or its whole tenant) about ``event``, once per reservation and
    event, whatever is retried; ``facts`` are what the text needs beyond the reservation (``now``,
    ``at``). One query for the keys already sent and one INSERT. Returns how many were sent.
    """
    text = TEXTS[event]
    rows = []
    for reservation in reservations:
        title, body = text(reservation, **facts)
        rows.append(Notification(
            tenant_id=reservation.tenant_id, team_id=reservation.team_id, kind=event, title=title, body=body,
            link=reverse("reservation-detail", args=[reservation.pk]), key=notice_key(event, reservation)))
    return notify_once(rows)


def reservations_ending_soon(*, now: datetime) -> int:
    """
    The tick's part: tell every active reservation ending within MERIDIAN_RESERVATION_ENDING_NOTICE
    that it ends soon (those whose whole window is shorter than that lead are not told: they would
    hear it as they start). Returns how many were told now.
    """
    lead = settings.MERIDIAN_RESERVATION_ENDING_NOTICE
    due = list(Reservation.objects.filter(state=R.ACTIVE, ends_at__gt=now, ends_at__lte=now + lead,
                                          starts_at__lte=F("ends_at") - lead)
               .only("pk", "name", "tenant_id", "team_id", "ends_at").order_by("ends_at"))
    return reservations_notify(due, ENDING_SOON, now=now)
