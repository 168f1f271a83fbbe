"""``sweeps run FILE --warm-start DIR``: a second sweep over a narrowed space starts from the
first sweep's trials (real Ray, real Optuna), never re-runs them, and leaves DIR untouched."""

from __future__ import annotations

import hashlib
import json
import shutil

import optuna
import pytest

from sweeps.protocol import WARM_BEST_KEY
from sweeps.results.summary import summary
from sweeps.results.warm_start import BEST_ATTR, SOURCE_ATTR, directions
from sweeps.spec.loader import load_sweep
from sweeps.spec.space import optuna_space
from sweeps.tune.searcher import make_sampler
from tests.conftest import copy_sweepfiles, edit_linreg, read_results_csv, run_cli_in

pytestmark = pytest.mark.slow

LOW, HIGH = 1e-3, 3.0  # the narrowed space: without the flat and the diverging ends
OWN_TRIALS = 3


def _journal(path):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(path)))


def _digest(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, ray_session):
    """A first sweep over lr 1e-5..30, then a second over 1e-3..3 warm-started from it."""
    folder = copy_sweepfiles(tmp_path_factory.mktemp("warm"))
    edit_linreg(folder, budget={"trials": 8, "concurrent": 1, "scheduler": "none"},
                confirm={"seeds": 0, "lr_probe": 0})
    assert run_cli_in(folder, "run", "linreg.yaml", "--quiet", "--no-preflight") == 0
    first = folder / "results" / "linreg"
    before = _digest(first)
    edit_linreg(folder, name="linreg-narrow", budget={"trials": OWN_TRIALS},
                search_space={"lr": {"type": "loguniform", "low": LOW, "high": HIGH}})
    assert run_cli_in(folder, "run", "linreg.yaml", "--quiet", "--no-preflight",
                      "--warm-start", "results/linreg") == 0
    return folder, first, folder / "results" / "linreg-narrow", before


def test_fitting_trials_listed_and_never_run_again(sweeps):
    folder, first, second, before = sweeps
    old = read_results_csv(first / "trials.csv")
    old = old[old["role"] == "search"]
    fits = old[(old["lr"] >= LOW) & (old["lr"] <= HIGH)]
    assert 0 < len(fits) < len(old), "the narrowed space must keep some trials, not all"
    trials = read_results_csv(second / "trials.csv")
    warm = trials[trials["role"] == "warm_start"]
    assert sorted(warm["trial_id"]) == sorted(fits["trial_id"])
    assert dict(zip(warm["trial_id"], warm["lr"], strict=True)) == pytest.approx(
        dict(zip(fits["trial_id"], fits["lr"], strict=True)))
    assert set(warm["warm_start_from"]) == {str(first)}
    own = trials[trials["role"] == "search"]
    assert len(own) == OWN_TRIALS, "budget.trials counts this sweep's own trials only"
    assert not set(own["trial_id"]) & set(warm["trial_id"])
    ray_trials = {p.name for p in (second / "ray").iterdir() if p.is_dir()}
    assert len(ray_trials) == OWN_TRIALS, ray_trials
    histories = {p.stem for p in (second / "trials").glob("*.csv")}
    assert not histories & set(warm["trial_id"]), "a warm-started trial ran again"
    # the front and stable/ come from this sweep's own trials
    pareto = read_results_csv(second / "pareto.csv")
    assert set(pareto["trial_id"]) <= set(own["trial_id"])
    assert all(p.name.split("-", 2)[-1].removesuffix(".yaml") in set(own["trial_id"])
               for p in (second / "stable").glob("*.yaml"))
    info = summary(second)
    assert info["search_trials"] == OWN_TRIALS
    assert info["warm_start"]["trials"] == len(fits)
    assert "warm start" in (second / "report.html").read_text()
    assert _digest(first) == before, "the earlier sweep's folder was written to"
    assert not (first / "optuna.journal.lock").exists()


def test_the_search_starts_at_the_earlier_best_then_tpe_takes_over(sweeps):
    """The second sweep's first trial is the earlier sweep's best config that fits the
    narrowed space (queued, as many as run at once: 1 here); its next ask is TPE's answer
    given the warm-started trials and that first trial (an in-memory study with the same
    sampler, trials and queue asks the same lr), not a cold start's."""
    folder, first, second, _ = sweeps
    sweep = load_sweep(folder / "linreg.yaml", workdir=folder, import_trainer=False)
    study = optuna.load_study(study_name="linreg-narrow",
                              storage=_journal(second / "optuna.journal"))
    warm = [t for t in study.trials if SOURCE_ATTR in t.user_attrs]
    own = [t for t in study.trials if SOURCE_ATTR not in t.user_attrs]
    assert warm and len(own) == OWN_TRIALS
    assert max(t.number for t in warm) < min(t.number for t in own)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in warm)
    feasible = [t for t in warm if t.constraints["stability"] <= 0]
    best = min(feasible, key=lambda t: t.values[0])
    assert own[0].params == best.params, "the search starts at the earlier best"
    assert own[0].user_attrs[BEST_ATTR] == best.user_attrs["warm_start_trial"]
    assert BEST_ATTR not in own[1].user_attrs
    configs = [json.loads(t[0])["config"] for state in (second / "ray").glob("experiment_state*")
               for t in json.loads(state.read_text())["trial_data"]]
    marked = [c for c in configs if WARM_BEST_KEY in c]
    assert [c[WARM_BEST_KEY] for c in marked] == [best.user_attrs["warm_start_trial"]], \
        "the queued best's Ray config tells ASHA to leave it running"
    assert marked[0]["lr"] == pytest.approx(best.params["lr"])
    trials = read_results_csv(second / "trials.csv")
    lrs = trials[trials["role"] == "search"]["lr"].tolist()
    assert any(lr == pytest.approx(best.params["lr"]) for lr in lrs), "it ran as a search trial"
    space = optuna_space(sweep.space)

    def next_ask(trials, queued):
        replay = optuna.create_study(directions=directions(sweep), sampler=make_sampler(sweep))
        replay.add_trials(trials)
        for t in queued:
            replay.enqueue_trial(t.params)
            replay.tell(replay.ask(space), t.values)
        return replay.ask(space).params["lr"]

    # then the base config's own values (confirm.base: it races from the start)
    assert own[1].params["lr"] == sweep.base_config["train"]["lr"]
    assert own[2].params["lr"] == pytest.approx(next_ask(warm, own[:2]), rel=1e-9)
    assert own[2].params["lr"] != pytest.approx(next_ask([], own[:2]), rel=1e-3)


