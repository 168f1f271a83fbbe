"""dead_gradient: a warning once dead_params > 0 has lasted dead_patience reports."""

from __future__ import annotations

from sweeps.rules import warnings
from sweeps.rules.dead_gradient import check
from sweeps.rules.settings import RuleSettings

S = RuleSettings()
ON = RuleSettings(enabled=["non_finite", "dead_gradient"])


def dead(counts, start: int = 0) -> list[dict]:
    return [{"step": start + t, "dead_params": c} for t, c in enumerate(counts)]


def test_warns_once_on_the_patience_th_report():
    history = dead([0] * 10 + [3] * 60)
    assert check(history[:59], S) is None  # 49 dead reports
    warning = check(history[:60], S)
    assert warning == {
        "warning": "dead_gradient",
        "step": 59,
        "evidence": {"dead_params": 3, "reports": 50, "since_step": 10},
    }
    assert check(history[:61], S) is None  # still dead: not repeated


def test_a_new_streak_warns_again():
    history = dead([2] * 50 + [0] + [2] * 50)
    assert check(history[:50], S) is not None
    assert check(history[:100], S) is None
    assert check(history, S)["evidence"]["since_step"] == 51


def test_reports_without_the_key_are_skipped():
    history: list[dict] = []
    for t in range(60):
        history += [{"step": 2 * t, "loss": 1.0}, {"step": 2 * t + 1, "dead_params": 1}]
    assert check(history[:100], S)["step"] == 99
    assert check(history[:101], S) is None
    assert check([{"step": 0, "loss": 1.0}], S) is None
    assert check([], S) is None


def test_off_by_default_on_when_enabled():
    history = dead([1] * 50)
    assert warnings(history) == []
    assert [w["warning"] for w in warnings(history, ON)] == ["dead_gradient"]
    assert warnings(history, RuleSettings(dead_patience=60)) == []
