"""The searcher that hands Ray Tune a confirmation stage's fixed re-runs."""

from __future__ import annotations

from pathlib import Path

from ray.tune.search import Searcher

from sweeps.protocol import RUN_KEY
from sweeps.tune.experiments import FixedRuns


def test_fixed_runs_are_handed_out_once_in_order_across_a_restore(tmp_path: Path) -> None:
    runs = [{"lr": 0.1, "_seed": s} for s in (1, 2, 3)]
    first = FixedRuns(runs)
    assert first.suggest("a") == {RUN_KEY: runs[0]}
    assert first.suggest("b") == {RUN_KEY: runs[1]}
    first.save(str(tmp_path / "state.pkl"))  # Ray Tune saves it with the experiment
    again = FixedRuns([])  # `sweeps resume`: rebuilt, then restored
    again.restore(str(tmp_path / "state.pkl"))
    assert again.suggest("c") == {RUN_KEY: runs[2]}
    assert again.suggest("d") == Searcher.FINISHED
