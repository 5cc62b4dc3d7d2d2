"""
Legal state moves, one table per model, and the one way to make a move: compare-and-set.

Later issues add states and moves to these tables; they do not invent parallel ones.
"""

from django.db import models

from .choices import GPUState, NodeState
from .errors import InvalidTransition

N = NodeState
NODE_TRANSITIONS: dict[str, frozenset[str]] = {
    N.ENROLLED: frozenset({N.VALIDATING, N.MAINTENANCE}),
    N.VALIDATING: frozenset(
        {N.AVAILABLE, N.IN_SERVICE, N.FAULTY, N.QUARANTINED, N.REFERENCE_UNAVAILABLE, N.MAINTENANCE}
    ),
    N.AVAILABLE: frozenset(
        {N.ALLOCATED, N.IN_SERVICE, N.VALIDATING, N.SUSPECT, N.QUARANTINED, N.REFERENCE_UNAVAILABLE, N.FAULTY,
         N.MAINTENANCE}
    ),
    # Attestation before a hand-over can find firmware nobody registered reference values for.
    N.ALLOCATED: frozenset({N.RELEASING, N.SUSPECT, N.FAULTY, N.QUARANTINED, N.REFERENCE_UNAVAILABLE}),
    N.IN_SERVICE: frozenset({N.AVAILABLE, N.SUSPECT, N.FAULTY, N.QUARANTINED, N.REFERENCE_UNAVAILABLE,
                             N.MAINTENANCE}),
    N.RELEASING: frozenset({N.AVAILABLE, N.FAULTY, N.QUARANTINED, N.REFERENCE_UNAVAILABLE}),
    N.SUSPECT: frozenset({N.AVAILABLE, N.ALLOCATED, N.IN_SERVICE, N.FAULTY, N.MAINTENANCE}),
    N.QUARANTINED: frozenset({N.VALIDATING, N.REPAIR, N.MAINTENANCE}),
    N.REFERENCE_UNAVAILABLE: frozenset({N.VALIDATING, N.QUARANTINED, N.MAINTENANCE}),
    N.FAULTY: frozenset({N.REPAIR, N.MAINTENANCE}),
    N.REPAIR: frozenset({N.VALIDATING}),
    N.MAINTENANCE: frozenset({N.VALIDATING, N.AVAILABLE, N.IN_SERVICE}),
}
# A node held for maintenance (or suspected) goes back to one of these directly only if it came
# from it; from any other state it goes through validation first (services decide, see
# cloud.services.node_maintenance_end).
NODE_RETURNABLE = frozenset({N.AVAILABLE, N.IN_SERVICE})

G = GPUState
GPU_TRANSITIONS: dict[str, frozenset[str]] = {
    G.AVAILABLE: frozenset({G.ALLOCATED, G.QUARANTINED}),
    G.ALLOCATED: frozenset({G.SCRUBBING, G.QUARANTINED}),
    G.SCRUBBING: frozenset({G.AVAILABLE, G.QUARANTINED}),
    G.QUARANTINED: frozenset({G.AVAILABLE}),
}


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
