"""collapse: pred_std / target_std stays below the ratio for a patience of reports."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sweeps.rules.collapse import check
from sweeps.rules.settings import RuleSettings

S = RuleSettings(collapse_min_step=0)  # the rule's mechanics, from the first report


def stds(ratios, start: int = 0) -> list[dict]:
    return [
        {"step": start + t, "pred_std": r * 2.0, "target_std": 2.0} for t, r in enumerate(ratios)
    ]


def test_fires_on_the_patience_th_collapsed_report():
    history = stds([0.8] * 10 + [0.05] * 25)
    assert check(history[:29], S) is None  # 19 collapsed reports
    verdict = check(history[:30], S)
    assert verdict.step == 29
    assert verdict.evidence["since_step"] == 10 and verdict.evidence["reports"] == 20
    assert verdict.evidence["ratio"] == pytest.approx(0.05)


@pytest.mark.parametrize(("ratio", "fires"), [(0.1, False), (0.0999, True)])
def test_ratio_boundary(ratio, fires):
    assert (check(stds([ratio] * 20), S) is not None) is fires


def test_a_healthy_report_resets_the_count():
    history = stds([0.05] * 15 + [0.5] + [0.05] * 19)
    assert check(history, S) is None
    assert check(history + stds([0.05], start=35), S) is not None


def test_reports_without_the_keys_are_skipped_not_counted():
    history: list[dict] = []
    for t in range(40):
        history.append({"step": 2 * t, "loss": 1.0})
        history.append({"step": 2 * t + 1, "pred_std": 0.01, "target_std": 1.0})
    assert check(history[:39], S) is None  # 19 collapsed reports so far
    assert check(history[:40], S).step == 39
    assert check(history[:41], S) is None  # newest report lacks the keys


def test_collapse_min_step():
    s = RuleSettings(collapse_min_step=100)
    history = stds([0.01] * 130, start=0)
    assert check(history[:119], s) is None  # steps 100..118: 19 reports
    assert check(history[:120], s).step == 119


def test_missing_zero_and_non_finite_stds_are_not_judged():
    assert check([], S) is None
    assert check([{"step": 0, "pred_std": 0.0}], S) is None
    assert check([{"step": t, "target_std": 1.0} for t in range(30)], S) is None
    assert check([{"step": t, "pred_std": 0.0, "target_std": 0.0} for t in range(30)], S) is None
    nan = [{"step": t, "pred_std": math.nan, "target_std": 1.0} for t in range(30)]
    assert check(nan, S) is None


def test_default_does_not_judge_a_fresh_model_before_step_50():
    # a freshly initialised model predicting nearly one value, then learning the spread
    history = [{"step": k, "pred_std": 0.05 if k < 45 else 0.6, "target_std": 1.0}
               for k in range(1, 120)]
    assert all(check(history[:n], RuleSettings()) is None for n in range(1, len(history) + 1))
    collapsed = [{"step": k, "pred_std": 0.01, "target_std": 1.0} for k in range(1, 120)]
    verdict = next(v for n in range(1, 120)
                   if (v := check(collapsed[:n], RuleSettings())) is not None)
    assert verdict.step >= 50


def test_predictions_growing_from_a_near_constant_start_are_slow_not_collapsed():
    # zero-initialised weights at a low LR: the prediction spread grows linearly from 0
    history = [{"step": s, "pred_std": 0.0008 * s, "target_std": 1.0} for s in range(1, 300)]
    assert all(check(history[:k], RuleSettings()) is None for k in range(1, 300))
    # ...while a spread that stays small is collapse, even with a little noise
    rng = np.random.default_rng(0)
    flat = [{"step": s, "pred_std": 0.02 * (1 + 0.2 * rng.standard_normal()),
             "target_std": 1.0} for s in range(1, 120)]
    verdict = next(v for k in range(1, 120) if (v := check(flat[:k], RuleSettings())))
    assert verdict.step == 69 and abs(verdict.evidence["growth"]) < 0.2


def test_a_narrow_spread_whose_loss_falls_below_the_random_guess_is_learning():
    """The quickstart's audit: trials stopped as collapsed at step 69 ended far below the
    random-guess loss. A loss clearly falling, already below the baseline's flat band,
    means the outputs carry information: slow, not collapsed. A loss falling towards the
    baseline (a collapsed model learning the mean) is still judged."""
    settings = RuleSettings(collapse_min_step=0, baseline_loss=1.5708)
    learning = stds([0.05] * 30)
    for t, report in enumerate(learning):
        report["loss"] = 1.2 - 0.02 * t  # 1.2 -> 0.62, well below pi/2
    assert check(learning, settings) is None
    mean_fit = stds([0.05] * 30)
    for t, report in enumerate(mean_fit):
        report["loss"] = 2.5 - 0.03 * t  # falls to 1.63: towards the baseline, not past it
    assert check(mean_fit, settings).reason == "collapse"
    flat = stds([0.05] * 30)
    for report in flat:
        report["loss"] = 0.9
    verdict = check(flat, settings)
    assert verdict.reason == "collapse" and verdict.evidence["loss_falling"] < 0.05


def _plateau(steps: int, *, start_norm: float = 0.3, stretch_norm: float = 0.08,
             ratio_end: float | None = None) -> list[dict]:
    """A run whose outputs sit near-constant from the start: grad norm ``start_norm`` on
    its first 10 reports, then ``stretch_norm``; the ratio flat at 0.008 (or falling
    linearly to ``ratio_end``)."""
    history = []
    for t in range(steps):
        ratio = 0.008 if ratio_end is None else 0.05 + (ratio_end - 0.05) * t / steps
        norm = start_norm if t < 10 else stretch_norm * (1.2 if t % 2 else 0.8)
        history.append({"step": t, "pred_std": ratio, "target_std": 1.0, "grad_norm": norm})
    return history


def test_a_flat_collapse_with_a_live_gradient_is_a_plateau_given_five_times_the_patience():
    """A raw-input direction MLP sat at a ratio of 0.008 with a grad norm ~30 % of its
    start for 80 steps past step 50, then escaped to val_loss 0.34: judged at step 69 it
    was called collapsed. A plateau needs 5 x collapse_patience collapsed reports."""
    s = RuleSettings(collapse_min_step=50)
    history = _plateau(200)
    assert all(check(history[:n], s) is None for n in range(1, 150))
    verdict = check(history[:150], s)
    assert verdict.step == 149 and verdict.evidence["plateau"] is True
    assert verdict.evidence["gradient"] == pytest.approx(0.08 / 0.3, rel=0.05)
    assert verdict.evidence["reports"] == 100


def test_one_output_for_every_input_is_no_plateau_whatever_the_gradient():
    """A Hydra-configured MLP (AdamW, lr 1.66) gave a spread of exactly 0 from step 43 to
    150, its grad norm alive (the output's bias still learning), and ended at the random
    guess: as a plateau it was never judged before ASHA cut it, with no diagnosis."""
    history = _plateau(70, stretch_norm=0.3)
    for report in history[10:]:
        report["pred_std"] = 0.0
    verdict = check(history, RuleSettings(collapse_min_step=50))
    assert verdict.step == 69 and verdict.evidence["plateau"] is False


def test_a_collapse_whose_gradient_died_fires_at_the_patience():
    verdict = check(_plateau(70, stretch_norm=0.01), RuleSettings(collapse_min_step=50))
    assert verdict.step == 69 and verdict.evidence["plateau"] is False
    assert verdict.evidence["gradient"] < 0.15


def test_a_spread_still_shrinking_fires_at_the_patience_whatever_the_gradient():
    """Adam + heavy L2 on the regression trainer: the spread falls from 0.06 to 0.02 over
    the stretch with the gradient alive; the rule need not wait."""
    history = _plateau(70, stretch_norm=0.3, ratio_end=0.005)
    verdict = check(history, RuleSettings(collapse_min_step=50))
    assert verdict.step == 69 and verdict.evidence["plateau"] is False


def test_without_grad_norms_a_flat_collapse_fires_at_the_patience():
    history = [{k: v for k, v in r.items() if k != "grad_norm"} for r in _plateau(70)]
    assert check(history, RuleSettings(collapse_min_step=50)).step == 69


def test_a_plateau_longer_than_the_window_is_still_judged():
    """collapse_patience 50 with window 200: a plateau needs 250 reports, more than the
    window can count; it is judged once the whole window is collapsed."""
    s = RuleSettings(collapse_min_step=50, collapse_patience=50, window=200)
    history = _plateau(400)
    assert check(history[:249], s) is None
    verdict = check(history[:250], s)
    assert verdict is not None and verdict.evidence["plateau"] is True
    assert verdict.evidence["reports"] == 200
