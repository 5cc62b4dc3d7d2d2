"""
The priority score that ranks the reservation queue, and the team-record rules around it.

Pure: no Django, no ORM, no settings. The caller reads the weights from settings (at call
time) and the team's record from the database, and passes plain values in.

The score (DESIGN.md "Priority") is the operator's base formula

    0.4 * urgency + 0.3 * fulfilment_rate + 0.3 * (1 - current_load)

plus three extras, each with its own weight:

- **age**: ``waited_s / age_horizon_s``, capped at 1, so a reservation that waits long enough
  climbs past newer ones and nothing starves (Slurm's PriorityWeightAge / PriorityMaxAge);
- **high_priority**: 1 for a team whose high-priority status is approved, else 0;
- **fair_share**: a penalty ``1 - 2 ** -usage_share``, where ``usage_share`` is the team's
  recent GPU-hours, decayed with a half-life (Slurm's PriorityDecayHalfLife), divided by its
  fair share. It is 0 for no recent usage, 0.5 at exactly the fair share and approaches 1 for
  heavy users: Slurm's classic fair-share factor ``2 ** -(U/S)``, turned into a penalty so
  that a team with no recent usage scores exactly the base formula.

Every factor value is in [0, 1] and every weight is >= 0. A factor's contribution is
``weight * value``; the fair-share factor carries its weight negated, so its contribution is
<= 0 and ``contribution == weight * value`` holds for every factor.

**Range.** ``total`` is the sum of the contributions, clamped to
``[0, Weights.max_total]`` where ``max_total`` is the sum of the bonus weights (urgency,
fulfilment, load, age, high_priority): 1.25 with the defaults, 1.0 for the base formula alone.
The clamp only ever bites at 0 (the bonuses cannot exceed their weights); it keeps a shown
score non-negative, and entries clamped to 0 fall back to first-come, first-served.

**Staff adjustment.** An operator may raise or lower one reservation by an ``adjustment`` in
[-1, 1] (with a note, audited). It is added *after* the clamp, so a raise always moves the
reservation up and a cut always moves it down, whatever its factors; with no adjustment (0) the
score is exactly the formula above.

Two paths compute the same numbers, bit for bit: ``score`` builds a ``ScoreBreakdown`` (every
factor, its weight and its contribution, like Slurm's ``sprio``) to show why a reservation
waits; ``rank`` scores and orders the whole queue from plain tuples, fast enough to rank
10,000 entries in a few milliseconds (bench/ranking.py).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

__all__ = [
    "DEFAULT_HP_THRESHOLDS",
    "DEFAULT_WEIGHTS",
    "FACTOR_LABELS",
    "URGENCY_LEVELS",
    "Factor",
    "HPThresholds",
    "HPVerdict",
    "QueueEntry",
    "ScoreBreakdown",
    "ScoreInputs",
    "Weights",
    "decayed_usage",
    "fulfilment_rate",
    "hp_eligible",
    "rank",
    "score",
    "urgency_value",
]

# What each factor is, in a person's words (the console's score table; the names are the API's).
FACTOR_LABELS = {
    "urgency": "Urgency asked",
    "fulfilment": "Team's fulfilment rate (30 days)",
    "load": "Team's unused share (1 − current load)",
    "age": "Time waited in the queue",
    "high_priority": "High-priority team",
    "fair_share": "Fair share (recent usage lowers it)",
}

#
# Validation helpers
#


def _number(name: str, value: Any) -> float:
    """``value`` as a finite float; bools and NaN/infinity are refused (they are always a bug)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


