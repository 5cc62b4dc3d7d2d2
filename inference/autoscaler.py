"""
The autoscaler's rule, pure (no Django): Kubernetes HPA's algorithm and behavior field, plus spares.

desired = ceil(current x utilization / target), moved only when the utilization leaves the band
[scale_in_below, target]; each direction has a stabilization window (the most conservative
recommendation inside it wins: the lowest for scale-out, the highest for scale-in) and a cooldown
after the last change; spares on top (``spare_pct`` of the replicas, at least one above
``spare_above``); the result inside [min, max].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rule:
    min_replicas: int
    max_replicas: int
    target: int  # percent
    scale_in_below: int
    scale_out_stabilization_s: int = 0
    scale_in_stabilization_s: int = 300
    scale_out_cooldown_s: int = 30
    scale_in_cooldown_s: int = 120
    spare_pct: int = 5
    spare_above: int = 4


@dataclass(frozen=True)
class Verdict:
    replicas: int  # the replicas wanted now (spares included)
    recommendation: int  # what the utilization alone asks for (spares excluded), kept for the windows
    action: str  # "scale_out", "scale_in", "hold" (a change held back) or "steady"
    reason: str
    history: list = field(default_factory=list)


def spares(needed: int, rule: Rule) -> int:
    if needed <= rule.spare_above:
        return 0
    return max(1, math.ceil(needed * rule.spare_pct / 100))


def needed_of(current: int, rule: Rule) -> int:
    """The replicas the load needs inside ``current`` (its spares taken off)."""
    for needed in range(current, 0, -1):
        if needed + spares(needed, rule) <= current:
            return needed
    return 0


def decide(*, rule: Rule, current: int, serving: int, utilization: float | None, now: float,
           history: list, last_change: float | None) -> Verdict:
    """
    ``current``: replicas wanted until now (spares included); ``serving``: those serving, whose
    ``utilization`` (percent, None: no sample yet) is measured; ``history``: [[time, recommendation]]
    kept for the windows; ``last_change``: when the replica count last changed (seconds).
    """
    base = needed_of(current, rule)
    if utilization is None or serving == 0:
        recommendation = max(base, rule.min_replicas)
        why = "no utilization measured yet"
    elif utilization > rule.target:
        recommendation = max(base + 1, math.ceil(serving * utilization / rule.target))
        why = f"utilization {utilization:.0f}% over the {rule.target}% target"
    elif utilization < rule.scale_in_below:
        recommendation = min(base - 1, math.ceil(serving * utilization / rule.target))
        why = f"utilization {utilization:.0f}% under the {rule.scale_in_below}% mark"
    else:
        recommendation = base
        why = f"utilization {utilization:.0f}% inside {rule.scale_in_below}-{rule.target}%"
    recommendation = max(rule.min_replicas, min(rule.max_replicas, max(1, recommendation)))
    horizon = max(rule.scale_in_stabilization_s, rule.scale_out_stabilization_s)
    history = [[t, r] for t, r in history if now - t <= horizon] + [[now, recommendation]]
    if recommendation > base:  # the lowest recommendation inside the scale-out window
        chosen = min(r for t, r in history if now - t <= rule.scale_out_stabilization_s)
        chosen = max(chosen, base)
    elif recommendation < base:  # the highest inside the scale-in window
        chosen = max(r for t, r in history if now - t <= rule.scale_in_stabilization_s)
        chosen = min(chosen, base)
    else:
        chosen = base
    wanted = min(rule.max_replicas, max(rule.min_replicas, chosen + spares(chosen, rule)))
    if wanted == current:
        held = recommendation != base
        return Verdict(current, recommendation, "hold" if held else "steady",
                       f"{why}; held by the stabilization window" if held else why, history)
    cooldown = rule.scale_out_cooldown_s if wanted > current else rule.scale_in_cooldown_s
    if last_change is not None and now - last_change < cooldown:
        return Verdict(current, recommendation, "hold",
                       f"{why}; cooling down ({now - last_change:.0f} of {cooldown} s since the last change)", history)
    action = "scale_out" if wanted > current else "scale_in"
    extra = spares(chosen, rule)
    return Verdict(wanted, recommendation, action,
                   f"{why}: {current} -> {wanted} replicas" + (f" ({extra} spare)" if extra else ""), history)
