"""
The one way to move a row's state: compare-and-set against a transition table (one conditional
UPDATE; a racing writer makes the move fail with InvalidTransition instead of both winning).
"""

from django.db import models

from core.errors import InvalidTransition


def sources_of(table: dict[str, frozenset[str]], target: str) -> frozenset[str]:
    """Every state from which ``target`` may be reached."""
    return frozenset(source for source, targets in table.items() if target in targets)


def compare_and_set(
    queryset: models.QuerySet, pk, *, table: dict[str, frozenset[str]], target: str, field: str = "state",
    only_from: frozenset[str] | None = None, previous: bool = True, **also
) -> str | None:
    """
    Move row ``pk`` to ``target`` if its current state allows it, in one conditional UPDATE.

    Returns the state it was in (read first; with ``previous=False`` nothing is read unless the
    move fails, and None is returned: one statement). Raises InvalidTransition naming the current
    state when the move is illegal, or when another writer moved the row first (the UPDATE matched
    nothing). ``only_from`` narrows the legal sources further (ending maintenance starts only from it).
    """
    sources = sources_of(table, target)
    if only_from is not None:
        sources &= only_from
    if not previous and queryset.filter(pk=pk, **{f"{field}__in": sorted(sources)}).update(**{field: target}, **also):
        return None
    current = queryset.filter(pk=pk).values_list(field, flat=True).first()
    if current is None:
        raise queryset.model.DoesNotExist
    if previous and current in sources:
        updated = queryset.filter(pk=pk, **{f"{field}__in": [current]}).update(**{field: target}, **also)
        if updated:
            return current
        current = queryset.filter(pk=pk).values_list(field, flat=True).first()
    raise InvalidTransition(model=queryset.model._meta.verbose_name, current=current, target=target)