def _non_negative(name: str, value: Any) -> float:
    value = _number(name, value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def _positive(name: str, value: Any) -> float:
    value = _number(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def _unit(name: str, value: Any) -> float:
    value = _number(name, value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be between 0 and 1, got {value!r}")
    return value


def _from_mapping(cls: type, values: Mapping[str, Any] | None, what: str) -> Any:
    """Build a frozen dataclass from a settings dict: unknown keys are typos, so they are refused."""
    values = dict(values or {})
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {what} key(s) {', '.join(map(repr, unknown))}; "
                         f"known keys: {', '.join(sorted(known))}")
    return cls(**values)


#
# Weights
#


@dataclass(frozen=True)
class Weights:
    """
    The weights of the priority score and the two time constants it uses.

    The first three are the operator's base formula. The extras default to values that let
    them reorder but never dominate it:

    - ``age`` 0.1, reached after ``age_horizon_s`` (24 h) of waiting: a day-old request at
      normal urgency overtakes a fresh one a notch more urgent, but not a critical one;
    - ``high_priority`` 0.15: an approved team is worth a bit more than one urgency level
      (0.3 apart x 0.4 = 0.12);
    - ``fair_share`` 0.15: a team at exactly its fair share loses 0.075, a heavy user up to 0.15;
    - ``usage_half_life_s`` 7 days, Slurm's default PriorityDecayHalfLife;
    - ``neutral_fulfilment`` 0.8: a team with no history starts below a reliable team
      (> 0.95) and above an unreliable one.

    All weights must be >= 0 (the fair-share weight is the size of a penalty); the time
    constants must be > 0; ``neutral_fulfilment`` is in [0, 1]. Raises ValueError otherwise.
    """

    urgency: float = 0.4
    fulfilment: float = 0.3
    load: float = 0.3
    age: float = 0.1
    high_priority: float = 0.15
    fair_share: float = 0.15
    age_horizon_s: float = 24 * 3600.0
    usage_half_life_s: float = 7 * 24 * 3600.0
    neutral_fulfilment: float = 0.8

    def __post_init__(self) -> None:
        # object.__setattr__: the dataclass is frozen, and ints from settings are stored as floats.
        for name in ("urgency", "fulfilment", "load", "age", "high_priority", "fair_share"):
            object.__setattr__(self, name, _non_negative(f"weight {name!r}", getattr(self, name)))
        for name in ("age_horizon_s", "usage_half_life_s"):
            object.__setattr__(self, name, _positive(name, getattr(self, name)))
        object.__setattr__(self, "neutral_fulfilment", _unit("neutral_fulfilment", self.neutral_fulfilment))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> Weights:
        """
        Weights from a plain dict such as a Django setting; missing keys keep their defaults.
        Raises ValueError for an unknown key, a negative weight or a non-number.
        """
        return _from_mapping(cls, values, "priority weight")

    @property
    def max_total(self) -> float:
        """The highest score these weights allow: the sum of the bonus weights."""
        return self.urgency + self.fulfilment + self.load + self.age + self.high_priority


DEFAULT_WEIGHTS = Weights()

#
# Urgency
#

# Named levels a tenant may give instead of a number. Evenly spaced below "critical" so one
# level up is worth the same everywhere; "critical" is the top of the scale.
URGENCY_LEVELS: dict[str, float] = {"low": 0.2, "normal": 0.5, "high": 0.8, "critical": 1.0}


def urgency_value(level_or_number: str | float) -> float:
    """
    The urgency in [0, 1] for a named level (case-insensitive, see URGENCY_LEVELS) or a number.
    Raises ValueError for an unknown level or a number outside [0, 1].
    """
    if isinstance(level_or_number, str):
        level = level_or_number.strip().lower()
        if level not in URGENCY_LEVELS:
            raise ValueError(f"unknown urgency level {level_or_number!r}; "
                             f"use a number in [0, 1] or one of {', '.join(URGENCY_LEVELS)}")
        return URGENCY_LEVELS[level]
    return _unit("urgency", level_or_number)


#
# Score
#


@dataclass(frozen=True)
class ScoreInputs:
    """
    What one reservation's score depends on, validated.

    - ``urgency``: in [0, 1] (see ``urgency_value``);
    - ``fulfilment_rate``: the team's share of reservations used as booked over 30 days, in
      [0, 1], or None for a team with no history (scored as ``Weights.neutral_fulfilment``);
    - ``current_load``: GPUs the team uses / its quota for that GPU model, >= 0; above 1 (a
      team over its quota, e.g. after a quota cut) counts as 1;
    - ``waited_s``: seconds since submission, >= 0;
    - ``high_priority``: whether the team's high-priority status is approved;
    - ``usage_share``: the team's decayed recent usage / its fair share, >= 0 (0: none,
      1: exactly its share);
    - ``adjustment``: staff's raise (> 0) or cut (< 0) of this reservation, in [-1, 1].

    Raises ValueError naming the field and the value when one is out of range.
    """

    urgency: float
    fulfilment_rate: float | None
    current_load: float
    waited_s: float
    high_priority: bool = False
    usage_share: float = 0.0
    adjustment: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "urgency", _unit("urgency", self.urgency))
        if self.fulfilment_rate is not None:
            object.__setattr__(self, "fulfilment_rate", _unit("fulfilment_rate", self.fulfilment_rate))
        object.__setattr__(self, "current_load", _non_negative("current_load", self.current_load))
        object.__setattr__(self, "waited_s", _non_negative("waited_s", self.waited_s))
        if not isinstance(self.high_priority, bool):
            raise ValueError(f"high_priority must be True or False, got {self.high_priority!r}")
        object.__setattr__(self, "usage_share", _non_negative("usage_share", self.usage_share))
        adjustment = _number("adjustment", self.adjustment)
        if not -1.0 <= adjustment <= 1.0:
            raise ValueError(f"adjustment must be in [-1, 1], got {self.adjustment!r}")
        object.__setattr__(self, "adjustment", adjustment)


@dataclass(frozen=True)
class Factor:
    """
    One term of the score: its normalised ``value`` in [0, 1], its ``weight`` and
    ``contribution == weight * value``. A penalty (fair_share) carries its weight negated, so
    its contribution is <= 0.
    """

    name: str
    value: float
    weight: float
    contribution: float

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "weight": self.weight, "contribution": self.contribution}


