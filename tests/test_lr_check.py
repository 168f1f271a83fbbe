"""A sweep whose lr knob never reaches the optimizer stops early and says so (exit 2)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from sweeps.record.book import TrialRecord
from sweeps.trial.lr_check import lr_ignored
from tests.conftest import edit_linreg, run_cli_in


def _rec(i: int, sampled: float, peak: float, role: str = "search") -> TrialRecord:
    rec = TrialRecord(trial_id=str(i), values={"lr": sampled}, seed=0, role=role)
    rec.history = [{"step": 1, "lr": peak / 10}, {"step": 2, "lr": peak}]
    rec.finished = True
    return rec


def test_the_same_reported_lr_across_a_tenfold_span_is_caught():
    same = [_rec(i, lr, 0.1) for i, lr in enumerate((1e-4, 1e-2, 1.0))]
    assert "does not read the lr knob's write_back path" in lr_ignored(same)
    following = [_rec(i, lr, lr * 0.5) for i, lr in enumerate((1e-4, 1e-2, 1.0))]
    assert lr_ignored(following) is None, "a schedule scales every trial alike"
    narrow = [_rec(i, lr, 0.1) for i, lr in enumerate((0.01, 0.02, 0.05))]
    assert lr_ignored(narrow) is None, "too narrow a span to tell"
    assert lr_ignored(same[:2]) is None, "too few trials"
    assert lr_ignored([_rec(i, lr, 0.1, role="confirm:x") for i, lr in
                       enumerate((1e-4, 1e-2, 1.0))]) is None, "search trials only"


@pytest.mark.slow
def test_a_sweep_that_tunes_nothing_stops_and_exits_2(linreg_dir, ray_session):
    edit_linreg(linreg_dir, name="deaf", new_keys=True,
                write_back={"lr": "train.lr_unused"},  # the trainer reads train.lr
                initial_points=[{"lr": lr} for lr in (1e-4, 1e-2, 1.0)],
                budget={"trials": 12, "max_steps": 30, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 0})
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = run_cli_in(linreg_dir, "run", "linreg.yaml", "--quiet", "--no-preflight")
    assert code == 2
    assert "error: write_back.lr:" in err.getvalue()
    assert "every one reported the same optimizer LR (peak 0.1)" in err.getvalue()
    ran = [json.loads(p.read_text().splitlines()[0])["trial"]["role"]
           for p in (linreg_dir / "results" / "deaf" / "trials").glob("*.jsonl")]
    # the base config's trial and the three points; LR probes of the race that started
    # before three search trials had finished
    assert 3 <= ran.count("search") <= 5, "no trial starts once the problem is known"
    assert len(ran) - ran.count("search") <= 2
