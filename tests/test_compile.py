"""A trial runs what its compile label says: a clean compiler state per trial on a reused
process, evidence of compilation in trials.csv, eager fallbacks flagged and kept off the
step-time front, and warm trials served from the shared cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sweeps.record.book import books_of, open_book
from sweeps.results.files import trials_frame
from sweeps.results.report import write_report
from sweeps.results.summary import summary
from sweeps.spec.loader import load_sweep, load_sweep_dict
from sweeps.trial.compile import eager_fallback
from sweeps.trial.run import prepare_process, run_trainer
from sweeps.tune.progress import ProgressLines
from tests.conftest import edit_linreg, read_results_csv, run_cli_in

ROOT = Path(__file__).resolve().parents[1]


def _evidence(results: list[dict]) -> dict:
    """The compile evidence of a trial's last result."""
    return json.loads(results[-1]["sweeps/compile"])


def _regression_sweep(folder: Path):
    """The reference regression trainer, tiny (a 2-layer MLP, 12 steps), dropout and compile
    searched: dropout is baked into the compiled graph as a constant."""
    return load_sweep_dict({
        "name": "compiled", "trainer": "sweeps.trainers.regression:train",
        "base_config": {"data": {"n_train": 512, "n_val": 128},
                        "model": {"hidden": 32, "layers": 2, "dropout": 0.1},
                        "training": {"lr": 1e-3, "max_steps": 12, "eval_every": 6,
                                     "batch_size": 32, "compile": "none"}},
        "search_space": {"dropout": {"type": "uniform", "low": 0.0, "high": 0.3},
                         "compile": {"type": "categorical", "choices": ["none", "default"]}},
        "write_back": {"dropout": "model.dropout", "compile": "training.compile"},
        "rules": {"baseline_loss": 1.0}, "budget": {"trials": 3, "max_steps": 12},
        "output": str(folder), "seed": 0}, base_dir=ROOT, workdir=ROOT)


