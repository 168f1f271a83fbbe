"""non_finite: fires on the very report that carries the first NaN/inf."""

from __future__ import annotations

import math

import pytest

from sweeps.rules import evaluate
from sweeps.rules.non_finite import SCALER_HINT, check
from sweeps.rules.settings import RuleSettings

NAN, INF = math.nan, math.inf
S = RuleSettings()


def healthy(n: int) -> list[dict]:
    return [{"step": t, "loss": 2.0 - t / 100, "grad_norm": 1.0} for t in range(n)]


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [("loss", NAN, "nan"), ("grad_norm", INF, "inf"), ("val_loss", -INF, "-inf")],
)
def test_fires_on_a_non_finite_metric(key, value, shown):
    history = healthy(5) + [{"step": 5, "loss": 1.9, "grad_norm": 1.0, key: value}]
    verdict = check(history, S)
    assert verdict is not None and verdict.reason == "non_finite" and verdict.step == 5
    hint = {"hint": SCALER_HINT} if key == "grad_norm" else {}  # the loss is finite
    assert verdict.evidence == {"metric": key, "value": shown, **hint}


def test_fires_on_nonfinite_grad_elements_even_with_a_finite_norm():
    history = healthy(3) + [{"step": 3, "loss": 1.0, "grad_norm": 2.0, "nonfinite_grads": 3}]
    assert check(history, S).evidence == {"metric": "nonfinite_grads", "value": 3,
                                          "hint": SCALER_HINT}
    history[-1]["nonfinite_grads"] = 0
    assert check(history, S) is None


def test_a_non_finite_gradient_beside_a_nan_loss_gets_no_scaler_hint():
    """Only a finite loss beside a non-finite gradient looks like a GradScaler's skip."""
    history = healthy(3) + [{"step": 3, "loss": NAN, "grad_norm": INF}]
    assert "hint" not in check(history, S).evidence
    history[-1] = {"step": 3, "grad_norm": INF}  # no loss reported: nothing to tell by
    assert "hint" not in check(history, S).evidence


def test_allow_nonfinite_grads_still_fails_a_nan_loss():
    s = RuleSettings(allow_nonfinite_grads=True)
    report = {"step": 0, "loss": 1.0, "grad_norm": INF, "nonfinite_grads": 12}
    assert check([report], s) is None
    assert check([{**report, "loss": NAN}], s).evidence["metric"] == "loss"


def test_stops_zero_steps_after_the_first_nan():
    run = healthy(37) + [{"step": 37, "loss": NAN, "grad_norm": NAN}]
    run += [{"step": t, "loss": NAN} for t in range(38, 50)]
    history: list[dict] = []
    for report in run:
        history.append(report)
        verdict = evaluate(history)
        if verdict:
            break
    assert verdict.reason == "non_finite" and verdict.step == 37


def test_only_the_newest_report_is_judged_and_missing_keys_are_not():
    assert check([], S) is None
    assert check([{"step": 0, "loss": NAN}, {"step": 1, "loss": 1.0}], S) is None
    assert check([{"step": 0}], S) is None
    assert check([{"step": 0, "other": NAN}], S) is None
    assert check([{"step": 0, "loss": None, "grad_norm": "n/a"}], S) is None
