"""The autoscaler's pure rule: HPA's proportional step, the band, stabilization, cooldowns, spares, bounds."""

from __future__ import annotations

from inference.autoscaler import Rule, decide, needed_of, spares

RULE = Rule(min_replicas=1, max_replicas=10, target=70, scale_in_below=40, scale_out_stabilization_s=0,
            scale_in_stabilization_s=300, scale_out_cooldown_s=30, scale_in_cooldown_s=120, spare_pct=5,
            spare_above=4)


def run(utilization, current=2, serving=None, now=1000.0, history=(), last_change=None, rule=RULE):
    return decide(rule=rule, current=current, serving=current if serving is None else serving,
                  utilization=utilization, now=now, history=list(history), last_change=last_change)


def test_over_the_target_scales_out_in_proportion():
    verdict = run(140, current=2)
    assert (verdict.action, verdict.replicas) == ("scale_out", 4)  # ceil(2 x 140 / 70)
    assert "over the 70% target" in verdict.reason


def test_just_over_the_target_adds_at_least_one():
    assert run(71, current=3).replicas == 4


def test_inside_the_band_holds_steady():
    verdict = run(55, current=3)
    assert (verdict.action, verdict.replicas) == ("steady", 3)


def test_scale_in_waits_for_its_stabilization_window():
    """The highest recommendation of the last 300 s wins: one busy moment keeps the replicas."""
    busy_then = [[900.0, 4]]
    verdict = run(10, current=4, history=busy_then)
    assert (verdict.action, verdict.replicas) == ("hold", 4)
    later = run(10, current=4, now=1300.0, history=busy_then + [[1000.0, 1]])
    assert (later.action, later.replicas) == ("scale_in", 1)


def test_cooldowns_hold_a_change_right_after_the_last():
    assert run(140, current=2, last_change=990.0).action == "hold"  # 10 s after, scale-out cooldown 30 s
    assert run(140, current=2, last_change=960.0).action == "scale_out"
    quiet = Rule(**{**RULE.__dict__, "scale_in_stabilization_s": 0})
    assert run(10, current=4, last_change=950.0, rule=quiet).action == "hold"  # scale-in cooldown 120 s
    assert run(10, current=4, last_change=800.0, rule=quiet).action == "scale_in"


def test_spares_are_five_percent_and_at_least_one_above_the_mark():
    assert spares(4, RULE) == 0 and spares(5, RULE) == 1 and spares(40, RULE) == 2
    assert needed_of(6, RULE) == 5 and needed_of(4, RULE) == 4
    verdict = run(140, current=4)  # the load needs 8: with one spare, 9
    assert verdict.replicas == 9 and "(1 spare)" in verdict.reason


def test_the_bounds_hold():
    assert run(500, current=8).replicas == 10  # max
    floor = Rule(**{**RULE.__dict__, "min_replicas": 2, "scale_in_stabilization_s": 0, "scale_in_cooldown_s": 0})
    assert run(1, current=3, rule=floor).replicas == 2  # min


def test_no_measurement_keeps_the_minimum():
    verdict = run(None, current=0, serving=0)
    assert verdict.replicas == 1 and "no utilization" in verdict.reason
