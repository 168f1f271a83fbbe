"""Noise-aware Pareto front and the order candidates are confirmed in."""

from __future__ import annotations

from sweeps.record.book import TrialRecord
from sweeps.results.front import (
    INSTABILITY_NOISE,
    STEP_TIME_FLOOR,
    candidates,
    noise_allowances,
    pareto_front,
    step_time_noise,
)
from sweeps.spec.loader import Objective, Sweep
from tests.unit.conftest import book_of, rec

QUALITY = Objective(metric="val_loss")
UNSTABLE = Objective(metric="instability")
SPEED = Objective(metric="step_time")


def _ids(records: list[TrialRecord]) -> list[str]:
    return [r.trial_id for r in records]


def _timed(trial_id: str, val_loss: float, times: list[float]) -> TrialRecord:
    r = rec(trial_id)
    r.history = [{"step": i, "val_loss": val_loss, "step_time": t} for i, t in enumerate(times)]
    return r


def test_one_objective_front_is_the_best_trial(linreg_sweep: Sweep) -> None:
    records = [rec("a", val_loss=0.3), rec("b", val_loss=0.1), rec("c", val_loss=0.2)]
    book = book_of(linreg_sweep, *records)
    assert _ids(pareto_front(book, records, [QUALITY])) == ["b"]


def test_failed_and_unmeasured_trials_are_left_off(linreg_sweep: Sweep) -> None:
    records = [rec("bad", status="unstable", val_loss=0.01), rec("none"),
               rec("ok", val_loss=0.5)]
    book = book_of(linreg_sweep, *records)
    assert _ids(pareto_front(book, records, [QUALITY])) == ["ok"]


def test_instability_within_its_noise_does_not_shape_the_front(linreg_sweep: Sweep) -> None:
    # b is worse on quality; its instability edge over a is below 0.1, so a dominates it
    a = rec("a", val_loss=0.1)
    a.history = [{"step": i, "val_loss": 0.1, "loss": v}
                 for i, v in enumerate([1.0] * 6 + [4.0])]  # one loss spike: 0.1
    b = rec("b", val_loss=0.2)
    book = book_of(linreg_sweep, a, b)
    objectives = [QUALITY, UNSTABLE]
    assert _ids(pareto_front(book, [a, b], objectives)) == ["a"]
    # with no noise allowance b's 0.1 lower instability puts it on the front too
    exact = [QUALITY, Objective(metric="instability", noise=0.0)]
    assert _ids(pareto_front(book, [a, b], exact)) == ["a", "b"]


def test_max_objective_front_best_first(linreg_sweep: Sweep) -> None:
    records = [rec("lo", acc=0.5, cost=1.0), rec("hi", acc=0.9, cost=3.0),
               rec("dominated", acc=0.4, cost=2.0)]
    objectives = [Objective(metric="acc", mode="max"), Objective(metric="cost")]
    book = book_of(linreg_sweep, *records)
    assert _ids(pareto_front(book, records, objectives)) == ["hi", "lo"]


def test_step_time_noise_measured_from_the_trials() -> None:
    steady = [1.0] * 10
    assert step_time_noise([_timed("a", 0.1, steady)]) == STEP_TIME_FLOOR
    # second half 0.5 .. 2.0: 10th percentile 0.5, 90th 2.0, median 1.2
    noisy = [1.0] * 5 + [2.0, 0.5, 1.5, 0.8, 1.2, 1.0]
    assert step_time_noise([_timed("b", 0.1, noisy)]) == (2.0 - 0.5) / 1.2
    assert step_time_noise([_timed("short", 0.1, [1.0, 2.0])]) == STEP_TIME_FLOOR


def test_noise_allowances_defaults_and_overrides() -> None:
    records = [_timed("a", 0.1, [1.0] * 10)]
    objectives = [QUALITY, UNSTABLE, SPEED, Objective(metric="mem"),
                  Objective(metric="step_time", noise=0.5)]
    assert noise_allowances(records, objectives) == [0.0, INSTABILITY_NOISE, STEP_TIME_FLOOR,
                                                     0.0, 0.5]
    assert noise_allowances(records, [Objective(metric="val_loss", noise=0.2)]) == [0.2]


def test_step_time_within_its_relative_noise_is_a_tie(linreg_sweep: Sweep) -> None:
    fast = _timed("fast", 0.2, [1.0] * 10)
    slower = _timed("slower", 0.1, [1.05] * 10)  # 5 % slower: within the 10 % floor
    much_slower = _timed("much_slower", 0.05, [2.0] * 10)
    records = [fast, slower, much_slower]
    book = book_of(linreg_sweep, *records)
    assert _ids(pareto_front(book, records, [QUALITY, SPEED])) == ["much_slower", "slower"]


