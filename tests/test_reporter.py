"""The in-trial report judges every report and stops the trainer on that very step."""

from __future__ import annotations

import math

import pytest

from sweeps.protocol import REASON_KEY, STATUS_KEY
from sweeps.rules.settings import RuleSettings
from sweeps.trial.reporter import TrialReporter, TrialStopped


def _trainer_nan_at(k, swallow=False):
    def train(config, report):
        for step in range(1, 50):
            loss = math.nan if step >= k else 1.0 / step
            try:
                report({"step": step, "loss": loss, "grad_norm": 1.0, "lr": 1e-3})
            except Exception:  # a trainer that swallows errors must still be stopped
                if not swallow:
                    raise
    return train


@pytest.mark.parametrize("swallow", [False, True])
def test_nan_stops_on_the_step_it_appears(swallow):
    sink = []
    reporter = TrialReporter(RuleSettings(), sink.append)
    with pytest.raises(TrialStopped) as info:
        _trainer_nan_at(7, swallow)({}, reporter)
    assert info.value.verdict.reason == "non_finite"
    assert info.value.verdict.step == 7
    assert [r["step"] for r in sink] == list(range(1, 8)), "no step after the NaN"
    assert sink[-1][STATUS_KEY] == "unstable" and sink[-1][REASON_KEY] == "non_finite"
    assert all(r[STATUS_KEY] == "running" for r in sink[:-1])


def test_step_time_is_measured_when_not_reported():
    ticks = iter([0.0, 1.0, 3.0, 7.0])
    reporter = TrialReporter(RuleSettings(), lambda r: None, clock=lambda: next(ticks))
    reporter({"step": 1, "loss": 1.0})
    reporter({"step": 3, "loss": 1.0})
    reporter({"step": 4, "loss": 1.0, "step_time": 0.5})
    assert [h["step_time"] for h in reporter.history] == [1.0, 1.0, 0.5]


def test_missing_step_is_counted():
    reporter = TrialReporter(RuleSettings(), lambda r: None)
    reporter({"loss": 1.0})
    reporter({"loss": 0.9})
    assert [h["step"] for h in reporter.history] == [1, 2]
