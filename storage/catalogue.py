"""The storage classes a region is sold with by default (the demo world, a new region's starting point)."""

from __future__ import annotations

from decimal import Decimal

from storage.choices import StorageKind
from storage.models import StorageClass

# kind -> (name, $ per GiB-month, min GiB, max GiB): list prices of the tiers GPU clouds sell.
DEFAULT_CLASSES = {
    StorageKind.SCRATCH: ("Local NVMe scratch", Decimal("0.0000"), 1, 30_720),
    StorageKind.BLOCK: ("Block volume (NVMe over RDMA)", Decimal("0.1000"), 10, 65_536),
    StorageKind.SHARED_FS: ("Shared file system (parallel, GPFS-class)", Decimal("0.2000"), 100, 1_048_576),
    StorageKind.OBJECT: ("Object and archive", Decimal("0.0200"), 1, 10_485_760),
}


def default_storage_classes(region, backend: str = "simulated") -> list[StorageClass]:
    """The region's four classes, made where missing (slugs ``<region>-<kind>``)."""
    made = []
    for kind, (name, price, low, high) in DEFAULT_CLASSES.items():
        made.append(StorageClass.objects.get_or_create(slug=f"{region.slug}-{kind.replace('_', '-')}", defaults={
            "name": name, "kind": kind, "region": region, "price_per_gib_month": price, "min_gib": low,
            "max_gib": high, "backend": backend})[0])
    return made
