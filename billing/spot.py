"""
The spot market (docs/billing.md, "Spot"): each spot offering's price per region moves with how much
of the region's GPUs of its model are held.

The rule: the floor while at most MERIDIAN_SPOT_KNEE (half) of them are held; from there it rises
in a straight line to the offering's on-demand price when all are held:

    price = floor + (on_demand - floor) * max(0, (held - knee) / (1 - knee))

rounded to a hundredth of a cent. The beat sets it every MERIDIAN_SPOT_SECONDS (300) and keeps
every price set, so spot work is billed at the time-weighted price of each hour it ran (the meter
asks ``average``). Spot work whose max price is now below the price is evicted with the soft grace,
saying so; a new spot reservation whose max price is below the price now is refused.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from billing.models import SpotPrice
from cloud.choices import GPUState, NodeState
from cloud.models import GPU, Offering, Region
from core.errors import Conflict
from provisioning.choices import BillingTerm
from provisioning.choices import ReservationState as R
from provisioning.models import Allocation, Reservation
from provisioning.services import reservation_evict

PLACES = Decimal("0.0001")
# Nodes whose GPUs are not for sale now: they count in neither side of the share.
OUT_OF_SERVICE = (NodeState.ENROLLED, NodeState.VALIDATING, NodeState.QUARANTINED, NodeState.REFERENCE_UNAVAILABLE,
                  NodeState.FAULTY, NodeState.REPAIR, NodeState.MAINTENANCE)


def market_price(floor: Decimal, on_demand: Decimal, held: Decimal) -> Decimal:
    """The rule above, for a share ``held`` (0-1) of the region's GPUs of the model."""
    knee = Decimal(str(settings.MERIDIAN_SPOT_KNEE))
    rise = max(Decimal(0), (held - knee) / (1 - knee)) if knee < 1 else Decimal(0)
    return (floor + (on_demand - floor) * min(rise, Decimal(1))).quantize(PLACES, ROUND_HALF_EVEN)


def utilization(now: datetime) -> dict[tuple, Decimal]:
    """Per (region, GPU model): the share of its GPUs held now (of those that can be sold)."""
    sellable = (GPU.objects.exclude(state=GPUState.QUARANTINED).exclude(node__state__in=OUT_OF_SERVICE)
                .values_list("node__region_id", "model_id").annotate(n=Count("pk")).order_by())
    held = _held(now)
    return {(region, model): Decimal(held.get((region, model), 0)) / Decimal(total)
            for region, model, total in sellable if total}


def _held(now: datetime) -> dict[tuple, int]:
    rows = (Allocation.objects.holding(now).values("node__region_id", "gpu__model_id")
            .annotate(n=Count("gpu_id", distinct=True)).order_by())
    return {(row["node__region_id"], row["gpu__model_id"]): row["n"] for row in rows}


@transaction.atomic
def spot_update(now: datetime | None = None) -> dict:
    """Set every spot offering's price in every region with its GPUs, then evict spot work priced out."""
    now = now or timezone.now()
    shares = utilization(now)
    regions = dict(Region.objects.values_list("pk", "slug"))
    set_prices, evicted = [], 0
    for offering in Offering.objects.filter(spot_available=True, is_active=True):
        for (region_id, model_id), held in shares.items():
            if model_id != offering.gpu_model_id:
                continue
            price = market_price(offering.spot_floor_price, offering.price_per_gpu_hour, held)
            set_prices.append(SpotPrice(offering=offering, region_id=region_id, at=now, per_gpu_hour=price,
                                        utilization=held.quantize(PLACES)))
            evicted += _evict_priced_out(offering, region_id, regions.get(region_id, ""), price, now)
    SpotPrice.objects.bulk_create(set_prices)
    return {"prices": len(set_prices), "evicted": evicted}


def _evict_priced_out(offering: Offering, region_id, region: str, price: Decimal, now: datetime) -> int:
    victims = list(Reservation.objects.filter(
        offering=offering, region_id=region_id, billing_term=BillingTerm.SPOT, spot_max_price__lt=price,
        state__in=(R.SCHEDULED, R.PROVISIONING, R.ACTIVE)).values_list("pk", "spot_max_price"))
    for victim_id, max_price in victims:
        reservation_evict(victim_id=victim_id, by=None, at=now + settings.MERIDIAN_SPOT_GRACE,
                          cause=f"The spot price of {offering.slug} in {region} rose to {price}/GPU-hour, above "
                                f"your max price of {max_price}")
    return len(victims)


def price_now(offering_id, region_id) -> Decimal | None:
    """The spot price set last for the offering in the region (None: none set yet)."""
    return (SpotPrice.objects.filter(offering_id=offering_id, region_id=region_id).order_by("-at")
            .values_list("per_gpu_hour", flat=True).first())


def spot_admission(*, ask, **_) -> None:
    """Refuse a spot reservation whose max price is below the price now in every region it may run (registered)."""
    if ask.billing_term != BillingTerm.SPOT or ask.spot_max_price is None:
        return
    prices = [price_now(ask.offering.pk, region.pk) for region in ask.regions]
    known = [p for p in prices if p is not None]
    if known and all(ask.spot_max_price < p for p in known):
        raise Conflict(f"The spot price of {ask.offering.slug} is {min(known)}/GPU-hour now, above your max price "
                       f"of {ask.spot_max_price}: raise it, or wait for the price to fall (GET /api/v1/spot-prices/).",
                       code="spot_price_above_max", price=str(min(known)))


class SpotHistory:
    """Every spot price set, read once: the time-weighted price of any interval from memory (the meter's)."""

    def __init__(self, since: datetime):
        self.rows: dict[tuple, list[tuple[datetime, Decimal]]] = defaultdict(list)
        before = {}
        for offering, region, at, price in SpotPrice.objects.filter(at__lt=since).order_by(
                "offering_id", "region_id", "at").values_list("offering_id", "region_id", "at", "per_gpu_hour"):
            before[(offering, region)] = (at, price)  # the last one before: in force at ``since``
        for key, row in before.items():
            self.rows[key].append(row)
        for offering, region, at, price in SpotPrice.objects.filter(at__gte=since).order_by("at").values_list(
                "offering_id", "region_id", "at", "per_gpu_hour"):
            self.rows[(offering, region)].append((at, price))

    def average(self, offering_id, region_id, start: datetime, end: datetime) -> Decimal | None:
        """The time-weighted price over ``[start, end)``; None where no price was in force at its start."""
        rows = self.rows.get((offering_id, region_id))
        if not rows:
            return None
        times = [at for at, _ in rows]
        i = bisect.bisect_right(times, start) - 1
        if i < 0:
            return None
        total, at = Decimal(0), start
        while at < end:
            nxt = times[i + 1] if i + 1 < len(times) and times[i + 1] < end else end
            total += rows[i][1] * Decimal((nxt - at).total_seconds())
            at, i = nxt, i + 1
        return (total / Decimal((end - start).total_seconds())).quantize(Decimal("0.000001"), ROUND_HALF_EVEN)


def history_prune(now: datetime | None = None) -> int:
    """Spot prices older than MERIDIAN_SPOT_HISTORY_DAYS go (the ledger keeps what was billed at them)."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.MERIDIAN_SPOT_HISTORY_DAYS)
    return SpotPrice.objects.filter(at__lt=cutoff).delete()[0]
