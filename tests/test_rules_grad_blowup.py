"""grad_blowup (and the frequent_clipping warning)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sweeps.rules import evaluate
from sweeps.rules.grad_blowup import check, check_clipping
from sweeps.rules.settings import RuleSettings

S = RuleSettings()


def norms(values: list[float]) -> list[dict]:
    return [{"step": t, "grad_norm": v} for t, v in enumerate(values)]


@pytest.mark.parametrize(("last", "fires"), [(50.0, False), (50.0001, True)])
def test_ratio_boundary(last, fires):
    verdict = check(norms([1.0] * 10 + [last]), S)
    assert (verdict is not None) is fires
    if fires:
        assert verdict.step == 10
        assert verdict.evidence["running_median"] == 1.0
        assert verdict.evidence["threshold"] == 50.0
        assert verdict.evidence["ratio"] == pytest.approx(50.0001)


def test_the_median_ignores_a_few_earlier_outliers():
    history = norms([1.0] * 8 + [40.0, 45.0] + [60.0])
    assert check(history, S).evidence["running_median"] == 1.0


@pytest.mark.parametrize(("last", "fires"), [(1e4, False), (1.0001e4, True)])
def test_absolute_cap_fires_without_history(last, fires):
    verdict = check(norms([last]), S)
    assert (verdict is not None) is fires
    if fires:
        assert verdict.evidence == {"grad_norm": last, "cap": 1e4}
    assert check(norms([last]), RuleSettings(grad_norm_cap=None)) is None


def test_needs_blowup_min_history_earlier_finite_norms():
    assert check(norms([1.0] * 4 + [1000.0]), S) is None
    assert check(norms([1.0] * 4 + [math.nan, 1000.0]), S) is None  # NaN does not count
    assert check(norms([1.0] * 5 + [1000.0]), S) is not None
    assert check(norms([1.0] * 2 + [1000.0]), RuleSettings(blowup_min_history=2)) is not None


def test_zero_median_is_not_judged():
    # grad_norm logged after zero_grad: always 0.0, then a real value -- no ratio exists
    assert check(norms([0.0] * 20 + [5.0]), S) is None


def test_missing_or_non_finite_newest_norm_is_not_judged():
    assert check([], S) is None
    assert check([{"step": 0, "loss": 1.0}], S) is None
    assert check(norms([1.0] * 10) + [{"step": 10, "loss": 1.0}], S) is None
    assert check(norms([1.0] * 10 + [math.inf]), S) is None  # non_finite's job


def test_only_the_window_feeds_the_median():
    history = norms([100.0] * 300 + [1.0] * 90 + [60.0])
    assert check(history, S) is None  # median over the last 199 earlier norms is 100
    assert check(history, RuleSettings(window=100)) is not None


def test_fires_on_the_first_report_where_a_blowup_is_detectable():
    rng = np.random.default_rng(7)
    values = list(rng.lognormal(0.0, 0.5, 300)) + [1e2 * 3.0**k for k in range(12)]
    first = next(
        i
        for i, v in enumerate(values)
        if v > 1e4 or (i >= 5 and v > 50 * float(np.median(values[max(0, i - 199) : i])))
    )
    # unclipped with the loss unmoved: judged on the next report, which spikes again
    expected = first if values[first] > 1e4 else first + 1
    history: list[dict] = []
    for t, v in enumerate(values):
        history.append({"step": t, "loss": 1.0, "grad_norm": float(v)})
        verdict = evaluate(history)
        if verdict:
            break
    assert verdict.reason == "grad_blowup"
    assert verdict.step == expected


@given(
    st.lists(st.floats(1e-3, 1e3), min_size=1, max_size=250),
    st.floats(1e-3, 1e5),
    st.sampled_from([2.0, 50.0]),
)
@settings(max_examples=300, deadline=None)
def test_matches_a_plain_median_reference(earlier, last, ratio):
    history = norms([*earlier, last])
    s = RuleSettings(blowup_ratio=ratio)
    window = earlier[-199:]
    expected = last > 1e4 or (len(window) >= 5 and last > ratio * float(np.median(window)))
    assert (check(history, s) is not None) is expected


def clips(flags: list[float]) -> list[dict]:
    return [{"step": t, "clipped": f} for t, f in enumerate(flags)]


def test_clipping_warns_once_when_more_than_half_are_clipped():
    flags = [1.0, 0.0] * 10 + [1.0]  # 11 of 21 clipped
    assert check_clipping(clips(flags[:20]), S) is None  # exactly half
    warning = check_clipping(clips(flags), S)
    assert warning["warning"] == "frequent_clipping" and warning["step"] == 20
    assert warning["evidence"]["clipped_fraction"] == pytest.approx(11 / 21)
    assert check_clipping(clips(flags + [1.0]), S) is None  # still holds: no repeat


def test_clipping_needs_min_reports_and_the_key():
    assert check_clipping(clips([1.0] * 19), S) is None
    assert check_clipping(clips([1.0] * 20), S) is not None
    assert check_clipping(clips([1.0] * 30) + [{"step": 30, "loss": 1.0}], S) is None
    assert check_clipping([], S) is None


def test_clipping_onset_is_found_as_old_reports_leave_the_window():
    history = clips([0.0] * 100 + [1.0] * 150)
    assert check_clipping(history[:200], S) is None  # 100 of 200: exactly half
    assert check_clipping(history[:201], S)["step"] == 200  # 101 of the last 200
    assert check_clipping(history[:202], S) is None


def _leaving_a_plateau(jump: float, ratio: float = 0.01) -> list[dict]:
    """Grad norm 0.6 on the first 10 reports, 0.15 while the outputs sit collapsed
    (ratio ``ratio``) to step 109, then ``jump`` as the outputs spread again."""
    history = [{"step": t, "grad_norm": 0.6 if t < 10 else 0.15, "pred_std": ratio,
                "target_std": 1.0} for t in range(110)]
    return history + [{"step": 110, "grad_norm": jump, "pred_std": 0.4, "target_std": 1.0}]


def test_leaving_a_collapsed_plateau_is_not_a_blowup():
    """A raw-input direction MLP on a plateau (grad norm 0.16) took its gradient to 8.9 on
    leaving it (55 x the running median, 14 x its start of 0.64) and trained to val_loss
    0.34: the jump is judged against the run's starting grad norm."""
    s = RuleSettings()
    assert check(_leaving_a_plateau(9.0), s) is None  # 60 x the median, 15 x the start
    assert check(_leaving_a_plateau(40.0), s).reason == "grad_blowup"  # 67 x the start
    assert check(_leaving_a_plateau(9.0), RuleSettings(disabled=["collapse"])) is not None


