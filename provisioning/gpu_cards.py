"""
The "Reserve GPUs" page's cards: one per GPU model and offering kind, with the price per GPU-hour
that applies now by billing term (the price book's, where no region has its own: ``cloud.pricing``)
and what is free now per region (as the offerings API counts it:
``provisioning.capacity.availability``). Three queries however many offerings and regions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from django.utils import timezone

from cloud.choices import OfferingKind
from cloud.models import Offering, Region
from cloud.pricing import ON_DEMAND, RESERVED, SPOT, prices_now
from provisioning.capacity import availability


@dataclass
class Card:
    gpu_model: str
    memory_gib: int
    kind: str
    kind_label: str
    offerings: list[dict] = field(default_factory=list)  # sizes: slug, name, on_demand, reserved, spot_from
    free: list[dict] = field(default_factory=list)  # per region: slug, name, free, words, sold_out

    @property
    def from_price(self) -> Decimal:
        return min(o["on_demand"] for o in self.offerings)

    @property
    def sold_out(self) -> bool:
        return all(region["sold_out"] for region in self.free)


def gpu_cards() -> list[Card]:
    offerings = list(Offering.objects.filter(is_active=True).select_related("gpu_model")
                     .order_by("-gpu_model__memory_gib", "gpu_model__name", "kind", "gpus_per_unit", "slots_per_gpu"))
    regions = list(Region.objects.filter(is_active=True).order_by("slug"))
    free = availability(offerings)
    prices = prices_now(offerings, at=timezone.now())
    cards: dict[tuple, Card] = {}
    for offering in offerings:
        model = offering.gpu_model
        card = cards.setdefault((model.pk, offering.kind), Card(
            gpu_model=model.name, memory_gib=model.memory_gib, kind=offering.kind,
            kind_label=offering.get_kind_display()))
        price = prices[offering.pk]
        card.offerings.append({
            "slug": offering.slug, "name": offering.name, "size": _size(offering), "on_demand": price[ON_DEMAND],
            "reserved": price[RESERVED], "spot_from": price.get(SPOT), "free": free.get(offering.pk, {})})
    for card in cards.values():
        for region in regions:
            # Servers for bare metal; GPUs free on the shared hosts otherwise (every size draws on the same ones).
            gpus = max((o["free"].get(region.slug, {}).get("gpus", 0) for o in card.offerings), default=0)
            servers = max((o["free"].get(region.slug, {}).get("units", 0) for o in card.offerings), default=0)
            free = servers if card.kind == OfferingKind.BARE_METAL else gpus
            what = "server" if card.kind == OfferingKind.BARE_METAL else "GPU"
            card.free.append({"slug": region.slug, "name": region.name, "free": free,
                              "words": f"{free:,} {what}{'s' if free != 1 else ''} free", "sold_out": not free})
    return list(cards.values())


def _size(offering) -> str:
    if offering.time_slice_class:
        return f"1/{offering.slots_per_gpu} GPU, time-sliced for {offering.time_slice_class} work"
    if offering.slots_per_gpu > 1:
        return f"1/{offering.slots_per_gpu} GPU"
    if offering.kind == OfferingKind.BARE_METAL:
        return f"{offering.gpus_per_unit}-GPU server"
    return f"{offering.gpus_per_unit} GPU{'s' if offering.gpus_per_unit > 1 else ''}"
