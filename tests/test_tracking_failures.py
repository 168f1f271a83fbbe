"""Outputs in order of value; tracking never ends a sweep.

A trainer reporting metric names MLflow refuses (``acc@1``) runs a real sweep to the end:
MLflow gets legal names (the mapping logged), trials.csv and the histories keep the names
as reported. An unreachable tracking server (and a tracking store MLflow cannot open) is a
warning and a note in tracking.txt, with every other output written and exit 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sweeps.commands.cli import main
from sweeps.results.tracking import legal_name, metric_names
from tests.conftest import edit_linreg, read_results_csv

ACC_TRAINER = '''
from linreg_trainer import train as _train


def train(config, report):
    def with_accuracy(metrics, **kwargs):
        acc = max(0.0, 1.0 - float(metrics["loss"]))
        report({**metrics, "acc@1": acc, "acc_1": acc / 2, "top k/../x": acc / 4}, **kwargs)

    _train(config, with_accuracy)
'''

RENAMED = {"acc@1": "acc_1_2", "top k/../x": "top k_.._x"}


def _mlflow_accepts(name: str) -> bool:
    from mlflow.utils.validation import path_not_unique, validate_param_and_metric_name

    return bool(validate_param_and_metric_name(name)) and not path_not_unique(name) and \
        len(name) <= 250


@settings(deadline=None)  # the first call imports mlflow
@given(st.lists(st.text(max_size=300), max_size=12))
def test_every_name_gets_a_legal_distinct_mlflow_name(names):
    mapped = metric_names(names)
    assert set(mapped) == set(names)
    assert len(set(mapped.values())) == len(mapped), "no two names meet"
    for name, legal in mapped.items():
        assert _mlflow_accepts(legal), (name, legal)
        # MLflow's own check lets one trailing newline through (its pattern's "$" matches
        # before it); sweeps replaces it, as any other character outside the pattern
        if _mlflow_accepts(name) and ":" not in name and not name.endswith("\n"):
            assert legal == name, "a legal name is kept as it is"


def test_a_long_name_cut_at_a_slash_stays_legal():
    """The cut to 250 characters comes before the path check: a cut that would end in
    ``/`` or ``/.`` (which MLflow's path check refuses) is caught."""
    for name in ("a" * 249 + "/b", "a" * 248 + "/.b"):
        assert _mlflow_accepts(legal_name(name)), name
    assert metric_names(["\n", "acc\n"]) == {"\n": "_", "acc\n": "acc_"}


def test_names_mlflow_refuses():
    assert legal_name("acc@1") == "acc_1"
    assert legal_name("a//b") == "a__b" and legal_name("/abs") == "_abs"
    assert legal_name("..") == "_.." and legal_name("") == "_"
    assert metric_names(["acc@1", "acc_1", "acc#1"]) == {
        "acc@1": "acc_1_2", "acc_1": "acc_1", "acc#1": "acc_1_3"}


@pytest.fixture
def acc_dir(linreg_dir, monkeypatch):
    (linreg_dir / "acc_trainer.py").write_text(ACC_TRAINER)
    edit_linreg(linreg_dir, name="acc", trainer="acc_trainer:train",
                budget={"trials": 3, "max_steps": 20, "concurrent": 2, "scheduler": "none"},
                search_space={"lr": {"type": "loguniform", "low": 1e-2, "high": 0.5}},
                confirm={"seeds": 0, "lr_probe": 0})
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(linreg_dir)
    return linreg_dir


def _all_outputs(out: Path) -> pd.DataFrame:
    trials = read_results_csv(out / "trials.csv")
    assert len(trials[trials["role"] == "search"]) == 3
    assert (out / "pareto.csv").is_file() and list((out / "stable").glob("rank-01-*.yaml"))
    assert (out / "report.html").stat().st_size > 1000
    for trial_id in trials["trial_id"]:
        history = pd.read_csv(out / "trials" / f"{trial_id}.csv")
        assert {"acc@1", "acc_1", "top k/../x"} <= set(history.columns), "names kept verbatim"
    assert {"final_acc@1", "final_acc_1", "final_top k/../x"} <= set(trials.columns)
    return trials


def _runs(uri: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("acc")
    return client.search_runs([exp.experiment_id], max_results=100)


@pytest.mark.slow
def test_metric_names_mlflow_refuses_are_mapped_for_mlflow_alone(acc_dir, ray_session, capsys):
    assert main(["run", "linreg.yaml", "--quiet", "--no-preflight"]) == 0
    out = acc_dir / "results" / "acc"
    trials = _all_outputs(out)
    runs = _runs(f"sqlite:///{out / 'mlflow.db'}")
    parents = [r for r in runs if r.data.tags.get("sweeps.kind") == "sweep"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == len(trials)
    assert json.loads(parents[0].data.tags["sweeps.metric_names"]) == RENAMED
    by_id = trials.set_index("trial_id")
    for run in children:
        metrics = run.data.metrics
        assert {"acc_1_2", "acc_1", "top k_.._x", "loss"} <= set(metrics)
        assert "acc@1" not in metrics
        row = by_id.loc[run.info.run_name]
        assert metrics["acc_1_2"] == pytest.approx(row["final_acc@1"])
        assert metrics["acc_1"] == pytest.approx(row["final_acc_1"])
    note = (out / "tracking.txt").read_text()
    assert "metric renamed for MLflow: 'acc@1' -> 'acc_1_2'" in note
    assert f"parent run: {parents[0].info.run_id}" in note


@pytest.mark.slow
def test_tracking_that_fails_is_a_warning_and_every_other_output_is_written(
        acc_dir, ray_session, capsys, tmp_path):
    assert main(["run", "linreg.yaml", "--quiet", "--no-preflight", "--tracking-uri",
                 "http://alice:S3cretPW@127.0.0.1:9"]) == 0  # loopback, nothing listens
    out = acc_dir / "results" / "acc"
    printed = capsys.readouterr()
    assert "warning: MLflow tracking failed" in printed.err and "127.0.0.1:9" in printed.err
    assert "MLflow: NOT LOGGED" in printed.out
    trials = _all_outputs(out)
    note = (out / "tracking.txt").read_text()
    assert "NOT LOGGED" in note and "http://alice:***@127.0.0.1:9" in note
    assert "sweeps resume" in note
    assert "S3cretPW" not in printed.out + printed.err + note, "the password is never shown"
    assert not (out / "mlflow.db").exists()

    # a store MLflow itself cannot open (no probe catches it): the same warning, exit 0
    (tmp_path / "a-file").write_text("not a folder")
    broken = f"sqlite:///{tmp_path / 'a-file' / 'mlflow.db'}"
    assert main(["resume", str(out), "--quiet", "--tracking-uri", broken]) == 0
    assert "warning: MLflow tracking failed" in capsys.readouterr().err
    assert "NOT LOGGED" in (out / "tracking.txt").read_text()

    # the recovery the note gives: resume with a working store runs nothing again, logs all
    journals = {p.name: p.read_bytes() for p in (out / "trials").glob("*.jsonl")}
    assert main(["resume", str(out), "--quiet"]) == 0
    assert {p.name: p.read_bytes() for p in (out / "trials").glob("*.jsonl")} == journals
    again = _all_outputs(out)
    assert set(again["trial_id"]) == set(trials["trial_id"])
    children = [r for r in _runs(f"sqlite:///{out / 'mlflow.db'}")
                if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == len(trials)
    assert "parent run:" in (out / "tracking.txt").read_text()


def test_a_resume_logs_to_the_store_the_sweep_was_logged_to(tmp_path, capsys):
    """tracking.txt names the URI of the last logging: a resume without --tracking-uri
    logs there again (it had gone to results/<name>/mlflow.db, a second store); not after a
    failed logging, nor when a credential of the URI was masked (it is not kept on disk)."""
    from sweeps.commands.run import earlier_tracking_uri

    note = tmp_path / "tracking.txt"
    assert earlier_tracking_uri(note) is None  # never logged
    note.write_text("MLflow: sqlite:////data/mine.db\nexperiment: e\nparent run: abc\n")
    assert earlier_tracking_uri(note) == "sqlite:////data/mine.db"
    note.write_text("MLflow: http://srv:5000\nNOT LOGGED: ConnectionError\n")
    assert earlier_tracking_uri(note) is None
    note.write_text("MLflow: http://alice:***@srv:5000\nparent run: abc\n")
    assert earlier_tracking_uri(note) is None
    assert "pass --tracking-uri again" in capsys.readouterr().err
    for masked in ("http://***@srv:5000", "http://srv:5000/?token=***"):
        note.write_text(f"MLflow: {masked}\nparent run: abc\n")
        assert earlier_tracking_uri(note) is None
        assert "credentials are not kept on disk" in capsys.readouterr().err