def test_a_jump_after_outputs_that_were_never_collapsed_is_judged_as_before():
    assert check(_leaving_a_plateau(9.0, ratio=0.5), RuleSettings()).reason == "grad_blowup"


def _clipped_run(spike_loss: float | None, *, clipped: float | None = 1.0) -> list[dict]:
    """A vMF transformer clipped at 1 (lr 0.053): grad norms 0.8-3 before clipping, the
    loss 0.78-0.98, then one report whose grad norm is 56 (the numbers of a real run)."""
    history = [{"step": t, "grad_norm": (0.8, 1.0, 3.0)[t % 3],
                "loss": (0.78, 0.86, 0.98)[t % 3], "clipped": 1.0} for t in range(40)]
    spike: dict = {"step": 40, "grad_norm": 56.0}
    if spike_loss is not None:
        spike["loss"] = spike_loss
    if clipped is not None:
        spike["clipped"] = clipped
    return [*history, spike]


def test_a_clipped_spike_the_loss_did_not_follow_is_not_a_blowup():
    """Clipping bounded the step; the report's loss (0.98) is within the loss's own range:
    a sharp batch. The run trained on (to val_loss 0.83 at 300 steps)."""
    assert check(_clipped_run(0.98), S) is None
    assert evaluate(_clipped_run(0.98), S) is None


def test_a_clipped_spike_the_loss_jumped_with_is_a_blowup():
    """A regression MLP at lr 0.31, clipped: grad norm 31.7 from 0.13, loss 6.2 from 0.94."""
    for loss in (2.2, 6.2):  # loss / running median just over 2, and the real run's 6.6
        verdict = check(_clipped_run(loss), S)
        assert verdict is not None and verdict.reason == "grad_blowup"
        assert verdict.step == 40 and verdict.evidence["ratio"] > 50


def test_a_spike_without_a_loss_on_its_report_is_judged_at_once():
    assert check(_clipped_run(None), S) is not None
    assert check(_clipped_run(None, clipped=0.0), S) is not None


def _next(history: list[dict], loss: float, grad_norm: float = 1.0) -> list[dict]:
    return [*history, {"step": 41, "grad_norm": grad_norm, "loss": loss, "clipped": 0.0}]


@pytest.mark.parametrize("clipped", [0.0, None])  # not clipped, or the loop did not say
def test_an_unclipped_spike_is_judged_by_the_loss_its_step_led_to(clipped):
    """A BERT classifier under AdamW without clipping: grad norm 32.7 against a running
    median of 0.49 on one step, the loss in its range (0.63) on that report and after; it
    trained on to an accuracy of 0.97. The spike's own report says nothing yet."""
    spike = _clipped_run(0.98, clipped=clipped)
    assert check(spike, S) is None and evaluate(spike, S) is None
    assert check(_next(spike, 0.9), S) is None and evaluate(_next(spike, 0.9), S) is None
    jumped = check(_next(spike, 6.2), S)  # the step threw the loss up: a blowup
    assert jumped.reason == "grad_blowup" and jumped.step == 41
    assert jumped.evidence["spike_step"] == 40 and jumped.evidence["loss_ratio_after"] > 2
    again = check(_next(spike, 0.9, grad_norm=80.0), S)  # the gradient keeps exploding
    assert again.reason == "grad_blowup" and again.step == 41


def test_an_unclipped_spike_whose_loss_jumped_on_its_report_fires_at_once():
    assert check(_clipped_run(6.2, clipped=0.0), S).step == 40


def test_a_contained_spike_still_hits_the_absolute_cap():
    history = _clipped_run(0.98)
    history[-1]["grad_norm"] = 2e4
    assert check(history, S).evidence == {"grad_norm": 2e4, "cap": 1e4}
