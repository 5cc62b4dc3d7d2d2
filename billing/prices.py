"""
The price book: what a GPU-hour of an offering costs in a region on a term at a moment, and what a
GiB-hour of a storage class costs. A price row starts at ``effective_from`` and lasts until the next
one of the same offering, region and term; a region's own row comes before an every-region row;
with none, the offering's list prices are the book (on-demand, the reserved discount, the spot
floor). Staff add prices for the future only, so a change never reprices usage already recorded.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from billing.models import Commitment, Price, SpotPrice
from billing.spot import SpotHistory
from cloud.models import Offering
from cloud.pricing import ON_DEMAND, RESERVED, SPOT
from core.errors import Conflict, invalid
from provisioning.usage import price_per_gpu_hour
from security.audit import audit_record

HOURS_PER_MONTH = Decimal(730)  # a GiB-month is 730 GiB-hours (storage.usage)


class PriceBook:
    """Every price, read once: ``gpu_hour`` answers from memory (the meter rates thousands of records a run)."""

    def __init__(self):
        self.spot = None  # the spot market's history, read at the first spot record
        self.rows: dict[tuple, list[tuple[datetime, Decimal, str]]] = defaultdict(list)
        for row in Price.objects.order_by("effective_from").values_list(
                "offering_id", "region_id", "term", "effective_from", "per_gpu_hour", "currency"):
            self.rows[row[:3]].append(row[3:])
        self.starts = {key: [row[0] for row in rows] for key, rows in self.rows.items()}
        self.list_prices = {o["pk"]: o for o in Offering.objects.values(
            "pk", "price_per_gpu_hour", "reserved_discount_pct", "spot_floor_price")}
        self._committed = None

    @property
    def committed(self) -> dict:
        """A commitment's reservation -> (rate, currency): its GPU time is rated at the committed rate (read once)."""
        if self._committed is None:
            self._committed = {reservation: (rate, currency) for reservation, rate, currency in
                               Commitment.objects.values_list("reservation_id", "rate", "currency")}
        return self._committed

    def spot_average(self, offering_id, region_id, start: datetime, end: datetime) -> Decimal | None:
        """The spot market's time-weighted price over ``[start, end)`` (None: no market price then)."""
        if self.spot is None:
            self.spot = SpotHistory(since=start)  # the meter goes forward from its first window
        return self.spot.average(offering_id, region_id, start, end)

    def gpu_hour(self, offering_id, region_id, term: str, at: datetime) -> tuple[Decimal, str]:
        """The price per GPU-hour and its currency of ``offering_id`` in ``region_id`` on ``term`` at ``at``."""
        for key in ((offering_id, region_id, term), (offering_id, None, term)):
            rows = self.rows.get(key)
            if rows:
                i = bisect.bisect_right(self.starts[key], at) - 1
                if i >= 0:
                    return rows[i][1], rows[i][2]
        offering = self.list_prices[offering_id]
        return price_per_gpu_hour(term, offering["price_per_gpu_hour"], offering["reserved_discount_pct"],
                                  offering["spot_floor_price"]), "USD"


def prices_now(offerings, region, at: datetime) -> dict:
    """
    What new work pays per GPU-hour per term (cloud.pricing's answer): the price book's on-demand
    and reserved prices, and spot at the market's latest price in ``region`` (its floor where the
    market has none, or no region is named).
    """
    book = PriceBook()
    market = {}
    if region is not None:
        latest = (SpotPrice.objects.filter(offering=OuterRef("pk"), region=region, at__lte=at).order_by("-at")
                  .values("per_gpu_hour")[:1])
        market = dict(Offering.objects.filter(pk__in=[o.pk for o in offerings if o.spot_available])
                      .annotate(market=Subquery(latest)).filter(market__isnull=False).values_list("pk", "market"))
    region_id = getattr(region, "pk", None)
    answer = {}
    for offering in offerings:
        prices = {term: book.gpu_hour(offering.pk, region_id, term, at)[0] for term in (ON_DEMAND, RESERVED)}
        if offering.spot_available:
            prices[SPOT] = market.get(offering.pk, book.gpu_hour(offering.pk, region_id, SPOT, at)[0])
        answer[offering.pk] = prices
    return answer


def gib_hour(price_per_gib_month: Decimal) -> Decimal:
    return price_per_gib_month / HOURS_PER_MONTH


@transaction.atomic
def price_add(*, actor, offering: Offering, term: str, per_gpu_hour: Decimal, effective_from: datetime,
              region=None, currency: str = "USD") -> Price:
    """A new price from ``effective_from`` (in the future): the usage already recorded keeps its price."""
    if effective_from <= timezone.now():
        raise invalid("effective_from", "A price starts in the future: what ran already keeps the price it ran at.",
                      code="effective_in_past")
    if per_gpu_hour < 0:
        raise invalid("per_gpu_hour", "A price is zero or more.", code="min_value")
    try:
        with transaction.atomic():
            price = Price.objects.create(offering=offering, region=region, term=term, per_gpu_hour=per_gpu_hour,
                                         currency=currency, effective_from=effective_from,
                                         created_by=getattr(actor, "user", actor))
    except IntegrityError:
        raise Conflict("A price of this offering, region and term already starts then: choose another time.",
                       code="price_period_taken") from None
    audit_record(actor=actor, action="price.add", target=price, after={
        "offering": offering.slug, "region": region.slug if region else None, "term": term,
        "per_gpu_hour": str(per_gpu_hour), "currency": currency, "effective_from": effective_from.isoformat()})
    return price
