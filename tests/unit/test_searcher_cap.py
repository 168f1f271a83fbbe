"""``budget.trials`` counts every search trial the book saw finish, not only the ones the
sampler holds: a resumed sweep whose restored sampler state predates some finished trials
starts no trial past the cap."""

from __future__ import annotations

from pathlib import Path

import optuna
from ray.tune.search import Searcher

from sweeps.record.book import TrialBook
from sweeps.tune.searcher import StabilityAwareSearch
from tests.unit.conftest import load_linreg


def _finished(book: TrialBook, trial_id: str, lr: float) -> None:
    for step in range(1, 11):
        book.record(trial_id, {"step": step, "loss": 1.0 / step, "val_loss": 1.0 / step,
                               "config": {"lr": lr}})
    book.finish(trial_id, {"done": True, "config": {"lr": lr}}, error=False)


def test_search_trials_the_book_saw_finish_count_towards_the_trial_cap(tmp_path: Path) -> None:
    sweep = load_linreg(tmp_path, budget={"trials": 3, "max_steps": 10, "concurrent": 1,
                                          "scheduler": "none"},
                        confirm={"seeds": 0, "lr_probe": 0})
    book = TrialBook(sweep)
    searcher = StabilityAwareSearch(sweep, book, storage=optuna.storages.InMemoryStorage())
    first = searcher.suggest("a")
    assert isinstance(first, dict)  # under the cap: a config to run
    _finished(book, "a", first["lr"])
    # two more finished while the sampler's state was not saved (a driver that died)
    _finished(book, "b", 0.01)
    _finished(book, "c", 0.02)
    assert searcher.suggest("d") == Searcher.FINISHED


def test_more_steps_for_a_sweep_budgeted_in_trials_is_refused(tmp_path: Path) -> None:
    import pytest

    from sweeps.commands.run import with_total_steps
    from sweeps.errors import SpecError

    sweep = load_linreg(tmp_path)  # budget.trials: 12, no step budget
    with pytest.raises(SpecError) as err:
        with_total_steps(sweep, 5000)
    assert err.value.key == "--total-steps"
    assert "budgeted in trials (budget.trials: 12), not steps" in str(err.value)
    assert "--warm-start" in str(err.value)


def test_a_base_config_off_the_range_makes_the_nearest_point_the_first_trial(
        tmp_path: Path) -> None:
    """The base lr of 50 lies above the range's 30: the first search trial is lr 30, the
    point nearest the user's own, not a random draw."""
    sweep = load_linreg(tmp_path, train={"lr": 50.0})
    searcher = StabilityAwareSearch(sweep, TrialBook(sweep),
                                    storage=optuna.storages.InMemoryStorage())
    assert searcher.suggest("a")["lr"] == 30.0


def test_runs_in_flight_count_against_the_step_budget(tmp_path: Path) -> None:
    """Once the leader's fresh seed is in flight it is no longer missing from its ladder
    and has not run yet: the steps it will take still count, so no search trial starts
    in their place past ``budget.total_steps``."""
    from sweeps.protocol import FINAL_KEY, OK, RUN_KEY, STATUS_KEY

    sweep = load_linreg(tmp_path, budget={"total_steps": 30, "max_steps": 10, "concurrent": 2,
                                          "scheduler": "none"},
                        confirm={"seeds": 1, "lr_probe": 0, "base": False})
    book = TrialBook(sweep)
    searcher = StabilityAwareSearch(sweep, book, storage=optuna.storages.InMemoryStorage())
    first = searcher.suggest("a")
    for step in range(1, 11):  # 10 steps, ok: the leader
        book.record("a", {"step": step, "loss": 0.5, "val_loss": 0.5, "config": first})
    book.finish("a", {FINAL_KEY: True, STATUS_KEY: OK, "config": first}, error=False)
    screen = searcher.suggest("r")
    assert RUN_KEY in screen, "the leader's fresh seed"
    book.record("r", {"step": 1, "loss": 0.5, "config": screen})  # it started
    assert RUN_KEY not in searcher.suggest("b"), "a search trial: 10 + 10 + 10 <= 30"
    assert searcher.suggest("c") is None, "10 run and 20 in flight: the budget is spent"
