"""``budget.trials`` counts every search trial the book saw finish, not only the ones the
sampler holds: a resumed sweep whose restored sampler state predates some finished trials
starts no trial past the cap."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
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


@pytest.mark.parametrize("asked_after_save", [False, True])
def test_a_search_trial_that_finished_unheard_is_told_after_a_restart(
        tmp_path: Path, asked_after_save: bool) -> None:
    """A driver killed after a search trial finished (in the book) and before Ray Tune saved
    the searcher again: the restored searcher had not told the study, and the resume
    failed the study's trial as interrupted, so the sampler lost what was the run's best
    search trial. ``catch_up`` tells it, found by the ``ray_trial_id`` set when it was
    asked even when the saved searcher never held it."""
    from sweeps.protocol import FINAL_KEY, OK, STATUS_KEY
    from sweeps.tune import compat
    from sweeps.tune.searcher import fail_interrupted

    sweep = load_linreg(tmp_path, budget={"trials": 4, "max_steps": 10, "concurrent": 1,
                                          "scheduler": "none"},
                        confirm={"seeds": 0, "lr_probe": 0, "base": False})
    sweep.output_dir.mkdir(parents=True)
    from sweeps.tune.searcher import study_storage

    book = TrialBook(sweep)
    searcher = StabilityAwareSearch(sweep, book, storage=study_storage(sweep))
    config = searcher.suggest("a")
    book._listeners.clear()  # the driver dies: the searcher never hears of the finish
    for step in range(1, 11):
        book.record("a", {"step": step, "loss": 0.5, "val_loss": 0.25, "config": config})
    book.finish("a", {FINAL_KEY: True, STATUS_KEY: OK, "config": config}, error=False)
    if asked_after_save:
        compat.optuna_search_trials(searcher).pop("a")
    state = optuna.trial.TrialState
    assert [t.state for t in searcher.study.get_trials()] == [state.RUNNING]
    searcher.catch_up()
    assert fail_interrupted(sweep) == 0
    [trial] = searcher.study.get_trials()
    assert trial.state == state.COMPLETE and trial.values[0] == 0.25
    assert trial.user_attrs["ray_trial_id"] == "a"


def test_a_race_rerun_that_did_not_come_back_is_named_after_a_resume(tmp_path: Path) -> None:
    """The resume's note named the search trials that did not come back, not the race's
    fresh-seed run that ran again from step 1 under a new id."""
    from sweeps.commands.run import rerun_again
    from tests.unit.conftest import book_of, rec

    sweep = load_linreg(tmp_path)
    was = {"s1": ("search", 0), "c1": ("confirm:s1", 1), "p1": ("probe:s1", 0)}
    again = rec("c2", role="confirm:s1", seed=1, val_loss=0.3)
    book = book_of(sweep, rec("s1", val_loss=0.3), again)
    assert rerun_again(book, ["c1", "p1"], was) == [
        "c1 (confirm:s1, seed 1) ran again from step 1 as c2",
        "p1 (probe:s1, seed 0) did not run again"]
