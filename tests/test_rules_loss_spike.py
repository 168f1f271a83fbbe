"""loss_spike: one report's loss far above the running median of the recent losses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sweeps.rules import evaluate
from sweeps.rules.loss_spike import check
from sweeps.rules.settings import RuleSettings

S = RuleSettings()


def losses(values, key: str = "loss") -> list[dict]:
    return [{"step": t, key: float(v)} for t, v in enumerate(values)]


@pytest.mark.parametrize(("last", "fires"), [(10.0, False), (10.001, True)])
def test_ratio_boundary(last, fires):
    verdict = check(losses([1.0] * 10 + [last]), S)
    assert (verdict is not None) is fires
    if fires:
        assert verdict.step == 10
        assert verdict.evidence["running_median"] == 1.0
        assert verdict.evidence["ratio"] == pytest.approx(10.001)


def test_one_spike_ends_the_trial_on_its_own_report():
    rng = np.random.default_rng(5)
    values = list(1.0 + 0.1 * rng.standard_normal(100)) + [30.0, 1.0, 1.0]
    history: list[dict] = []
    for report in losses(values):
        history.append(report)
        verdict = evaluate(history)
        if verdict:
            break
    assert verdict.reason == "loss_spike" and verdict.step == 100


def test_the_median_is_over_the_last_spike_window_losses():
    values = [100.0] * 50 + [1.0] * 20 + [11.0]
    assert check(losses(values), S) is not None
    assert check(losses(values), RuleSettings(spike_window=60)) is None  # median is 100


def test_needs_spike_min_history_and_a_scale():
    assert check(losses([1.0] * 4 + [50.0]), S) is None
    assert check(losses([1.0] * 5 + [50.0]), S) is not None
    assert check(losses([0.0] * 10 + [50.0]), S) is None  # no scale to measure a jump in


def test_a_negative_log_likelihood_is_judged_by_its_own_scale():
    # a vMF loss after it crossed zero: noisy around 0, one report at 0.82
    noisy = [0.19, -0.07, -0.09, -0.07, -0.1, 0.18, 0.12, -0.03, -0.32, 0.17, -0.09, 0.89,
             -0.28, 0.31, -0.36, 0.02, 0.64, 0.37, 0.82]
    history = losses(noisy)
    assert all(check(history[:k], S) is None for k in range(1, len(history) + 1))
    spike = check(losses(noisy + [40.0]), S)
    assert spike is not None and spike.evidence["scale"] == pytest.approx(1.25)
    assert check(losses([-1.0] * 10 + [50.0]), S).evidence["ratio"] == pytest.approx(52.0)
    assert check(losses([-1.0] * 10 + [7.0]), S) is None  # 8 scales up: below 10


def test_a_steady_decrease_and_ordinary_noise_do_not_fire():
    rng = np.random.default_rng(0)
    t = np.arange(2000)
    values = 1.5 * np.exp(-t / 150) + 0.05 + 0.05 * np.abs(rng.standard_normal(t.size))
    history = losses(values)
    assert all(check(history[:k], S) is None for k in range(1, len(history) + 1))


def test_uses_val_loss_only_when_no_loss_is_reported():
    assert check(losses([1.0] * 10 + [20.0], key="val_loss"), S).evidence["metric"] == "val_loss"
    mixed = losses([1.0] * 10) + [{"step": 10, "val_loss": 20.0}]
    assert check(mixed, S) is None


def test_missing_and_non_finite_values_are_not_judged():
    assert check([], S) is None
    assert check([{"step": 0}], S) is None
    assert check(losses([1.0] * 10 + [math.inf]), S) is None
    assert check(losses([1.0] * 10) + [{"step": 10, "grad_norm": 1.0}], S) is None
    assert check(losses([math.nan] * 10 + [1.0] * 5 + [20.0]), S) is not None