@dataclass(frozen=True)
class ScoreBreakdown:
    """
    A score with every factor behind it, in a fixed order (urgency, fulfilment, load, age,
    high_priority, fair_share). ``total`` is ``raw`` (the sum of the contributions) clamped to
    ``[0, maximum]``, plus staff's ``adjustment``; ``maximum`` is ``Weights.max_total`` of the
    weights used.
    """

    total: float
    factors: tuple[Factor, ...]
    maximum: float
    adjustment: float = 0.0

    @property
    def raw(self) -> float:
        """The sum of the contributions before clamping."""
        raw = 0.0
        for factor in self.factors:
            raw += factor.contribution
        return raw

    def factor(self, name: str) -> Factor:
        """The factor called ``name``; KeyError when there is none."""
        for factor in self.factors:
            if factor.name == name:
                return factor
        raise KeyError(name)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the total, the factors' range, each factor with its weight and contribution, the adjustment."""
        return {
            "total": self.total,
            "raw": self.raw,
            "range": [0.0, self.maximum],
            "factors": [factor.as_dict() for factor in self.factors],
            "adjustment": self.adjustment,
        }


def _clamp(raw: float, maximum: float) -> float:
    return 0.0 if raw < 0.0 else (maximum if raw > maximum else raw)


def score(inputs: ScoreInputs, weights: Weights) -> ScoreBreakdown:
    """
    The score of one reservation with every factor shown. Pure; never raises for valid
    ScoreInputs and Weights. ``rank`` gives the same totals for the same inputs.
    """
    # The arithmetic below is mirrored operation for operation in rank(), so both paths give
    # bit-identical floats: change one, change the other (tests compare them exactly).
    fulfilment = weights.neutral_fulfilment if inputs.fulfilment_rate is None else inputs.fulfilment_rate
    headroom = 1.0 - (inputs.current_load if inputs.current_load < 1.0 else 1.0)
    horizon = weights.age_horizon_s
    age = inputs.waited_s * (1.0 / horizon) if inputs.waited_s < horizon else 1.0
    high_priority = 1.0 if inputs.high_priority else 0.0
    penalty = 1.0 - 0.5 ** inputs.usage_share

    factors = (
        Factor("urgency", inputs.urgency, weights.urgency, weights.urgency * inputs.urgency),
        Factor("fulfilment", fulfilment, weights.fulfilment, weights.fulfilment * fulfilment),
        Factor("load", headroom, weights.load, weights.load * headroom),
        Factor("age", age, weights.age, weights.age * age),
        Factor("high_priority", high_priority, weights.high_priority, weights.high_priority * high_priority),
        Factor("fair_share", penalty, -weights.fair_share, -weights.fair_share * penalty),
    )
    raw = (factors[0].contribution + factors[1].contribution + factors[2].contribution
           + factors[3].contribution + factors[4].contribution + factors[5].contribution)
    maximum = weights.max_total
    return ScoreBreakdown(total=_clamp(raw, maximum) + inputs.adjustment, factors=factors, maximum=maximum,
                          adjustment=inputs.adjustment)


