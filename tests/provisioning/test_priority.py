"""The pure priority scorer: the base formula, each extra term, the range, both paths, the team record."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioning.scheduling.priority import (
    DEFAULT_WEIGHTS,
    URGENCY_LEVELS,
    HPThresholds,
    QueueEntry,
    ScoreInputs,
    Weights,
    decayed_usage,
    fulfilment_rate,
    hp_eligible,
    rank,
    score,
    urgency_value,
)

HOUR = 3600.0
DAY = 24 * HOUR
NOW = 1_700_000_000.0
BASE_ONLY = Weights(age=0, high_priority=0, fair_share=0)
FACTOR_NAMES = ("urgency", "fulfilment", "load", "age", "high_priority", "fair_share")


def inputs(**overrides) -> ScoreInputs:
    values = {"urgency": 0.5, "fulfilment_rate": 0.9, "current_load": 0.5, "waited_s": 0.0,
              "high_priority": False, "usage_share": 0.0}
    values.update(overrides)
    return ScoreInputs(**values)


def total(weights: Weights = DEFAULT_WEIGHTS, **overrides) -> float:
    return score(inputs(**overrides), weights).total


#
# The base formula
#


def test_base_formula_best_case_is_one_with_extras_at_zero():
    best = inputs(urgency=1, fulfilment_rate=1, current_load=0)
    assert score(best, DEFAULT_WEIGHTS).total == pytest.approx(1.0)
    assert score(best, BASE_ONLY).total == pytest.approx(1.0)


def test_base_formula_with_known_numbers():
    got = score(inputs(urgency=0.5, fulfilment_rate=0.8, current_load=0.25), DEFAULT_WEIGHTS)
    assert got.total == pytest.approx(0.4 * 0.5 + 0.3 * 0.8 + 0.3 * 0.75)
    assert got.total == pytest.approx(0.665)


def test_weights_come_from_the_caller():
    weights = Weights.from_mapping({"urgency": 1, "fulfilment": 0, "load": 0, "age": 0, "high_priority": 0,
                                    "fair_share": 0})
    assert total(weights, urgency=0.7, fulfilment_rate=0.1, current_load=0.9) == pytest.approx(0.7)


def test_default_weights():
    w = DEFAULT_WEIGHTS
    assert (w.urgency, w.fulfilment, w.load) == (0.4, 0.3, 0.3)
    assert (w.age, w.age_horizon_s, w.high_priority, w.fair_share) == (0.1, DAY, 0.15, 0.15)
    assert (w.usage_half_life_s, w.neutral_fulfilment) == (7 * DAY, 0.8)
    assert w.max_total == pytest.approx(1.25)


#
# Each extra term moves the score the right way
#


def test_waiting_raises_the_score_up_to_the_horizon_and_no_further():
    waits = [0, HOUR, 6 * HOUR, 12 * HOUR, DAY - 1]
    scores = [total(waited_s=w) for w in waits]
    assert scores == sorted(scores) and len(set(scores)) == len(scores)
    at_horizon = total(waited_s=DAY)
    assert at_horizon == pytest.approx(total(waited_s=0) + DEFAULT_WEIGHTS.age)
    assert total(waited_s=2 * DAY) == at_horizon == total(waited_s=365 * DAY)


def test_approved_high_priority_raises_the_score():
    assert total(high_priority=True) == pytest.approx(total(high_priority=False) + DEFAULT_WEIGHTS.high_priority)


def test_more_recent_usage_lowers_the_score():
    shares = [0, 0.5, 1, 2, 10]
    scores = [total(usage_share=s) for s in shares]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)
    assert total(usage_share=0) == total(DEFAULT_WEIGHTS)  # no usage: no penalty at all
    # Exactly the fair share costs half the fair-share weight (Slurm's 2 ** -(U/S) = 0.5).
    assert total(usage_share=1) == pytest.approx(total(usage_share=0) - DEFAULT_WEIGHTS.fair_share / 2)


def test_load_over_one_is_clamped():
    assert total(current_load=1.0) == total(current_load=1.5) == total(current_load=40)
    assert total(current_load=0.2) > total(current_load=0.6) > total(current_load=1.0)
    assert score(inputs(current_load=3), DEFAULT_WEIGHTS).factor("load").value == 0.0


def test_higher_urgency_and_fulfilment_raise_the_score():
    assert total(urgency=0.8) > total(urgency=0.5)
    assert total(fulfilment_rate=0.99) > total(fulfilment_rate=0.5)


def test_a_team_with_no_history_gets_the_neutral_fulfilment():
    got = score(inputs(fulfilment_rate=None), DEFAULT_WEIGHTS)
    assert got.factor("fulfilment").value == 0.8
    assert got.total == score(inputs(fulfilment_rate=0.8), DEFAULT_WEIGHTS).total
    custom = Weights(neutral_fulfilment=0.5)
    assert score(inputs(fulfilment_rate=None), custom).factor("fulfilment").value == 0.5


#
# Range and breakdown
#

unit = st.floats(0, 1)
non_negative = st.floats(0, 1e9)
weight = st.floats(0, 10)
any_inputs = st.builds(ScoreInputs, urgency=unit, fulfilment_rate=st.none() | unit, current_load=non_negative,
                       waited_s=non_negative, high_priority=st.booleans(), usage_share=non_negative)
any_weights = st.builds(Weights, urgency=weight, fulfilment=weight, load=weight, age=weight, high_priority=weight,
                        fair_share=weight, age_horizon_s=st.floats(1, 1e7), usage_half_life_s=st.floats(1, 1e8),
                        neutral_fulfilment=unit)


@given(any_inputs, any_weights)
def test_scores_stay_in_the_documented_range(inp, weights):
    got = score(inp, weights)
    assert 0.0 <= got.total <= weights.max_total
    assert got.maximum == weights.max_total
    for factor in got.factors:
        assert 0.0 <= factor.value <= 1.0


@given(any_inputs)
def test_default_scores_stay_in_range(inp):
    assert 0.0 <= score(inp, DEFAULT_WEIGHTS).total <= 1.25


@given(any_inputs, any_weights)
def test_contributions_add_up_to_the_total_and_name_every_factor(inp, weights):
    got = score(inp, weights)
    assert tuple(f.name for f in got.factors) == FACTOR_NAMES
    for factor in got.factors:
        assert factor.contribution == factor.weight * factor.value
    assert got.raw == pytest.approx(sum(f.contribution for f in got.factors))
    assert got.total == min(max(got.raw, 0.0), got.maximum)
    assert got.factor("fair_share").contribution <= 0.0
    assert got.factor("fair_share").weight == -weights.fair_share


def test_breakdown_is_json_ready():
    import json

    got = score(inputs(urgency=1, usage_share=1, high_priority=True, waited_s=HOUR), DEFAULT_WEIGHTS)
    data = json.loads(json.dumps(got.as_dict()))
    assert data["total"] == got.total and data["range"] == [0.0, 1.25]
    assert [f["name"] for f in data["factors"]] == list(FACTOR_NAMES)
    assert set(data["factors"][0]) == {"name", "value", "weight", "contribution"}
    assert sum(f["contribution"] for f in data["factors"]) == pytest.approx(data["raw"])


def test_total_is_clamped_at_zero():
    weights = Weights(urgency=0, fulfilment=0, load=0, age=0, high_priority=0, fair_share=1)
    got = score(inputs(usage_share=5), weights)
    assert got.raw < 0 and got.total == 0.0


#
# The fast path
#

entry_values = st.tuples(
    st.floats(NOW - 10 * DAY, NOW + HOUR),  # a little in the future: clock skew counts as no wait
    unit, st.none() | unit, st.floats(0, 5), st.booleans(), st.floats(0, 50),
)


@settings(max_examples=50)
@given(st.lists(entry_values, max_size=40), any_weights)
def test_rank_agrees_with_score_exactly(values, weights):
    entries = [QueueEntry(i, *v) for i, v in enumerate(values)]
    ranked = rank(entries, weights, NOW)
    assert sorted(i for i, _ in ranked) == list(range(len(entries)))
    expected = {e.id: score(e.inputs(NOW), weights).total for e in entries}
    for ident, value in ranked:
        assert value == expected[ident]
    keys = [(-value, entries[ident].submitted_at, ident) for ident, value in ranked]
    assert keys == sorted(keys)


def test_rank_orders_by_score_then_submission_then_id():
    same = (0.5, 0.9, 0.5, False, 0.0)
    entries = [
        QueueEntry("c", NOW - 100, *same),
        QueueEntry("b", NOW - 200, *same),
        QueueEntry("a", NOW - 100, *same),
        QueueEntry("urgent", NOW - 10, 1.0, 0.9, 0.5, False, 0.0),
        QueueEntry("heavy", NOW - 500, 0.5, 0.9, 0.5, False, 3.0),
    ]
    weights = Weights(age=0)  # without the age term the three "same" entries tie exactly
    assert [i for i, _ in rank(entries, weights, NOW)] == ["urgent", "b", "a", "c", "heavy"]


def test_rank_takes_plain_tuples_and_an_empty_queue():
    assert rank([], DEFAULT_WEIGHTS, NOW) == []
    ranked = rank([(1, NOW - 60, 0.2, None, 0.0, False, 0.0, 0.0), (2, NOW, 0.8, 1.0, 0.0, True, 0.0, 0.0)],
                  DEFAULT_WEIGHTS, NOW)
    assert [i for i, _ in ranked] == [2, 1]


def test_a_staff_adjustment_moves_a_reservation_past_its_clamp_both_ways():
    weights = DEFAULT_WEIGHTS
    top = (1.0, 1.0, 0.0, True, 0.0)  # at the top of the factors' range
    bottom = (0.0, 0.0, 1.0, False, 50.0)  # clamped at 0
    entries = [QueueEntry("top", NOW - 10, *top), QueueEntry("top-raised", NOW, *top, 0.25),
               QueueEntry("bottom", NOW - 10, *bottom), QueueEntry("bottom-cut", NOW - 20, *bottom, -0.5)]
    ranked = rank(entries, weights, NOW)
    assert [i for i, _ in ranked] == ["top-raised", "top", "bottom", "bottom-cut"]
    for entry, (_, total) in zip(sorted(entries, key=lambda e: [i for i, _ in ranked].index(e.id)), ranked,
                                 strict=True):
        breakdown = score(entry.inputs(NOW), weights)
        assert breakdown.total == total  # bit for bit, as without an adjustment
        assert breakdown.as_dict()["adjustment"] == entry.adjustment
    assert ranked[0][1] > weights.max_total  # past the factors' range
    assert ranked[-1][1] == -0.5


@pytest.mark.parametrize("adjustment", [-1.01, 1.5, float("nan"), "high"])
def test_an_adjustment_outside_minus_one_to_one_is_refused(adjustment):
    with pytest.raises(ValueError, match="adjustment"):
        ScoreInputs(urgency=0.5, fulfilment_rate=None, current_load=0.0, waited_s=0.0, adjustment=adjustment)


def test_rank_a_large_queue_matches_score():
    rng = random.Random(7)
    entries = [QueueEntry(i, NOW - rng.uniform(0, 3 * DAY), rng.choice(list(URGENCY_LEVELS.values())),
                          None if rng.random() < 0.1 else rng.random(), rng.uniform(0, 1.5), rng.random() < 0.1,
                          rng.expovariate(1.0)) for i in range(2000)]
    ranked = rank(entries, DEFAULT_WEIGHTS, NOW)
    assert all(value == score(entries[i].inputs(NOW), DEFAULT_WEIGHTS).total for i, value in ranked)
    assert [v for _, v in ranked] == sorted((v for _, v in ranked), reverse=True)


#
# Bad input
#


@pytest.mark.parametrize(("field", "value", "message"), [
    ("urgency", 1.5, "urgency must be between 0 and 1"),
    ("urgency", -0.1, "urgency must be between 0 and 1"),
    ("urgency", "high", "urgency must be a number"),
    ("fulfilment_rate", 1.01, "fulfilment_rate must be between 0 and 1"),
    ("current_load", -1, "current_load must be >= 0"),
    ("waited_s", -5, "waited_s must be >= 0"),
    ("usage_share", -0.5, "usage_share must be >= 0"),
    ("usage_share", math.nan, "usage_share must be a finite number"),
    ("current_load", math.inf, "current_load must be a finite number"),
    ("high_priority", 1, "high_priority must be True or False"),
    ("urgency", True, "urgency must be a number"),
])
def test_bad_inputs_raise_with_a_message(field, value, message):
    with pytest.raises(ValueError, match=message):
        inputs(**{field: value})


@pytest.mark.parametrize(("values", "message"), [
    ({"urgency": -0.4}, "weight 'urgency' must be >= 0"),
    ({"fair_share": -1}, "weight 'fair_share' must be >= 0"),
    ({"age": "0.1"}, "weight 'age' must be a number"),
    ({"age_horizon_s": 0}, "age_horizon_s must be > 0"),
    ({"usage_half_life_s": -1}, "usage_half_life_s must be > 0"),
    ({"neutral_fulfilment": 1.2}, "neutral_fulfilment must be between 0 and 1"),
    ({"urgnecy": 0.4}, "unknown priority weight key.*'urgnecy'"),
])
def test_bad_weights_raise_with_a_message(values, message):
    with pytest.raises(ValueError, match=message):
        Weights.from_mapping(values)


def test_weights_from_mapping_keeps_defaults_for_missing_keys():
    assert Weights.from_mapping({}) == DEFAULT_WEIGHTS == Weights.from_mapping(None)
    assert Weights.from_mapping({"age": 0}).age == 0.0
    assert Weights.from_mapping({"age": 0}).urgency == 0.4


#
# Urgency levels
#


def test_urgency_levels_and_numbers():
    assert urgency_value("low") < urgency_value("normal") < urgency_value("high") < urgency_value("critical") == 1.0
    assert urgency_value(" High ") == URGENCY_LEVELS["high"]
    assert urgency_value(0.3) == 0.3 and urgency_value(1) == 1.0
    with pytest.raises(ValueError, match="unknown urgency level 'asap'"):
        urgency_value("asap")
    with pytest.raises(ValueError, match="between 0 and 1"):
        urgency_value(2)


#
# Team record
#


def test_decayed_usage_halves_after_one_half_life():
    half_life = 7 * DAY
    assert decayed_usage([(100.0, 0.0)], half_life) == 100.0
    assert decayed_usage([(100.0, half_life)], half_life) == pytest.approx(50.0)
    assert decayed_usage([(100.0, 2 * half_life)], half_life) == pytest.approx(25.0)
    assert decayed_usage([(10.0, 0.0), (8.0, half_life)], half_life) == pytest.approx(14.0)
    assert decayed_usage([], half_life) == 0.0


def test_decayed_usage_rejects_bad_input():
    with pytest.raises(ValueError, match="half_life_s must be > 0"):
        decayed_usage([(1.0, 0.0)], 0)
    with pytest.raises(ValueError, match="gpu_hours must be >= 0"):
        decayed_usage([(-1.0, 0.0)], DAY)
    with pytest.raises(ValueError, match="age_s must be >= 0"):
        decayed_usage([(1.0, -10.0)], DAY)


def test_fulfilment_rate():
    assert fulfilment_rate(19, 20, neutral=0.8) == 0.95
    assert fulfilment_rate(0, 0, neutral=0.8) == 0.8
    assert fulfilment_rate(0, 4, neutral=0.8) == 0.0
    with pytest.raises(ValueError, match=r"used_as_booked \(5\) cannot exceed total \(4\)"):
        fulfilment_rate(5, 4, neutral=0.8)
    with pytest.raises(ValueError, match="total must be a non-negative integer"):
        fulfilment_rate(0, -1, neutral=0.8)


def test_hp_eligible_when_every_threshold_holds():
    verdict = hp_eligible(0.96, 120.0, 2)
    assert verdict.eligible and verdict.reasons == ()
    assert verdict.as_dict() == {"eligible": True, "reasons": []}


def test_hp_eligible_gives_one_reason_per_failed_threshold():
    assert len(hp_eligible(0.95, 120.0, 0).reasons) == 1  # > 95 %, so exactly 95 % fails
    assert "fulfilment rate 95.0% is not above 95.0%" in hp_eligible(0.95, 0, 0).reasons[0]
    assert hp_eligible(0.99, 300.0, 0).reasons == ("average release delay 5.0 min is not under 5.0 min",)
    assert hp_eligible(0.99, 0.0, 3).reasons == ("3 unplanned changes this month exceed the limit of 2",)
    verdict = hp_eligible(0.5, 900.0, 7)
    assert not verdict.eligible and len(verdict.reasons) == 3
    no_history = hp_eligible(None, 0.0, 0)
    assert not no_history.eligible and len(no_history.reasons) == 1 and "no reservations" in no_history.reasons[0]


def test_hp_thresholds_are_configurable():
    lenient = HPThresholds.from_mapping({"min_fulfilment": 0.5, "max_avg_release_delay_s": 3600,
                                         "max_unplanned_changes": 10})
    assert hp_eligible(0.6, 600.0, 5, lenient).eligible
    with pytest.raises(ValueError, match="max_unplanned_changes must be a non-negative integer"):
        HPThresholds(max_unplanned_changes=-1)
    with pytest.raises(ValueError, match="unknown high-priority threshold key"):
        HPThresholds.from_mapping({"min_fulfillment": 0.9})
    with pytest.raises(ValueError, match="unplanned_changes_month must be a non-negative integer"):
        hp_eligible(0.99, 0.0, -1)
