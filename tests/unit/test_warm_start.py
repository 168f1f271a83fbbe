"""Warm start from an earlier sweep's Optuna study (no Ray: the study is written here with
Optuna's own API, as the search writes it)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import optuna
import pytest

from sweeps.commands.run import save_resolved
from sweeps.errors import SpecError
from sweeps.results import warm_start as ws
from sweeps.spec.loader import Sweep
from tests.unit.conftest import load_linreg

SPACE = {"lr": optuna.distributions.FloatDistribution(1e-5, 30.0, log=True)}


def _tell(study: optuna.Study, lr: float, values: list[float] | None, *,
          stable: bool = True, state: optuna.trial.TrialState | None = None) -> None:
    """One trial as the search tells it: user attributes, the stability constraint, values."""
    study.enqueue_trial({"lr": lr})
    trial = study.ask(SPACE)
    trial.set_user_attr("status", "ok" if stable else "unstable")
    trial.set_constraint("stability", 0.0 if stable else 1.0)
    if state is not None:
        study.tell(trial, state=state)
    else:
        study.tell(trial, values)


def _earlier(tmp_path: Path) -> tuple[Sweep, Path]:
    """A finished linreg sweep's results folder holding a study of five trials."""
    old = load_linreg(tmp_path / "old")
    save_resolved(old)
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(old.output_dir / ws.STUDY_FILE)))
    study = optuna.create_study(storage=storage, study_name=old.name,
                                directions=["minimize", "minimize"])
    for lr, values, stable, state in [
            (0.1, [0.20, 0.0], True, None), (0.3, [0.10, 0.0], True, None),
            (20.0, [1.0, 10.0], False, None), (0.01, None, True,
                                               optuna.trial.TrialState.PRUNED),
            (1e-4, [0.9, 0.0], True, None), (0.3, [0.11, 0.0], True, None)]:
        _tell(study, lr, values, stable=stable, state=state)
    return old, old.output_dir


def test_load_takes_complete_trials_that_fit(tmp_path: Path) -> None:
    _, folder = _earlier(tmp_path)
    new = load_linreg(tmp_path / "new", search_space={
        "lr": {"type": "loguniform", "low": 1e-3, "high": 30.0}})
    warm = ws.load(folder, new)
    assert warm.seen == 6
    assert sorted(t.params["lr"] for t in warm.trials) == [0.1, 0.3, 0.3, 20.0]
    assert warm.skipped == Counter({"pruned": 1, "lr outside the new space": 1})
    assert all(t.user_attrs[ws.SOURCE_ATTR] == str(folder.resolve()) for t in warm.trials)
    assert warm.line() == (f"warm start: 4 of 6 trials of {folder.resolve()} seed the search "
                           "(not run again); skipped: 1 pruned, 1 lr outside the new space")
    assert sorted(p.name for p in folder.iterdir()) == [  # nothing written into it
        ".sweeps-seal", "optuna.journal", "sweep.yaml", "sweep_state.json"]


def test_best_first_feasible_distinct_as_many_as_run_at_once(tmp_path: Path) -> None:
    _, folder = _earlier(tmp_path)
    new = load_linreg(tmp_path / "new")  # budget.concurrent: 2
    warm = ws.load(folder, new)
    best = ws.best_first(new, warm)
    assert [t.params["lr"] for t in best] == [0.3, 0.1]  # 0.3 twice counts once; 20 unstable
    assert [t.values[0] for t in best] == [0.10, 0.20]


def test_a_config_the_race_found_fragile_is_not_queued(tmp_path: Path) -> None:
    """The race tells a fragile finding as an infeasible twin at the same point, after the
    config was told its (good) search value: the earlier sweep's best by value is then not
    one of its stable configs, and warm start does not queue it."""
    old, folder = _earlier(tmp_path)
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(folder / ws.STUDY_FILE)))
    study = optuna.load_study(study_name=old.name, storage=storage)
    _tell(study, 0.3, [0.10, 0.0], stable=False)  # lr 0.3 failed a fresh seed
    warm = ws.load(folder, load_linreg(tmp_path / "new"))
    assert [t.params["lr"] for t in ws.best_first(load_linreg(tmp_path / "new"), warm)] == \
        [0.1, 1e-4]


