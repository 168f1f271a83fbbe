"""Eager fallbacks are summarised one line per kind, with a count, not one per trial."""

from __future__ import annotations

from pathlib import Path

from sweeps.commands.run import fallback_lines
from tests.unit.conftest import book_of, load_linreg, rec


def test_the_same_fallback_in_many_trials_is_one_line(tmp_path: Path) -> None:
    sweep = load_linreg(tmp_path)
    trials = [rec(f"t{i}", values={"lr": 0.1, "compile": "default"}, loss=1.0)
              for i in range(5)]
    for r in trials:
        r.compile = {"graphs": 0}
    trials[4].compile = {"graphs": 1}  # compiled: no warning
    odd = rec("odd", values={"lr": 0.1, "compile": "max-autotune"}, loss=1.0)
    odd.compile = {"graphs": 0}
    lines = fallback_lines(book_of(sweep, *trials, odd))
    assert lines == [
        "4 trials (t0, t1, t2, …) labelled compile=default but ran eagerly: no graph was "
        "compiled (the model ran eagerly); its step_time is not that mode's speed",
        "trial odd labelled compile=max-autotune but ran eagerly: no graph was compiled "
        "(the model ran eagerly); its step_time is not that mode's speed"]
