"""
The two state moves every part of the lifecycle makes: GPUs from one state to another, and a
reservation through its transition table (compare-and-set, so a racing move loses cleanly).
"""

from __future__ import annotations

import logging

from cloud.choices import NodeState
from cloud.models import GPU
from cloud.transitions import GPU_TRANSITIONS
from core.errors import Conflict
from provisioning.models import Reservation
from provisioning.transitions import reservation_transition

log = logging.getLogger(__name__)
N = NodeState


def gpus_move(gpu_ids, source: str, target: str) -> int:
    assert target in GPU_TRANSITIONS[source], f"GPU {source} -> {target} is not in the table"
    return GPU.objects.filter(pk__in=list(gpu_ids), state=source).update(state=target)


def reservation_move(reservation: Reservation, target: str, *, only_from, reason: str = "", **also) -> bool:
    """The reservation moves if it is still where this lifecycle expects it (a cancel may have won)."""
    try:
        reservation_transition(reservation, target, only_from=only_from, reason=reason, **also)
    except Conflict:
        return False
    return True