#
# Ranking the queue
#


class QueueEntry(NamedTuple):
    """
    One queued reservation as plain values for ``rank``. ``submitted_at`` is in seconds on the
    same clock as ``rank``'s ``now`` (e.g. a Unix timestamp); the rest as in ScoreInputs. A
    plain tuple of all eight fields in this order works as well. ``id`` only has to be comparable with the
    other ids (it breaks the last ties).
    """

    id: Hashable
    submitted_at: float
    urgency: float
    fulfilment_rate: float | None
    current_load: float
    high_priority: bool
    usage_share: float
    adjustment: float = 0.0

    def inputs(self, now: float) -> ScoreInputs:
        """The validated ScoreInputs of this entry at ``now`` (a submission in the future waited 0 s)."""
        return ScoreInputs(urgency=self.urgency, fulfilment_rate=self.fulfilment_rate,
                           current_load=self.current_load, waited_s=max(0.0, now - self.submitted_at),
                           high_priority=self.high_priority, usage_share=self.usage_share,
                           adjustment=self.adjustment)


def rank(entries: Iterable[Sequence[Any]], weights: Weights, now: float) -> list[tuple[Hashable, float]]:
    """
    Score every queue entry and order them: highest score first, ties by earlier submission,
    then by id. Returns ``[(id, total), ...]``; each total equals ``score(entry.inputs(now),
    weights).total`` exactly.

    The fast path: entries are not validated here (the shell validates when it builds them, or
    through ``QueueEntry.inputs``); a submission time after ``now`` counts as no wait.
    """
    wu, wf, wl, wa, wh = weights.urgency, weights.fulfilment, weights.load, weights.age, weights.high_priority
    nfs = -weights.fair_share
    neutral = weights.neutral_fulfilment
    horizon = weights.age_horizon_s
    inv_horizon = 1.0 / horizon
    maximum = weights.max_total
    # One comprehension with the arithmetic inline: a function call per entry would cost more
    # than the arithmetic itself. The key (-total, submitted_at, id) sorts best first; CPython
    # compares such tuples by their first float unless two scores tie.
    keys = [
        (
            -((0.0 if (raw := wu * u
                      + wf * (neutral if f is None else f)
                      + wl * (1.0 - (load if load < 1.0 else 1.0))
                      + wa * (0.0 if (waited := now - sub) <= 0.0
                              else (waited * inv_horizon if waited < horizon else 1.0))
                      + wh * (1.0 if hp else 0.0)
                      + nfs * (1.0 - 0.5 ** share)) < 0.0
              else (maximum if raw > maximum else raw)) + adjustment),
            sub,
            ident,
        )
        for ident, sub, u, f, load, hp, share, adjustment in entries
    ]
    keys.sort()
    return [(ident, -neg) for neg, _, ident in keys]


#
# Team record
#


