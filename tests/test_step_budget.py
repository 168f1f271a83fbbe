"""``budget.total_steps``: the search runs until a number of training steps is spent.

Trials the rules stop early cost only the steps they ran, so a step budget buys
more trials than ``total_steps / max_steps`` when part of the space is unstable.
"""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from tests.conftest import copy_sweepfiles, edit_linreg, run_cli_in

pytestmark = pytest.mark.slow

MAX_STEPS, TOTAL, CONCURRENT = 60, 300, 2
UNSTABLE_LRS = [20.0, 8.0, 5.0]


def test_step_budget_turns_early_stops_into_more_trials(tmp_path, ray_session):
    folder = copy_sweepfiles(tmp_path)
    edit_linreg(folder, initial_points=[{"lr": lr} for lr in UNSTABLE_LRS],
                confirm={"seeds": 0, "lr_probe": 0})  # nothing kept back for confirmation
    path = folder / "linreg.yaml"
    data = yaml.safe_load(path.read_text())
    # no `trials`: the step budget alone ends the search
    data["budget"] = {"max_steps": MAX_STEPS, "total_steps": TOTAL, "concurrent": CONCURRENT,
                      "scheduler": "none"}
    path.write_text(yaml.safe_dump(data))
    assert run_cli_in(folder, "run", "linreg.yaml", "--quiet") == 0
    trials = pd.read_csv(folder / "results" / "linreg" / "trials.csv")
    search = trials[trials["role"] == "search"]
    spent = int(search["steps"].sum())
    assert spent >= TOTAL, "the search stops only once the budget is spent"
    assert spent < TOTAL + CONCURRENT * MAX_STEPS, "running trials finish, no new one starts"
    unstable = search[search["status"] == "unstable"]
    assert len(unstable) >= len(UNSTABLE_LRS)
    assert (unstable["steps"] < MAX_STEPS).all()
    assert len(search) > TOTAL // MAX_STEPS, "steps saved on unstable trials bought trials"
    assert len(list((folder / "results" / "linreg" / "stable").glob("rank-*.yaml"))) >= 3
    notes = folder / "results" / "linreg" / "selection_notes.txt"
    assert not notes.exists() or "confirmation stopped" not in notes.read_text()
