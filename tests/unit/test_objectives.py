"""Objective values from a metric history."""

from __future__ import annotations

import math

import pytest

from sweeps.record import objectives as objs


def _grads(values: list[float]) -> list[dict[str, float]]:
    return [{"step": i, "grad_norm": v} for i, v in enumerate(values)]


def test_series_keeps_finite_numbers_only() -> None:
    history = [{"x": 1}, {"x": float("nan")}, {"x": True}, {"x": "2"}, {}, {"x": 2.5},
               {"x": float("inf")}]
    assert objs.series(history, "x") == [1.0, 2.5]


def test_shrinking_grad_norm_scores_zero() -> None:
    assert objs.instability(_grads([10.0 / (i + 1) for i in range(40)])) == 0.0


def test_grad_norm_peak_scores_log10_of_its_ratio() -> None:
    history = _grads([1.0] * 10 + [100.0] + [1.0] * 5)
    assert objs.instability(history) == pytest.approx(2.0)


def test_each_loss_spike_adds_a_tenth() -> None:
    losses = [1.0] * 10 + [5.0] + [1.0] * 5 + [4.0] + [1.0] * 3
    history = [{"step": i, "loss": v} for i, v in enumerate(losses)]
    assert objs.instability(history) == pytest.approx(0.2)
    below = [{"step": i, "loss": v} for i, v in enumerate([1.0] * 10 + [2.9])]
    assert objs.instability(below) == 0.0


def test_step_time_is_the_median_of_the_second_half() -> None:
    history = [{"step_time": v} for v in [9.0, 5.0, 1.0, 2.0, 3.0, 100.0]]
    assert objs.steady_step_time(history) == 3.0
    assert objs.startup_seconds(history) == 6.0
    assert objs.steady_step_time([{"loss": 1.0}]) is None
    assert objs.startup_seconds([]) is None


def test_startup_is_never_negative() -> None:
    assert objs.startup_seconds([{"step_time": 0.1}, {"step_time": 5.0}]) == 0.0


def test_compile_seconds_is_the_first_report() -> None:
    assert objs.compile_seconds([{"compile_s": 4.0}, {"compile_s": 7.0}]) == 4.0
    assert objs.compile_seconds([{"loss": 1}]) is None


def test_metric_value_by_kind() -> None:
    history = [{"val_loss": 0.5, "step_time": 1.0, "compile_s": 2.0},
               {"val_loss": float("nan")}, {"val_loss": 0.3, "step_time": 1.0}]
    assert objs.metric_value(history, "val_loss") == 0.3
    assert objs.metric_value(history, "step_time") == 1.0
    assert objs.metric_value(history, "compile_s") == 2.0
    assert objs.metric_value(history, "instability") == 0.0
    assert objs.metric_value(history, "accuracy") is None


def test_quality_gap_against_the_improvement_over_baseline() -> None:
    # best 0.1 under a baseline of 1.0: a gap of 0.09 is 10 % of the 0.9 improvement
    assert objs.quality_gap(0.19, 0.1, "min", baseline=1.0) == pytest.approx(0.1)
    # without a baseline the gap is a share of |best|
    assert objs.quality_gap(0.19, 0.1, "min") == pytest.approx(0.9)
    assert objs.quality_gap(0.8, 0.9, "max") == pytest.approx(0.1 / 0.9)
    assert objs.quality_gap(0.5, 0.5, "min") == 0.0
    assert objs.quality_gap(0.1, 0.0, "min") == math.inf
    assert objs.quality_gap(0.05, 0.1, "min", baseline=1.0) < 0


def test_gap_scale_uses_baseline_only_where_best_beats_it() -> None:
    assert objs.gap_scale(0.2, "min", 1.0) == pytest.approx(0.8)
    assert objs.gap_scale(1.5, "min", 1.0) == 1.5
    assert objs.gap_scale(-2.0, "max", 1.0) == 2.0
    # an accuracy of 0.9688 over a random guess of 1/3: 0.6836 is 45 % of the way back
    assert objs.gap_scale(0.9688, "max", 1 / 3) == pytest.approx(0.9688 - 1 / 3)
    assert objs.quality_gap(0.6836, 0.9688, "max", 1 / 3) == pytest.approx(0.449, abs=1e-3)


def test_a_max_objective_takes_no_loss_baseline(tmp_path) -> None:
    from tests.unit.conftest import load_linreg

    accuracy = [{"metric": "val_acc", "mode": "max"}]
    unset = load_linreg(tmp_path / "a", objectives=accuracy)
    assert unset.quality_baseline is None
    assert any(n.startswith("objectives.0: val_acc (max) has no baseline") for n in unset.notes)
    own = [{"metric": "val_acc", "mode": "max", "baseline": 0.1}]
    assert load_linreg(tmp_path / "b", objectives=own).quality_baseline == 0.1
    assert load_linreg(tmp_path / "c").quality_baseline == 1.0  # val_loss: rules' loss


def test_summary_finals_peaks_minima() -> None:
    history = [{"step": 1, "loss": 3.0, "val_loss": 2.0, "grad_norm": 5.0, "lr": 0.1,
                "step_time": 2.0, "flag": True},
               {"step": 2, "loss": 1.0, "val_loss": 2.5, "grad_norm": 1.0, "lr": 0.05,
                "step_time": 1.0}]
    out = objs.summary(history)
    assert out["final_loss"] == 1.0 and out["peak_loss"] == 3.0 and out["min_loss"] == 1.0
    assert out["min_val_loss"] == 2.0 and out["final_val_loss"] == 2.5
    assert out["peak_grad_norm"] == 5.0 and out["peak_lr"] == 0.1
    assert out["step_time"] == 1.0 and out["startup_s"] == 1.0  # second half: [1.0]
    assert "final_step" not in out and "final_flag" not in out
    assert out["instability"] == 0.0 and "compile_s" not in out


def test_a_quality_last_reported_before_the_end_is_said(tmp_path) -> None:
    """``val_loss`` every 25 steps in a 190-step run: the objective judged is step 175's,
    and the run ended ok with no word. An evaluation at the last step says nothing."""
    from sweeps.protocol import FINAL_KEY, STALE_QUALITY, STATUS_KEY
    from sweeps.record.book import TrialBook
    from tests.unit.conftest import load_linreg

    book = TrialBook(load_linreg(tmp_path))
    for name, every in (("sparse", 25), ("at-end", 19)):
        for k in range(1, 191):
            book.record(name, {"step": k, "loss": 1 / k, "config": {"lr": 0.1},
                               **({"val_loss": 1 / k} if k % every == 0 else {})})
        book.record(name, {"step": 190, "loss": 1 / 190, "config": {"lr": 0.1},
                           STATUS_KEY: "ok", FINAL_KEY: 1})
    warned = book.trials["sparse"].warnings
    assert warned == [f"{STALE_QUALITY}: val_loss was last reported at step 175 of 190, so "
                      "that is the value judged; report it at the last step too"]
    assert book.trials["at-end"].warnings == []
