"""`scenario run all --shuffle --repeat N --seed S`: which runs, in which order."""

from __future__ import annotations

import pytest

from streamlab.experiments.scenarios import MODES, names
from streamlab.experiments.scenarios.runner import plan_runs

NAMES = list(names())
EVERY_PAIR = sorted((name, mode) for name in NAMES for mode in MODES)


def test_unshuffled_is_the_catalogue_order_broken_before_fixed_each_repeat() -> None:
    plan = plan_runs(NAMES, MODES, repeat=2)

    assert plan.seed is None
    expected = tuple((name, mode) for name in NAMES for mode in MODES)
    assert plan.rounds == (expected, expected)


def test_each_shuffled_repeat_runs_every_scenario_in_both_modes_once() -> None:
    plan = plan_runs(NAMES, MODES, repeat=3, shuffle=True, seed=7)

    assert len(plan.rounds) == 3
    for order in plan.rounds:
        assert sorted(order) == EVERY_PAIR


def test_shuffled_repeats_have_orders_of_their_own() -> None:
    plan = plan_runs(NAMES, MODES, repeat=3, shuffle=True, seed=7)

    assert len(set(plan.rounds)) == 3
    assert tuple((name, mode) for name in NAMES for mode in MODES) not in plan.rounds


def test_the_same_seed_replays_the_same_orders_and_another_seed_does_not() -> None:
    first = plan_runs(NAMES, MODES, repeat=3, shuffle=True, seed=1234)

    assert plan_runs(NAMES, MODES, repeat=3, shuffle=True, seed=1234) == first
    assert plan_runs(NAMES, MODES, repeat=3, shuffle=True, seed=1235).rounds != first.rounds


def test_a_shuffle_without_a_seed_draws_one_that_replays_it() -> None:
    drawn = plan_runs(NAMES, MODES, repeat=2, shuffle=True)

    assert drawn.seed is not None
    assert plan_runs(NAMES, MODES, repeat=2, shuffle=True, seed=drawn.seed) == drawn


def test_one_mode_only_shuffles_that_mode() -> None:
    plan = plan_runs(NAMES, ("broken",), shuffle=True, seed=3)

    assert sorted(plan.rounds[0]) == sorted((name, "broken") for name in NAMES)


def test_repeat_must_be_positive() -> None:
    with pytest.raises(ValueError, match="repeat"):
        plan_runs(NAMES, MODES, repeat=0)
