"""Numbers are numbers: text in a report, a missing objective and a trainer that ends its
own process are crashes with a reason, and a deterministic exit is not retried."""

from __future__ import annotations

import json
import math

import pytest

from sweeps.spec.loader import load_sweep
from sweeps.trial.run import run_trainer
from tests.conftest import edit_linreg, read_results_csv, run_cli_in


def _run(folder, fail: str):
    sweep = load_sweep(folder / "linreg.yaml", workdir=folder)
    sweep.base_config["train"]["fail"] = fail
    results: list[dict] = []
    reporter = run_trainer(sweep, {"lr": 0.05}, "t1", results.append)
    return reporter, results


def test_text_where_a_number_belongs_ends_the_trial_at_that_report(linreg_dir):
    reporter, results = _run(linreg_dir, "text")
    assert reporter.verdict.reason == "bad_metric" and reporter.verdict.step == 5
    assert reporter.verdict.evidence["metric"] == "loss"
    assert "'banana'" in reporter.verdict.evidence["error"]
    assert results[-1]["sweeps/status"] == "crash"
    assert len(reporter.history) == 5, "the trainer stopped at the bad report"
    assert all(isinstance(v, (int, float)) for h in reporter.history for v in h.values())


def test_a_trial_that_never_reports_its_objective_is_not_ok(linreg_dir):
    reporter, results = _run(linreg_dir, "no_val")
    assert results[-1]["sweeps/status"] == "crash"
    assert reporter.verdict.reason == "bad_metric"
    assert "never reported 'val_loss'" in reporter.verdict.evidence["error"]


def test_none_for_the_objective_is_a_bad_metric_and_none_elsewhere_is_not_reported():
    from sweeps.rules.settings import RuleSettings
    from sweeps.trial.reporter import TrialReporter, TrialStopped

    seen: list[dict] = []
    report = TrialReporter(RuleSettings(), seen.append, required=("val_loss",))
    report({"step": 1, "loss": 1.0, "note": None})
    assert "note" not in seen[-1] and seen[-1]["sweeps/status"] == "running"
    with pytest.raises(TrialStopped) as stop:
        report({"step": 2, "loss": 0.9, "val_loss": None})
    assert stop.value.verdict.reason == "bad_metric"
    assert stop.value.verdict.evidence["metric"] == "val_loss"
    with pytest.raises(TrialStopped):  # a list is not a number either
        TrialReporter(RuleSettings(), seen.append)({"step": 1, "loss": [1.0, 2.0]})


def test_an_int_past_a_floats_range_is_infinite_and_a_fraction_a_number():
    from fractions import Fraction

    from sweeps.rules.settings import RuleSettings
    from sweeps.trial.reporter import TrialReporter, TrialStopped

    seen: list[dict] = []
    report = TrialReporter(RuleSettings(), seen.append)
    report({"step": 1, "loss": 1.0, "share": Fraction(1, 3), "big": -(10**400)})
    assert seen[-1]["share"] == pytest.approx(1 / 3) and seen[-1]["big"] == -math.inf
    with pytest.raises(TrialStopped) as stop:
        report({"step": 2, "loss": 10**400})
    assert stop.value.verdict.reason == "non_finite"
    with pytest.raises(TrialStopped) as stop:  # a step is a number too
        TrialReporter(RuleSettings(), seen.append)({"step": "5", "loss": 1.0})
    assert stop.value.verdict.reason == "bad_metric"
    assert stop.value.verdict.evidence["metric"] == "step"


@pytest.mark.slow
def test_a_huge_int_ends_its_trial_not_the_sweep(linreg_dir):
    """Ray Tune makes every metric a float: 10**400 in one report ended the whole sweep
    with an OverflowError and no trials.csv."""
    edit_linreg(linreg_dir, train={"fail": "huge"},
                budget={"trials": 2, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 0})
    run_cli_in(linreg_dir, "run", "linreg.yaml", "--quiet", "--no-preflight")
    trials = read_results_csv(linreg_dir / "results" / "linreg" / "trials.csv")
    assert list(trials["status"]) == ["unstable", "unstable"]
    assert set(trials["reason"]) == {"non_finite"} and set(trials["steps"]) == {5}


