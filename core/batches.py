"""
Each id in its own transaction: the periodic sweeps (the lifecycle tick, the heartbeat watchdog)
act on many rows, and one that fails must roll back alone and stop nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from django.db import transaction

log = logging.getLogger(__name__)
FAILED = object()  # the outcome of an item whose act raised (logged, rolled back)


def each_atomic(items: Iterable, act: Callable, *, what: str) -> Iterator[tuple[object, object]]:
    """
    ``act(item)`` for each item in a transaction of its own, yielding ``(item, outcome)``; an act
    that raises is rolled back and logged as ``what`` failing on the item, and yields ``FAILED``.
    """
    for item in items:
        try:
            with transaction.atomic():
                outcome = act(item)
        except Exception:
            log.exception("%s failed on %s", what, item)
            yield item, FAILED
            continue
        yield item, outcome
