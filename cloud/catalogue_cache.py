"""
Catalogue rows looked up by slug (offerings, regions), remembered by each process while the
catalogue is unchanged.

Every create names its offering and its regions by slug: two queries, most of their time spent
building them. The catalogue changes a few times a day (staff add an offering, take one off sale,
retire a region), so a process keeps the rows it looked up under CATALOGUE_EPOCH (cloud.epochs),
which every saved or deleted offering, region or GPU model replaces, and for at most
MERIDIAN_CATALOGUE_CACHE_SECONDS. Each lookup gets its own copy of the row; a slug not found is
not remembered (it is looked up again, and a 400 costs its query).
"""

from __future__ import annotations

import copy
import threading
import time

from django.conf import settings

from .epochs import UNREADABLE, Epoch

CATALOGUE_EPOCH = Epoch("meridian:catalogue-epoch")


class SlugLookups:
    """Per process, thread-safe: (what was asked, slug) -> the row, with the epoch it was read under."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rows: dict[tuple, tuple] = {}

    def get(self, queryset, slug_field: str, slug: str, *, asked: str):
        """``queryset.get(slug_field=slug)`` remembered under ``asked`` (one name per queryset); raises as get."""
        epoch = CATALOGUE_EPOCH.read()
        kept = self._rows.get((asked, slug))
        if (kept is not None and epoch is not UNREADABLE and kept[0] == epoch
                and time.monotonic() - kept[1] <= settings.MERIDIAN_CATALOGUE_CACHE_SECONDS):
            return copy.copy(kept[2])
        row = queryset.get(**{slug_field: slug})
        if epoch is not UNREADABLE and settings.MERIDIAN_CATALOGUE_CACHE_SECONDS > 0:
            with self._lock:
                self._rows[(asked, slug)] = (epoch, time.monotonic(), copy.copy(row))
        return row

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()


CATALOGUE = SlugLookups()


def watch_catalogue() -> None:
    from .models import GPUModel, Offering, Region

    CATALOGUE_EPOCH.watch(Offering, Region, GPUModel)