@pytest.mark.slow
def test_a_trainer_writing_over_sweep_yaml_does_not_lose_the_sweep(linreg_dir, capfd):
    """A trial overwrote sweep.yaml with garbage: the run ended 0 with no word, and the
    sweep could then neither be reported nor resumed."""
    saved = linreg_dir / "results" / "linreg" / "sweep.yaml"
    edit_linreg(linreg_dir, train={"scribble": str(saved)},
                budget={"trials": 2, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 0})
    assert run_cli_in(linreg_dir, "run", "linreg.yaml", "--quiet", "--no-preflight") == 0
    assert "sweep.yaml changed while the sweep ran" in capfd.readouterr().err
    assert load_sweep(saved, workdir=linreg_dir, import_trainer=False).name == "linreg"
    assert run_cli_in(linreg_dir, "report", str(saved.parent)) == 0
    from sweeps.state import saved_sweep, seal

    seal.check(saved.parent)  # sealed over what was written back: resume takes it
    # a resume reads the sweep (it saves nothing): what it read is what it writes back
    text = saved.read_text()
    saved_sweep.read(saved.parent, import_trainer=False)
    saved.write_text("garbage: [")
    assert saved_sweep.overwritten(saved.parent) == ["sweep.yaml"]
    assert saved.read_text() == text


@pytest.mark.parametrize("fail", ["sys_exit", "os_exit", "named_exit"])
def test_a_trainer_that_exits_is_a_crash_with_its_exit_code(linreg_dir, fail):
    reporter, results = _run(linreg_dir, fail)  # this process survives os._exit
    assert reporter.verdict.reason == "trainer_exit" and reporter.verdict.step == 4
    assert reporter.verdict.evidence["exit_code"] == 3
    assert results[-1]["sweeps/status"] == "crash"


@pytest.mark.slow
def test_exits_and_dead_workers_in_a_real_sweep(linreg_dir, capfd):
    """A trainer exit is one crash, not retried; a killed worker says which process died
    and where Ray's error file is."""
    edit_linreg(linreg_dir, train={"fail": "named_exit"},  # `from os import _exit`
                budget={"trials": 2, "concurrent": 2, "max_failures": 2},
                confirm={"seeds": 0})
    assert run_cli_in(linreg_dir, "run", "linreg.yaml", "--quiet") == 1  # all crashed
    trials = read_results_csv(linreg_dir / "results" / "linreg" / "trials.csv")
    assert list(trials["status"]) == ["crash", "crash"]
    assert set(trials["reason"]) == {"trainer_exit"}
    assert trials["retries"].sum() == 0, "a deterministic exit is not retried as a lost node"
    evidence = json.loads(trials["evidence"].iloc[0])
    assert evidence["exit_code"] == 3

    edit_linreg(linreg_dir, train={"fail": "sigkill"}, name="killed",
                budget={"trials": 1, "concurrent": 1, "max_failures": 0})
    capfd.readouterr()
    assert run_cli_in(linreg_dir, "run", "linreg.yaml", "--quiet") == 1
    printed = "".join(capfd.readouterr())
    assert "\x1b[" not in printed, "no escape codes (Ray's own lines on a dead worker)"
    trials = read_results_csv(linreg_dir / "results" / "killed" / "trials.csv")
    assert trials["status"].iloc[0] == "crash"
    evidence = json.loads(trials["evidence"].iloc[0])
    assert "worker process died (pid " in evidence["error"]
    assert evidence["log"].endswith("error.txt")
    assert (linreg_dir / "results" / "killed").resolve() in \
        (linreg_dir / evidence["log"]).resolve().parents


@pytest.mark.slow
def test_a_results_folder_deleted_mid_run_stops_the_sweep_with_one_message(linreg_dir, capfd):
    """``rm -rf results/x`` while the sweep ran: a FileNotFoundError traceback from the
    Optuna journal, exit 1, and a half-written folder that neither run nor resume took.
    Now one message, exit 1, nothing left at the path, and the sweep runs again."""
    out = linreg_dir / "results" / "linreg"
    edit_linreg(linreg_dir, train={"remove_dir": str(out), "remove_at": 20, "sleep": 0.005},
                budget={"trials": 8, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 0})
    assert run_cli_in(linreg_dir, "run", "linreg.yaml", "--quiet", "--no-preflight") == 1
    err = capfd.readouterr().err
    assert f"error: the results folder {out} was deleted or moved while the sweep ran" in err
    assert "Traceback" not in err and "FileNotFoundError" not in err
    assert not out.exists(), sorted(p.name for p in out.iterdir())
    edit_linreg(linreg_dir, train={"remove_at": -1})
    assert run_cli_in(linreg_dir, "run", "linreg.yaml", "--quiet", "--no-preflight") == 0
    assert len(read_results_csv(out / "trials.csv")) >= 8