def test_seed_study_and_rows(tmp_path: Path) -> None:
    _, folder = _earlier(tmp_path)
    new = load_linreg(tmp_path / "new")
    warm = ws.load(folder, new)
    storage = optuna.storages.InMemoryStorage()
    ws.seed_study(new, warm, storage)
    study = optuna.load_study(study_name=new.name, storage=storage)
    states = Counter(t.state.name for t in study.get_trials())
    assert states == Counter({"COMPLETE": 5, "WAITING": 2})
    queued = study.get_trials(states=[optuna.trial.TrialState.WAITING])
    assert [t.user_attrs[ws.BEST_ATTR] for t in queued] == [1, 0]
    rows = ws.rows(new, storage)
    assert [r["trial_id"] for r in rows] == ["warm-0", "warm-1", "warm-2", "warm-4", "warm-5"]
    assert {r["role"] for r in rows} == {ws.ROLE}
    blown = rows[2]
    assert blown["status"] == "unstable" and blown["lr"] == 20.0
    assert blown["objective_val_loss"] == 1.0 and blown["objective_instability"] == 10.0
    assert ws.rows(load_linreg(tmp_path / "other", name="other"), storage) == []


def test_search_on_quality_searches_the_first_objective(tmp_path: Path) -> None:
    sweep = load_linreg(tmp_path, budget={"search_on": "quality"})
    assert [o.metric for o in ws.searched(sweep)] == ["val_loss"]
    assert ws.directions(sweep) == ["minimize"]


def test_why_not(linreg_sweep: Sweep) -> None:
    assert ws.why_not_fitting({"lr": 0.1}, {"lr"}, linreg_sweep) is None
    assert ws.why_not_fitting({"lr": 100.0}, {"lr"}, linreg_sweep) == "lr outside the new space"
    assert ws.why_not_fitting({}, set(), linreg_sweep) == "lr not in the earlier sweep"
    assert ws.why_not_fitting({"lr": 0.1, "wd": 0.1}, {"lr", "wd", "mom"}, linreg_sweep) == \
        "mom no longer in the space"


def _spec_error(folder: Path, sweep: Sweep) -> SpecError:
    with pytest.raises(SpecError) as info:
        ws.load(folder, sweep)
    assert info.value.key == ws.FLAG and info.value.exit_code == 2
    return info.value


def test_bad_folders_are_spec_errors(tmp_path: Path) -> None:
    sweep = load_linreg(tmp_path / "new")
    assert "no folder at" in _spec_error(tmp_path / "absent", sweep).problem
    sweep.output_dir.mkdir(parents=True)
    assert "this sweep's own results folder" in _spec_error(sweep.output_dir, sweep).problem
    plain = tmp_path / "plain"
    plain.mkdir()
    assert "not a sweeps results folder" in _spec_error(plain, sweep).problem
    old = load_linreg(tmp_path / "old")
    save_resolved(old)
    assert "holds no Optuna study" in _spec_error(old.output_dir, sweep).problem
    (old.output_dir / ws.STUDY_FILE).write_text("not a journal\n")
    err = _spec_error(old.output_dir, sweep)
    assert "holds no readable Optuna study" in err.problem and "results/linreg" in err.fix


def test_different_objectives_are_refused(tmp_path: Path) -> None:
    _, folder = _earlier(tmp_path)
    new = load_linreg(tmp_path / "new", objectives=[{"metric": "val_loss", "mode": "max"}])
    err = _spec_error(folder, new)
    assert err.problem.endswith("searched val_loss (min), instability (min); this sweep "
                                "searches val_loss (max)")


def test_unreadable_earlier_sweep_yaml(tmp_path: Path) -> None:
    _, folder = _earlier(tmp_path)
    (folder / "sweep.yaml").write_text("name: [unclosed\n")
    err = _spec_error(folder, load_linreg(tmp_path / "new"))
    assert "sweep.yaml cannot be read" in err.problem
    (folder / "sweep.yaml").write_text(json.dumps({"name": "x"}))
    (folder / "sweep_state.json").write_text("{")
    with pytest.raises(SpecError):
        ws.load(folder, load_linreg(tmp_path / "new2"))


def test_searching_compile_says_that_is_what_added_step_time(tmp_path: Path) -> None:
    """A sweep on the default space searches compile, which adds step_time: warm-starting
    it from a sweep that fixed compile was refused with no word of why."""
    _, folder = _earlier(tmp_path)
    new = load_linreg(tmp_path / "new", search_space={
        "lr": {"type": "loguniform", "low": 1.0e-4, "high": 1.0},
        "compile": {"type": "categorical", "choices": ["none", "default"]}},
        write_back={"lr": "train.lr", "compile": "train.compile"}, new_keys=True)
    err = _spec_error(folder, new)
    assert "step_time" in err.problem and "search_space: {compile: none}" in err.fix
