"""
Commitments (docs/billing.md, "Commitments"): a tenant (or one team) commits to N GPUs of an
offering in a region for 1-36 months at the price book's reserved price of the day it commits,
fixed for the term.

The capacity is held by a *committed reservation* made with the commitment: the scheduler places it
as reserved work (it preempts spot, keeps out of the on-demand headroom until it has waited for it)
for the whole term, beyond the
usual cap on a reservation's length, and it cannot be cancelled or released on its own. The meter
rates its allocations at the commitment's rate, term ``committed``: every hour it holds the GPUs is
billed, whether its instances are busy or idle; an hour the scheduler could not yet place it is not.
Anything the tenant runs beyond it is ordinary on-demand (or spot) work at the price book's price:
the overage.

A commitment may hold at most the region's fleet of its GPU model and kind, less what other
commitments hold over the same time (commitments of a region are made one at a time).
"""

from __future__ import annotations

import calendar
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from billing.models import Commitment
from billing.prices import PriceBook
from cloud.models import Offering, Region
from core.errors import Conflict, invalid
from provisioning import admission
from provisioning.choices import BillingTerm
from provisioning.services import reservation_cancel, reservation_create
from security.audit import audit_record

MAX_MONTHS = 36


def add_months(at: datetime, months: int) -> datetime:
    """``at`` moved ``months`` calendar months on (the 31st becomes the month's last day when it has none)."""
    month = at.month - 1 + months
    year, month = at.year + month // 12, month % 12 + 1
    return at.replace(year=year, month=month, day=min(at.day, calendar.monthrange(year, month)[1]))


def committed_gpus(offering: Offering, region: Region, starts_at: datetime, ends_at: datetime) -> int:
    """The GPUs of ``offering``'s model and kind that live commitments (of every tenant) hold in ``region`` then."""
    return Commitment.objects.filter(
        offering__gpu_model_id=offering.gpu_model_id, offering__kind=offering.kind, region=region,
        cancelled_at__isnull=True, starts_at__lt=ends_at, ends_at__gt=starts_at,
    ).aggregate(n=Sum("gpus"))["n"] or 0


@transaction.atomic
def commitment_create(*, actor, name: str, offering: Offering, region: Region, gpus: int, months: int,
                      starts_at: datetime | None = None, team=None, ssh_public_key: str = "") -> Commitment:
    """
    Commit the actor's tenant (or ``team``) to ``gpus`` GPUs of ``offering`` in ``region`` for
    ``months`` from ``starts_at`` (now when left out): 400 for what could never be, 409 when other
    commitments hold the region's fleet then. Makes its committed reservation; audited.
    """
    now = timezone.now()
    name = (name or "").strip()
    if not name or len(name) > 63:
        raise invalid("name", "Name the commitment (1 to 63 characters).", code="required")
    if not 1 <= months <= MAX_MONTHS:
        raise invalid("months", f"A commitment lasts 1 to {MAX_MONTHS} months.", code="out_of_range")
    if offering.slots_per_gpu > 1 or not offering.is_active:
        raise invalid("offering", f"{offering.slug} cannot be committed to: choose an offering of whole GPUs that is "
                                  "sold now.", code="not_committable")
    if gpus < 1 or gpus % offering.gpus_per_unit:
        raise invalid("gpus", f"{offering.slug} comes in units of {offering.gpus_per_unit} GPUs: commit to a "
                              "multiple of that.", code="not_whole_units")
    if starts_at is not None and starts_at < now - settings.MERIDIAN_START_SKEW:
        raise invalid("starts_at", "A commitment starts now or later.", code="start_in_past")
    if starts_at is not None and starts_at > now + settings.MERIDIAN_MAX_ADVANCE:
        raise invalid("starts_at", f"A commitment starts at most {settings.MERIDIAN_MAX_ADVANCE.days} days ahead.",
                      code="start_too_far")
    start = max(starts_at or now, now)
    end = add_months(start, months)
    fleet = admission.REGION_SIZES.largest(offering, [region], at_least=gpus)
    if fleet < gpus:
        raise invalid("gpus", f"{region.slug} has {fleet} GPUs for {offering.slug}: a commitment holds at most that "
                              "many.", code="exceeds_fleet")
    Region.objects.select_for_update().get(pk=region.pk)  # one commitment of a region at a time
    held = committed_gpus(offering, region, start, end)
    if held + gpus > fleet:
        raise Conflict(f"Other commitments hold {held} of the {fleet} GPUs for {offering.slug} in {region.slug} "
                       f"then: at most {max(fleet - held, 0)} more may be committed.", code="fleet_committed",
                       fleet=fleet, committed=held)
    rate, currency = PriceBook().gpu_hour(offering.pk, region.pk, BillingTerm.RESERVED, start)
    reservation = reservation_create(actor=actor, team=team, ask=admission.Ask(
        name=name, offering=offering, units=gpus // offering.gpus_per_unit, regions=(region,), duration=end - start,
        requested_start=starts_at and start, billing_term=BillingTerm.RESERVED, committed=True,
        ssh_public_key=ssh_public_key))
    commitment = Commitment.objects.create(
        tenant=reservation.tenant, team=reservation.team, name=name, offering=offering, region=region, gpus=gpus,
        months=months, starts_at=start, ends_at=end, rate=rate, currency=currency, reservation=reservation,
        created_by=getattr(actor, "user", None))
    audit_record(actor=actor, action="commitment.create", target=commitment, after={
        "offering": offering.slug, "region": region.slug, "gpus": gpus, "months": months, "rate": str(rate),
        "currency": currency, "starts_at": start.isoformat(), "ends_at": end.isoformat()})
    return commitment


@transaction.atomic
def commitment_cancel(*, actor, commitment: Commitment) -> Commitment:
    """Cancel a commitment that has not started (its reservation with it); a started one is binding (409)."""
    locked = Commitment.objects.select_for_update().select_related("reservation").get(pk=commitment.pk)
    if locked.cancelled_at is not None:
        raise Conflict("This commitment is cancelled already.", code="commitment_cancelled")
    if locked.starts_at <= timezone.now():
        raise Conflict(f"This commitment started on {locked.starts_at:%Y-%m-%d} and is binding until "
                       f"{locked.ends_at:%Y-%m-%d}.", code="commitment_binding")
    reservation_cancel(actor=actor, reservation=locked.reservation, reason="Its commitment was cancelled.",
                       commitment_ends=True)
    locked.cancelled_at = timezone.now()
    locked.save(update_fields=["cancelled_at"])
    audit_record(actor=actor, action="commitment.cancel", target=locked)
    return locked