def test_bad_warm_start_folders_exit_2(sweeps, capsys):
    folder, first, second, before = sweeps
    bare = folder / "bare"
    bare.mkdir(exist_ok=True)
    no_journal = folder / "no-journal"
    no_journal.mkdir(exist_ok=True)
    for name in ("sweep.yaml", "sweep_state.json"):
        shutil.copyfile(first / name, no_journal / name)
    for target, expected in ((folder / "missing", "no folder at"),
                             (bare, "not a sweeps results folder"),
                             (no_journal, "no Optuna study"),
                             (second, "this sweep's own results folder")):
        assert run_cli_in(folder, "run", "linreg.yaml", "--warm-start", str(target)) == 2
        err = capsys.readouterr().err
        assert "--warm-start" in err and expected in err, err
    assert (second / "trials.csv").exists(), "the refused run moved its own folder aside"
    edit_linreg(folder, objectives=[{"metric": "instability", "mode": "min"},
                                    {"metric": "val_loss", "mode": "min"}])
    assert run_cli_in(folder, "run", "linreg.yaml", "--warm-start", str(first)) == 2
    err = capsys.readouterr().err
    assert "--warm-start" in err and "instability (min)" in err, err
    assert _digest(first) == before


def test_a_sweep_searching_quality_alone_starts_from_one_that_searched_every_objective(
        sweeps):
    """The first sweep searched val_loss and instability; one with ``search_on: quality``
    takes their val_loss values (the same measure) and starts from its best."""
    folder, first, _, before = sweeps
    edit_linreg(folder, name="linreg-quality", objectives=[
        {"metric": "val_loss", "mode": "min"}, {"metric": "instability", "mode": "min"}],
        budget={"trials": 2, "search_on": "quality"})
    assert run_cli_in(folder, "run", "linreg.yaml", "--quiet", "--no-preflight",
                      "--warm-start", str(first)) == 0
    out = folder / "results" / "linreg-quality"
    study = optuna.load_study(study_name="linreg-quality", storage=_journal(
        out / "optuna.journal"))
    warm = [t for t in study.trials if SOURCE_ATTR in t.user_attrs]
    assert len(study.directions) == 1 and warm
    assert all(t.values is None or len(t.values) == 1 for t in warm)
    assert _digest(first) == before


def test_warm_start_over_a_compile_knob_whose_choice_preflight_dropped(tmp_path, ray_session):
    """A first sweep searched three compile modes; on this CPU machine the second sweep's
    preflight drops ``reduce-overhead`` (it captures CUDA graphs), so the new study's
    compile distribution has two choices: the earlier trials that fit are added with it
    (those that ran reduce-overhead are skipped), and TPE samples on without a distribution
    clash (Optuna: "CategoricalDistribution does not support dynamic value space")."""
    folder = copy_sweepfiles(tmp_path)
    modes = ["none", "default", "reduce-overhead"]
    edit_linreg(folder, train={"compile": "none"},
                budget={"trials": 6, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 0, "lr_probe": 0},
                search_space={"lr": {"type": "loguniform", "low": 1e-3, "high": 1.0},
                              "compile": {"type": "categorical", "choices": modes}},
                write_back={"lr": "train.lr", "compile": "train.compile"})
    assert run_cli_in(folder, "run", "linreg.yaml", "--quiet", "--no-preflight") == 0
    first = read_results_csv(folder / "results" / "linreg" / "trials.csv")
    edit_linreg(folder, name="linreg-again", budget={"trials": 3})
    assert run_cli_in(folder, "run", "linreg.yaml", "--quiet",
                      "--warm-start", "results/linreg") == 0
    second = folder / "results" / "linreg-again"
    assert "dropped 'reduce-overhead'" in (second / "preflight.md").read_text()
    trials = read_results_csv(second / "trials.csv")
    warm = trials[trials["role"] == "warm_start"]
    kept = first[(first["role"] == "search") & (first["compile"] != "reduce-overhead")]
    assert sorted(warm["trial_id"]) == sorted(kept["trial_id"])
    own = trials[trials["role"] == "search"]
    assert len(own) == 3 and set(own["compile"]) <= {"none", "default"}
    study = optuna.load_study(study_name="linreg-again",
                              storage=_journal(second / "optuna.journal"))
    assert {tuple(t.distributions["compile"].choices) for t in study.trials} == \
        {("none", "default")}