def test_trials_in_one_process_each_compile_from_a_clean_state(tmp_path, monkeypatch):
    """Three compile=default trials in one process (a reused Ray worker): each compiles its
    own graph with no recompile of an earlier trial's; the third (same dropout as the
    first) loads its graph from the shared cache instead of compiling it again."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # prepare_process sets it; restored
    sweep = _regression_sweep(tmp_path / "results")
    prepare_process(sweep, 1)
    evidence = []
    for i, dropout in enumerate([0.1, 0.2, 0.1]):
        results: list[dict] = []
        run_trainer(sweep, {"dropout": dropout, "compile": "default"}, f"t{i}",
                    results.append)
        assert results[-1]["sweeps/status"] == "ok"
        evidence.append(_evidence(results))
    for ev in evidence:
        assert ev["graphs"] == 1 and ev["recompiles"] == 0, evidence
        assert eager_fallback("default", ev) is None
    assert evidence[1]["cache_misses"] > 0, "another dropout is another graph"
    assert evidence[2]["cache_hits"] > 0 and evidence[2]["cache_misses"] == 0, evidence


def test_an_eager_trial_carries_empty_evidence(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")
    sweep = _regression_sweep(tmp_path / "results")
    results: list[dict] = []
    run_trainer(sweep, {"dropout": 0.1, "compile": "none"}, "t0", results.append)
    assert _evidence(results)["graphs"] == 0
    assert eager_fallback("none", _evidence(results)) is None


def test_a_trial_that_hits_the_recompile_limit_is_flagged_and_off_the_step_time_front(
        linreg_dir, monkeypatch):
    """Evaluation under no_grad through the compiled model recompiles (grad_mode changed);
    with the limit at 1 dynamo runs it eagerly. The trial is warned about in trials.csv and
    its step_time is no objective value; the same trial under the default limit is not."""
    edit_linreg(linreg_dir, train={"eval_compiled": True, "steps": 20, "compile": "none"},
                search_space={"lr": {"type": "loguniform", "low": 1e-3, "high": 1.0},
                              "compile": {"type": "categorical", "choices": ["none", "default"]}},
                write_back={"lr": "train.lr", "compile": "train.compile"})
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir)
    assert [o.metric for o in sweep.objectives][-1] == "step_time"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")
    prepare_process(sweep, 1)
    runs = {}
    for trial_id, limit in (("limited", 1), ("normal", 8)):
        results: list[dict] = []
        with torch._dynamo.config.patch(recompile_limit=limit):
            run_trainer(sweep, {"lr": 0.05, "compile": "default"}, trial_id, results.append)
        runs[trial_id] = results
    assert "grad_mode" in _evidence(runs["limited"])["limit"]
    assert _evidence(runs["normal"])["recompiles"] >= 1
    assert "limit" not in _evidence(runs["normal"])

    with books_of(sweep):
        book = open_book(sweep)
        for trial_id, results in runs.items():
            for result in results:
                book.record(trial_id, {**result, "config": {"lr": 0.05, "compile": "default"}})
            book.finish(trial_id, None, error=False)
        rows = trials_frame(sweep, book).set_index("trial_id")
        progress = ProgressLines(book, total=2)
        assert "RAN EAGERLY: recompile_limit (1) hit" in progress.line(book.trials["limited"])
        assert "EAGERLY" not in progress.line(book.trials["normal"])
    folder = linreg_dir / "report"
    folder.mkdir()
    rows.reset_index().to_csv(folder / "trials.csv", index=False)
    assert list(summary(folder)["compile_fallbacks"]) == ["limited"]
    html = write_report(folder, "linreg", ["val_loss"]).read_text()
    assert "1 trial(s) labelled compiled ran eagerly" in html and "grad_mode" in html
    limited, normal = rows.loc["limited"], rows.loc["normal"]
    assert "recompile_limit (1) hit" in limited["compile_fallback"]
    assert "labelled compile=default but ran eagerly" in limited["warnings"]
    assert limited["objective_step_time"] is None or limited["objective_step_time"] != \
        limited["objective_step_time"], "no step_time objective for an eager fallback"
    assert normal["compile_fallback"] == "" and normal["objective_step_time"] > 0
    assert normal["compile_graphs"] >= 2 and normal["compile_recompiles"] >= 1


@pytest.mark.slow
def test_reused_workers_run_every_compiled_trial_compiled(linreg_dir, ray_session):
    """A sweep over compile modes on 2 reused Ray workers, evaluating under no_grad through
    the compiled model: every trial labelled compiled shows its graphs in trials.csv, none
    ran eagerly, and the report has the evidence columns."""
    edit_linreg(linreg_dir, train={"eval_compiled": True, "steps": 20, "compile": "none"},
                search_space={"lr": {"type": "loguniform", "low": 1e-2, "high": 0.1},
                              "compile": {"type": "categorical", "choices": ["none", "default"]}},
                write_back={"lr": "train.lr", "compile": "train.compile"},
                initial_points=[{"lr": 0.05, "compile": "default"}] * 3
                + [{"lr": 0.05, "compile": "none"}],
                budget={"trials": 4, "max_steps": 20, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 0, "lr_probe": 0})
    assert run_cli_in(linreg_dir, "run", "linreg.yaml", "--quiet", "--no-preflight") == 0
    trials = read_results_csv(linreg_dir / "results" / "linreg" / "trials.csv")
    compiled = trials[trials["compile"] == "default"]
    assert len(compiled) >= 3
    assert (compiled["compile_graphs"] >= 1).all(), compiled.to_dict(orient="records")
    assert compiled["compile_fallback"].isna().all(), compiled["compile_fallback"].tolist()
    warm = compiled[compiled["compile_cache_hits"] > 0]
    assert len(warm), "later trials of the mode load their graphs from the shared cache"
    eager = trials[trials["compile"] == "none"]
    assert (eager["compile_graphs"] == 0).all()


@pytest.mark.slow
def test_a_sweep_warns_about_compiled_trials_that_ran_eagerly(linreg_dir, ray_session,
                                                               capsys):
    """With dynamo's limit at 1 the no_grad evaluation runs eagerly: the end-of-run summary
    warns, trials.csv says why, and such a trial is not on the front as a fast config."""
    edit_linreg(linreg_dir, train={"eval_compiled": True, "steps": 20, "compile": "none",
                                   "recompile_limit": 1},
                search_space={"lr": {"type": "loguniform", "low": 1e-2, "high": 0.1},
                              "compile": {"type": "categorical", "choices": ["none", "default"]}},
                write_back={"lr": "train.lr", "compile": "train.compile"},
                initial_points=[{"lr": 0.05, "compile": "default"},
                                {"lr": 0.05, "compile": "none"}],
                budget={"trials": 2, "max_steps": 20, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 0, "lr_probe": 0})
    assert run_cli_in(linreg_dir, "run", "linreg.yaml", "--no-preflight") == 0
    out = capsys.readouterr()
    assert "labelled compile=default but ran eagerly: recompile_limit (1) hit" in out.out
    assert "RAN EAGERLY" in out.err  # the trial's progress line
    folder = linreg_dir / "results" / "linreg"
    trials = read_results_csv(folder / "trials.csv").set_index("compile")
    assert "grad_mode" in trials.loc["default", "compile_fallback"]
    assert trials.loc["default", "objective_step_time"] != \
        trials.loc["default", "objective_step_time"], "no step_time objective (NaN)"
    pareto = read_results_csv(folder / "pareto.csv").set_index("trial_id")
    compiled = trials.loc["default", "trial_id"]
    assert compiled not in pareto.index or not pareto.loc[compiled, "on_front"]
