"""divergence: a finite loss that climbs well above its reference and keeps climbing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sweeps.rules import evaluate
from sweeps.rules.divergence import check
from sweeps.rules.settings import RuleSettings

S = RuleSettings()


def losses(values) -> list[dict]:
    return [{"step": t, "loss": float(v)} for t, v in enumerate(values)]


def first_firing(history: list[dict], settings: RuleSettings = S):
    for k in range(1, len(history) + 1):
        verdict = check(history[:k], settings)
        if verdict is not None:
            return verdict
    return None


def test_geometric_growth_fires_when_the_smoothed_loss_doubles_its_start():
    values = 1.02 ** np.arange(200)
    verdict = first_firing(losses(values))
    # independent reference: the first report whose mean of the last 20 losses
    # exceeds 2x the mean of the first 20 (the growth is monotone, so "rising" holds)
    start = values[:20].mean()
    expected = next(k for k in range(39, 200) if values[k - 19 : k + 1].mean() > 2 * start)
    assert verdict.step == expected
    assert verdict.evidence["ratio"] > 2.0
    assert check(losses(values[:expected]), S) is None  # one report earlier: not yet


def test_divergence_from_a_healthy_start_is_caught_while_the_loss_is_finite():
    rng = np.random.default_rng(3)
    t = np.arange(1000)
    healthy = 0.3 + 1.2 * np.exp(-t / 50)
    values = np.where(t < 200, healthy, healthy * 1.02 ** (t - 200.0))
    values = values * rng.lognormal(0.0, 0.05, t.size)
    history: list[dict] = []
    for report in losses(values):
        history.append(report)
        verdict = evaluate(history)
        if verdict:
            break
    assert verdict.reason == "divergence"
    assert 200 < verdict.step < 270
    assert math.isfinite(history[-1]["loss"]) and history[-1]["loss"] < 10


@pytest.mark.parametrize("seed", range(5))
def test_no_false_alarm_on_a_noisy_decreasing_curve(seed):
    rng = np.random.default_rng(seed)
    t = np.arange(1500)
    values = 1.5 * np.exp(-t / 150) + 0.05 + 0.05 * np.abs(rng.standard_normal(t.size))
    assert first_firing(losses(values)) is None


@pytest.mark.parametrize("sigma", [0.0, 0.1, 0.5, 1.0])
def test_no_false_alarm_on_a_noisy_plateau(sigma):
    rng = np.random.default_rng(11)
    values = 0.7 * rng.lognormal(0.0, sigma, 1500)
    assert first_firing(losses(values)) is None


def test_a_spike_that_recovers_is_not_divergence():
    values = [1.0] * 60 + [20.0] * 3 + [1.0] * 60
    assert first_firing(losses(values)) is None


def test_a_rise_that_stays_below_the_ratio_is_not_divergence():
    values = [1.0] * 60 + [1.0 + 0.9 * min(k, 30) / 30 for k in range(200)]
    assert first_firing(losses(values)) is None  # ends at 1.9x: rising, but below 2x


def test_baseline_is_a_reference_too():
    values = [1.0] * 100 + [1.0 + 0.01 * k for k in range(300)]
    without = first_firing(losses(values))
    with_baseline = first_firing(losses(values), RuleSettings(baseline_loss=0.6))
    assert with_baseline.evidence["reference_kind"] == "baseline"
    assert with_baseline.step < without.step


def test_a_loss_starting_far_above_the_baseline_and_falling_is_fine():
    values = 5.0 * np.exp(-np.arange(300) / 40) + 0.5
    assert first_firing(losses(values), RuleSettings(baseline_loss=1.0)) is None


def test_missing_loss_nan_and_val_only_reports_are_not_judged():
    rising = list(1.05 ** np.arange(80))
    assert check(losses(rising), S) is not None
    assert check(losses(rising) + [{"step": 80, "val_loss": 1.0}], S) is None
    assert check([{"step": t, "val_loss": v} for t, v in enumerate(rising)], S) is None
    assert check(losses(rising[:5]), S) is None  # too short to judge
    with_nans = losses(rising)
    for report in with_nans[::7]:
        report["loss"] = math.nan
    assert check(with_nans, S) is not None  # NaNs are skipped (non_finite reports them)
    assert check([], S) is None
    assert check([{"step": 0}], S) is None


def test_a_rising_negative_loss_has_no_ratio_and_is_not_judged():
    values = -10.0 + 0.1 * np.arange(90)  # e.g. a negative log-likelihood, rising to -1
    assert first_firing(losses(values)) is None


def test_an_explosion_at_the_start_is_caught_on_the_report_that_confirms_it():
    # a character-level GPT at lr 3 without clipping: ln 97 = 4.575 -> 217.6 at step 2
    values = [4.47, 217.6, 350.0, 504.0, 420.0, 300.0, 200.0, 120.0, 80.0, 40.0]
    for settings in (S, RuleSettings(baseline_loss=4.575)):
        verdict = first_firing(losses(values), settings)
        assert verdict.step == 2 and verdict.evidence["kind"] == "explosion"


def test_a_one_step_jump_at_the_start_that_the_next_loss_takes_back_trains_on():
    # trainers/regression.py, Adam at lr 0.035 with no warmup (seed 1): the first update
    # throws the loss to 46x its start for one step; the run ends at val_loss 0.28
    values = [1.397, 64.11, 3.171, 1.147, 1.103, 0.971, 1.068, 0.94] + \
        [0.9 * math.exp(-t / 80) + 0.25 for t in range(200)]
    for settings in (S, RuleSettings(baseline_loss=1.0)):
        assert first_firing(losses(values), settings) is None
    twice = values[:2] + [40.0] + values[3:]  # still 10x up one report later: exploded
    verdict = first_firing(losses(twice), RuleSettings(baseline_loss=1.0))
    assert verdict.step == 2 and verdict.evidence["kind"] == "explosion"


def test_a_loss_50x_the_baseline_is_stopped_on_the_report_that_shows_it():
    values = [1.0] * 300 + [50.0]
    verdict = check(losses(values), RuleSettings(baseline_loss=1.0))
    assert verdict.step == 300 and verdict.evidence["reference_kind"] == "baseline"


def test_a_loss_that_doubles_within_a_few_reports_is_stopped_then():
    values = [1.0 * 1.3**t for t in range(40)]  # 2x by the 3rd report, then on
    verdict = first_firing(losses(values))
    assert verdict is not None and verdict.step <= 8
    assert verdict.evidence.get("kind") != "explosion"


def test_a_short_early_bump_that_settles_is_not_divergence():
    values = [1.0, 1.4, 1.6, 1.5, 1.2, 1.0, 0.9, 0.8] + [0.7 - 0.001 * t for t in range(200)]
    assert first_firing(losses(values)) is None


def test_a_negative_log_likelihood_that_gives_back_its_fall_diverges():
    # vMF-like: starts at 2.5, falls below zero, then climbs back past its start
    fall = list(2.5 - 3.5 * (1 - np.exp(-np.arange(150) / 30)))
    climb = [fall[-1] + 0.05 * k for k in range(1, 120)]
    verdict = first_firing(losses(fall + climb))
    assert verdict is not None and verdict.evidence["reference_kind"] == "fall_from_start"
    assert verdict.step < 150 + 100, "caught before it is back near its start level"
    assert first_firing(losses(fall + [fall[-1]] * 100)) is None  # settled below zero


def _learnt_then_bumped(peak: float, after: float = 0.25) -> list[float]:
    """An angular loss (random guess pi/2) that fell to ~0.2, climbed to ``peak`` over
    25 reports and went on at ``after`` (0.25: fell back as the LR decayed, as an Adam
    run at lr 0.1 without clipping did; it ended at val_loss 0.157, better than the base
    config's 0.176)."""
    rng = np.random.default_rng(0)
    fall = [0.2 + 0.6 * math.exp(-t / 15) for t in range(105)]
    climb = [0.2 + (peak - 0.2) * k / 25 for k in range(1, 26)]
    back = [after] * 70
    return [v * (1 + 0.1 * rng.standard_normal()) for v in fall + climb + back]


def test_a_bump_that_leaves_the_run_far_better_than_guessing_is_not_divergence():
    values = _learnt_then_bumped(peak=0.62)
    assert first_firing(losses(values)) is not None  # without a baseline: 3x its low
    assert first_firing(losses(values), RuleSettings(baseline_loss=math.pi / 2)) is None


def test_a_climb_that_gives_back_half_the_gain_over_guessing_is_divergence():
    verdict = first_firing(losses(_learnt_then_bumped(peak=1.3, after=1.3)),
                           RuleSettings(baseline_loss=math.pi / 2))
    assert verdict is not None and verdict.evidence["smoothed_loss"] > 0.2 + 0.5 * 1.37
    # exponential growth from the low point still fails, only later than without a baseline
    values = [0.2 + 0.6 * math.exp(-t / 15) for t in range(105)] + \
        [0.2 * 1.03 ** k for k in range(1, 100)]
    plain = first_firing(losses(values))
    guessed = first_firing(losses(values), RuleSettings(baseline_loss=math.pi / 2))
    assert plain is not None and guessed is not None
    assert plain.step < guessed.step <= plain.step + 30  # 137 and 164: loss 0.41, 0.90


def _sgdr(climbs_on: bool) -> list[dict]:
    """CosineAnnealingWarmRestarts with T_0 50 at a high peak LR: the loss learnt to 0.17,
    jumps back to the random guess (1.6) after the restart at step 51, and learns again
    (or, ``climbs_on``, climbs and keeps climbing)."""
    history = []
    for t in range(1, 201):
        lr = 44 * (1 + math.cos(math.pi * ((t - 1) % 50) / 50))
        k = t - 50
        if t <= 50:
            loss = 0.17 + 1.4 * math.exp(-t / 8)
        elif climbs_on:
            loss = 0.17 * 1.06 ** k
        else:
            loss = 0.17 + 1.45 * k / 5 if k <= 5 else 0.15 + 1.45 * math.exp(-(k - 5) / 25)
        history.append({"step": t, "lr": lr, "loss": loss})
    return history


def _first_stop(history: list[dict], settings: RuleSettings) -> int | None:
    return next((h["step"] for i, h in enumerate(history) if check(history[: i + 1], settings)),
                None)


def test_the_bump_after_an_intended_warm_restart_is_not_divergence():
    """With ``allow_lr_restarts`` the climb a restart brings is not judged until a whole
    window lies past the restart; a climb that goes on is still stopped."""
    plain = RuleSettings(baseline_loss=1.571)
    allowed = plain.model_copy(update={"allow_lr_restarts": True})
    assert _first_stop(_sgdr(climbs_on=False), plain) == 65, "without the opt-in: stopped"
    assert _first_stop(_sgdr(climbs_on=False), allowed) is None
    assert _first_stop(_sgdr(climbs_on=True), allowed) == 91


@pytest.mark.parametrize("seed", range(3))
def test_a_loss_summed_over_the_batch_is_judged_from_its_own_start(seed):
    """A cross-entropy summed over a batch of 64 (reduction="sum") starts near 64 x the
    declared guess 1.61: every trial was an "explosion" at step 2. It is judged from its
    own start: a noisy fall is not stopped, and a climb from there still is."""
    rng = np.random.default_rng(seed)
    guess = RuleSettings(baseline_loss=1.61)
    falling = 64 * (0.4 + 1.2 / (1 + np.arange(300) / 30)) * (1 + 0.05 * rng.standard_normal(300))
    assert first_firing(losses(falling), guess) is None
    climbing = 103 * 1.03 ** np.arange(300)
    verdict = first_firing(losses(climbing), guess)
    assert verdict is not None and verdict.evidence["reference_kind"] != "baseline"
