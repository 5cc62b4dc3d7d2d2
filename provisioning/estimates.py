"""
What a reservation would get before it is made: live availability in the regions asked, the
price estimate, the quota left and the expected start. Read-only; the console's new-reservation
form shows it as the form is filled in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Q, Sum

from cloud.choices import pool_of
from cloud.pricing import prices_now
from provisioning.admission import Ask, quota_headroom
from provisioning.capacity import availability
from provisioning.choices import BillingTerm
from provisioning.choices import ReservationState as R
from provisioning.models import Reservation
from provisioning.scheduling.queue import free_enough_at


@dataclass(frozen=True)
class Estimate:
    available: dict[str, int]  # units sellable now per region asked, preferred first
    fits_now: str | None  # the first region that has room now, if any
    price_per_gpu_hour: Decimal
    hours: float
    term: str
    total_price: Decimal
    quota: list[dict]  # [{"scope", "label", "per_model", "limit", "in_use", "left", "enough"}]
    expected_start: datetime | None
    start_note: str
    starts_now: bool = False  # placed at once when made (unless queued work of the model outranks it)
    units: int = 0  # what the request asks, in the units ``available`` counts

    @property
    def regions(self) -> list[dict]:
        """Each region asked, preferred first: units free now and whether that is enough."""
        return [{"slug": slug, "free": units, "enough": units >= self.units} for slug, units in self.available.items()]


def estimate(*, ask: Ask, tenant, team, now: datetime) -> Estimate:
    offering = ask.offering
    per_region = availability([offering]).get(offering.pk, {})
    available = {r.slug: per_region.get(r.slug, {}).get("units", 0) for r in ask.regions}
    fits_now = next((slug for slug, units in available.items() if units >= ask.units), None)

    # The price book's price in the preferred region (spot: the market's latest), as the meter will rate it.
    price = prices_now([offering], region=ask.regions[0] if ask.regions else None, at=now)[offering.pk].get(
        ask.billing_term, offering.price_per_gpu_hour)
    if ask.billing_term == BillingTerm.SPOT and ask.spot_max_price is not None:
        price = min(price, ask.spot_max_price)
    hours = Decimal(str(ask.duration.total_seconds() / 3600))
    total = (Decimal(str(ask.gpu_equivalent)) * hours * price).quantize(Decimal("0.01"))

    window_start = max(ask.requested_start or now, now)
    quota = [{"scope": limit.scope, "label": limit.label, "per_model": limit.gpu_model_id is not None,
              "limit": limit.limit, "in_use": round(used, 2),
              "left": round(max(limit.limit - used, 0), 2), "enough": used + ask.gpu_equivalent <= limit.limit}
             for limit, used in quota_headroom(tenant=tenant, team=team, ask=ask, window_start=window_start)]

    start, note, starts_now = _expected_start(ask, fits_now, now)
    return Estimate(available=available, fits_now=fits_now, price_per_gpu_hour=price, total_price=total,
                    hours=float(hours), term=BillingTerm(ask.billing_term).label,
                    quota=quota, expected_start=start, start_note=note, starts_now=starts_now, units=ask.units)


def _expected_start(ask: Ask, fits_now: str | None, now: datetime) -> tuple[datetime | None, str, bool]:
    """When it would start, why, and whether it would be placed at once (else it queues)."""
    if ask.requested_start is not None:
        return ask.requested_start, "an advance reservation: placed for its window when it is made, if it fits", False
    # Queued work of a higher score for the model keeps a new request from the fast path; the
    # request's own score is not known before it is made, so any queued work is named.
    queued = Reservation.objects.filter(state=R.QUEUED, gpu_model_id=ask.offering.gpu_model_id).aggregate(
        n=Sum("gpus"))["n"] or 0
    if fits_now:
        if queued:
            return now, (f"placed at once in {fits_now} unless the {queued} queued GPUs of this model outrank it; "
                         "then it waits its turn"), True
        return now, f"placed at once in {fits_now}", True
    # When enough GPUs of the model free up in the first region for it and what is queued of that
    # model (as a queued reservation's estimate is made, provisioning.scheduling.queue).
    region = ask.regions[0]
    start = free_enough_at(gpu_model_id=ask.offering.gpu_model_id,
                           region=Q(node__region=region, node__confidential=ask.offering.confidential),
                           pool=pool_of(ask.offering.kind), needed=max(ask.gpus, 1) + queued, start=now, now=now)
    behind = f", behind {queued} queued GPUs of this model" if queued else ""
    if start is not None:
        return start, f"when GPUs free up in {region.slug}{behind}", False
    return None, f"not before more capacity frees up in {region.slug}{behind}", False