def decayed_usage(samples: Iterable[tuple[float, float]], half_life_s: float) -> float:
    """
    Recent usage with exponential decay: the sum of ``gpu_hours * 0.5 ** (age_s / half_life_s)``
    over ``(gpu_hours, age_s)`` samples, so usage one half-life old counts half (Slurm's
    PriorityDecayHalfLife). Raises ValueError for a half-life <= 0 or a negative sample.
    """
    half_life_s = _positive("half_life_s", half_life_s)
    total = 0.0
    for gpu_hours, age_s in samples:
        gpu_hours = _non_negative("gpu_hours", gpu_hours)
        age_s = _non_negative("sample age_s", age_s)
        total += gpu_hours * 0.5 ** (age_s / half_life_s)
    return total


def fulfilment_rate(used_as_booked: int, total: int, neutral: float) -> float:
    """
    The share of a team's reservations (over the caller's window, 30 days) used as booked;
    ``neutral`` for a team with none, so a new team is neither rewarded nor punished.
    Raises ValueError for negative counts or more used than booked.
    """
    for name, value in (("used_as_booked", used_as_booked), ("total", total)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if used_as_booked > total:
        raise ValueError(f"used_as_booked ({used_as_booked}) cannot exceed total ({total})")
    neutral = _unit("neutral", neutral)
    return neutral if total == 0 else used_as_booked / total


@dataclass(frozen=True)
class HPThresholds:
    """
    What a team's record must show to hold high-priority status (DESIGN.md): fulfilment over
    30 days strictly above ``min_fulfilment``, average release delay strictly below
    ``max_avg_release_delay_s``, at most ``max_unplanned_changes`` unplanned changes a month.
    Raises ValueError for values out of range.
    """

    min_fulfilment: float = 0.95
    max_avg_release_delay_s: float = 300.0
    max_unplanned_changes: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "min_fulfilment", _unit("min_fulfilment", self.min_fulfilment))
        object.__setattr__(self, "max_avg_release_delay_s",
                           _non_negative("max_avg_release_delay_s", self.max_avg_release_delay_s))
        changes = self.max_unplanned_changes
        if isinstance(changes, bool) or not isinstance(changes, int) or changes < 0:
            raise ValueError(f"max_unplanned_changes must be a non-negative integer, got {changes!r}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> HPThresholds:
        """Thresholds from a plain dict such as a Django setting; missing keys keep their defaults."""
        return _from_mapping(cls, values, "high-priority threshold")


DEFAULT_HP_THRESHOLDS = HPThresholds()


@dataclass(frozen=True)
class HPVerdict:
    """Whether a team may hold high-priority status, and one reason per threshold it misses."""

    eligible: bool
    reasons: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"eligible": self.eligible, "reasons": list(self.reasons)}


def hp_eligible(
    fulfilment_rate: float | None,
    avg_release_delay_s: float,
    unplanned_changes_month: int,
    thresholds: HPThresholds = DEFAULT_HP_THRESHOLDS,
) -> HPVerdict:
    """
    Check a team's record against the high-priority thresholds. ``fulfilment_rate`` is None
    for a team with no reservations in the window: it has no record to qualify on (the neutral
    value used for scoring is not evidence). Raises ValueError for out-of-range figures.
    """
    delay = _non_negative("avg_release_delay_s", avg_release_delay_s)
    changes = unplanned_changes_month
    if isinstance(changes, bool) or not isinstance(changes, int) or changes < 0:
        raise ValueError(f"unplanned_changes_month must be a non-negative integer, got {changes!r}")
    reasons = []
    if fulfilment_rate is None:
        reasons.append("no reservations in the last 30 days, so no fulfilment rate to qualify on")
    elif _unit("fulfilment_rate", fulfilment_rate) <= thresholds.min_fulfilment:
        reasons.append(f"fulfilment rate {fulfilment_rate:.1%} is not above {thresholds.min_fulfilment:.1%}")
    if delay >= thresholds.max_avg_release_delay_s:
        reasons.append(f"average release delay {delay / 60:.1f} min is not under "
                       f"{thresholds.max_avg_release_delay_s / 60:.1f} min")
    if changes > thresholds.max_unplanned_changes:
        reasons.append(f"{changes} unplanned changes this month exceed the limit of {thresholds.max_unplanned_changes}")
    return HPVerdict(eligible=not reasons, reasons=tuple(reasons))