def test_compiled_label_that_ran_eagerly_has_no_step_time(linreg_sweep: Sweep) -> None:
    eager = _timed("eager", 0.1, [0.1] * 10)
    eager.values["compile"] = "default"
    eager.compile = {"graphs": 0}
    book = book_of(linreg_sweep, eager)
    assert book.objective_values(eager, [QUALITY, SPEED]) == [0.1, None]
    assert pareto_front(book, [eager], [QUALITY, SPEED]) == []


def test_candidates_front_then_ok_then_pruned(linreg_sweep: Sweep) -> None:
    front = rec("front", val_loss=0.1)
    ok_b, ok_a = rec("ok_b", val_loss=0.4), rec("ok_a", val_loss=0.3)
    cut = rec("cut", status="pruned", val_loss=0.2)
    sick = rec("sick", status="pruned", val_loss=0.05)
    sick.diagnosis = {"reason": "flat_at_baseline", "step": 5}
    broken = rec("broken", status="unstable", val_loss=0.01)
    nan = rec("nan", val_loss=float("nan"))
    records = [ok_b, cut, front, sick, broken, nan, ok_a]
    book = book_of(linreg_sweep, *records)
    assert _ids(candidates(book, records, [front], [QUALITY])) == ["front", "ok_a", "ok_b"]
    assert _ids(candidates(book, records, [front], [QUALITY], pruned=True)) == [
        "front", "ok_a", "ok_b", "cut"]


def test_candidates_max_mode_best_first(linreg_sweep: Sweep) -> None:
    records = [rec("a", acc=0.5), rec("b", acc=0.9)]
    book = book_of(linreg_sweep, *records)
    assert _ids(candidates(book, records, [], [Objective(metric="acc", mode="max")])) == [
        "b", "a"]


def test_a_trial_that_learnt_nothing_is_no_candidate(linreg_sweep: Sweep) -> None:
    # baseline_loss 1.0: the best gained 0.9; 0.97 and a cut at 0.95 gained 3-6 % of that
    best, slow = rec("best", val_loss=0.1), rec("slow", val_loss=0.85)
    chance = rec("chance", val_loss=0.97)
    cut, cut_chance = rec("cut", status="pruned", val_loss=0.5), \
        rec("cut_chance", status="pruned", val_loss=0.95)
    records = [best, slow, chance, cut, cut_chance]
    book = book_of(linreg_sweep, *records)
    assert _ids(candidates(book, records, [best], [QUALITY], pruned=True)) == [
        "best", "slow", "cut"]
    # on the front for its low instability (an LR too small to move the loss), at the guess
    steady = rec("steady", val_loss=1.013)
    book = book_of(linreg_sweep, *records, steady)
    assert _ids(candidates(book, [*records, steady], [best, steady], [QUALITY])) == [
        "best", "slow"]
    # an accuracy with its own random guess (1/3 for 3 classes); none without one
    acc = [rec("a", acc=0.97), rec("b", acc=0.3535), rec("c", status="pruned", acc=0.34),
           rec("d", status="pruned", acc=0.6)]
    book = book_of(linreg_sweep, *acc)
    three = Objective(metric="acc", mode="max", baseline=1 / 3)
    assert _ids(candidates(book, acc, [], [three], pruned=True)) == ["a", "d"]
    no_guess = Objective(metric="acc", mode="max")
    assert _ids(candidates(book, acc, [], [no_guess], pruned=True)) == ["a", "b", "d", "c"]


def test_no_candidate_until_a_trial_leaves_the_random_guess_band(linreg_sweep: Sweep) -> None:
    """baseline_loss 1.0, flat_tolerance 0.1: a trial at the guess (1.0003), the only one
    finished, was raced on a fresh seed; one at 0.92 is still inside the band."""
    alone = rec("alone", val_loss=1.0003)
    book = book_of(linreg_sweep, alone)
    assert candidates(book, [alone], [], [QUALITY]) == []
    inside = rec("inside", val_loss=0.92)
    book = book_of(linreg_sweep, alone, inside)
    assert candidates(book, [alone, inside], [], [QUALITY]) == []
    learnt = rec("learnt", val_loss=0.88)
    book = book_of(linreg_sweep, alone, inside, learnt)
    assert _ids(candidates(book, [alone, inside, learnt], [], [QUALITY])) == ["learnt"]
