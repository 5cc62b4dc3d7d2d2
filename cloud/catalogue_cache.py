"""
Catalogue rows looked up by slug (offerings, regions), remembered by each process while the
catalogue is unchanged.

Every create names its offering and its regions by slug: two queries, most of their time spent
building them. The catalogue changes a few times a day (staff add an offering, take one off sale,
retire a region), so a process keeps the rows it looked up under CATALOGUE_EPOCH (core.epochs),
which every saved or deleted offering, region or GPU model replaces, and for at most
MERIDIAN_CATALOGUE_CACHE_SECONDS. Each lookup gets its own copy of the row; a slug not found is
not remembered (it is looked up again, and a 400 costs its query).
"""

from __future__ import annotations

import copy

from django.conf import settings

from core.epochs import Epoch, KeptUnder

CATALOGUE_EPOCH = Epoch("meridian:catalogue-epoch")


class SlugLookups:
    """Per process: (what was asked, slug) -> the row, kept under CATALOGUE_EPOCH."""

    def __init__(self):
        self._kept = KeptUnder(CATALOGUE_EPOCH, lambda: settings.MERIDIAN_CATALOGUE_CACHE_SECONDS)

    def get(self, queryset, slug_field: str, slug: str, *, asked: str):
        """``queryset.get(slug_field=slug)`` remembered under ``asked`` (one name per queryset); raises as get."""
        return copy.copy(self._kept.get((asked, slug), lambda: queryset.get(**{slug_field: slug})))

    def clear(self) -> None:
        self._kept.clear()


CATALOGUE = SlugLookups()


def watch_catalogue() -> None:
    from cloud.models import GPUModel, Offering, Region

    CATALOGUE_EPOCH.watch(Offering, Region, GPUModel)
