"""
GPU slots: slot ``k`` of a GPU cut into ``n`` covers memory ``[k * memory // n, (k + 1) * memory // n)``
(plan_types); a GPU's layouts are the cuts its slots belong to, time-sliced ones with their class.
"""

from __future__ import annotations

# A slot layout: ``n`` for memory-capped slots, ``(n, class)`` for time-sliced slots of a class.
Layout = int | tuple[int, str]
NO_LAYOUTS: frozenset[Layout] = frozenset()


def layout_key(n: int, share_class: str = "") -> Layout:
    return (n, share_class) if share_class else n


def layout_slots(key: Layout) -> int:
    return key[0] if isinstance(key, tuple) else key


def slot_range(memory: int, n: int, k: int) -> tuple[int, int]:
    """Slot ``k`` of a GPU cut into ``n`` slots, as plan_types defines it."""
    return k * memory // n, (k + 1) * memory // n


def slot_layout(memory: int, lo: int, hi: int) -> int:
    """The ``n`` for which ``[lo, hi)`` is exactly one of ``n`` slots of the GPU, else 0."""
    width = hi - lo
    if width <= 0 or width >= memory:
        return 0
    n = round(memory / width)
    k = -(-lo * n // memory)  # the only k whose slot can start at lo
    return n if n > 1 and slot_range(memory, n, k) == (lo, hi) else 0
