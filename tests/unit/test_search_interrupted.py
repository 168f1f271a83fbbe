"""Trials a dead driver left RUNNING are told FAIL, through Optuna's public storage API."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
from optuna.trial import TrialState

from sweeps.tune.searcher import fail_interrupted, is_finished, study_storage


def test_running_trials_are_failed_and_marked_interrupted(tmp_path):
    sweep = SimpleNamespace(name="s", output_dir=tmp_path)  # what the study's place needs
    study = optuna.create_study(study_name="s", storage=study_storage(sweep))
    done, left = study.ask(), study.ask()
    study.tell(done, 1.0)
    assert is_finished(study, done.number) and not is_finished(study, left.number)
    assert fail_interrupted(sweep) == 1
    reread = optuna.load_study(study_name="s", storage=study_storage(sweep))
    by_number = {t.number: t for t in reread.get_trials()}
    assert by_number[left.number].state == TrialState.FAIL
    assert by_number[left.number].user_attrs == {"status": "interrupted"}
    assert by_number[done.number].state == TrialState.COMPLETE
    assert by_number[done.number].user_attrs == {}
    assert is_finished(reread, left.number)
    assert fail_interrupted(sweep) == 0


def test_no_study_yet_fails_nothing(tmp_path):
    assert fail_interrupted(SimpleNamespace(name="s", output_dir=tmp_path)) == 0
