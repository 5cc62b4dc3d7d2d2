"""
The price that will apply to new work, for the catalogue and the reserve form. The price book lives
in the billing app, above this one: billing registers its answer here when it loads
(``price_source``); without it (cloud alone) the offering's list prices answer.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import Decimal

ON_DEMAND, RESERVED, SPOT = "on_demand", "reserved", "spot"
TERMS = (ON_DEMAND, RESERVED, SPOT)

_source: Callable[..., dict] | None = None


def price_source(source: Callable[..., dict]) -> None:
    """Register ``source(offerings, region, at) -> {offering id: {term: price per GPU-hour}}``."""
    global _source
    _source = source


def list_prices(offering) -> dict[str, Decimal]:
    """The offering's own prices: on-demand, reserved at its discount, spot at its floor (where it has spot)."""
    prices = {ON_DEMAND: offering.price_per_gpu_hour, RESERVED: offering.reserved_price_per_gpu_hour}
    if offering.spot_available:
        prices[SPOT] = offering.spot_floor_price
    return prices


def prices_now(offerings, *, region=None, at: datetime) -> dict:
    """Each offering's price per GPU-hour per term at ``at`` in ``region`` (None: where no region has its own)."""
    offerings = list(offerings)
    if _source is not None:
        return _source(offerings, region, at)
    return {offering.pk: list_prices(offering) for offering in offerings}
