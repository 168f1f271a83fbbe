"""A sweep whose lr or compile knob never reaches the trainer stops early and says so
(exit 2)."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from sweeps.record.book import TrialRecord
from sweeps.trial.knob_check import (
    compile_ignored,
    inert_knob,
    lr_ignored,
    unreported_objective,
    warmup_ignored,
)
from tests.conftest import edit_linreg, run_cli_in


def _rec(i: int, sampled: float, peak: float, role: str = "search",
         rising: bool = False) -> TrialRecord:
    """A finished trial whose LR warmed up to ``peak`` and then decayed (or was still
    rising when it was stopped)."""
    rec = TrialRecord(trial_id=str(i), values={"lr": sampled}, seed=0, role=role)
    rec.history = [{"step": 1, "lr": peak / 10}, {"step": 2, "lr": peak}]
    if not rising:
        rec.history.append({"step": 3, "lr": peak / 2})
    rec.finished = True
    return rec


def _run_refused(folder, name: str) -> tuple[str, int]:
    """``sweeps run`` of the edited linreg sweep, which must exit 2 and leave no results
    folder: its stderr and how many trials it says had run."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert run_cli_in(folder, "run", "linreg.yaml", "--quiet", "--no-preflight") == 2
    assert not (folder / "results" / name).exists(), "nothing of a refused run is kept"
    ran = re.search(r"results folder was removed \((\d+) trial\(s\) had run", err.getvalue())
    assert ran is not None, err.getvalue()
    return err.getvalue(), int(ran.group(1))


def test_the_same_reported_lr_across_a_tenfold_span_is_caught():
    same = [_rec(i, lr, 0.1) for i, lr in enumerate((1e-4, 1e-2, 1.0))]
    assert "does not read the lr knob's write_back path" in lr_ignored(same)
    following = [_rec(i, lr, lr * 0.5) for i, lr in enumerate((1e-4, 1e-2, 1.0))]
    assert lr_ignored(following) is None, "a schedule scales every trial alike"
    narrow = [_rec(i, lr, 0.1) for i, lr in enumerate((0.01, 0.02, 0.05))]
    assert lr_ignored(narrow) is None, "too narrow a span to tell"
    assert lr_ignored(same[:2]) is None, "too few trials"
    assert lr_ignored([_rec(i, lr, 0.1, role="confirm:x") for i, lr in
                       enumerate((1e-4, 1e-2, 1.0))]) is None, "search trials only"
    # OneCycleLR to a fixed max_lr: trials stopped inside its warmup never reached it
    stopped = [_rec(7, 2e-4, 0.0004, rising=True), _rec(8, 3e-4, 0.0006, rising=True)]
    assert "does not read the lr knob" in lr_ignored([*stopped, *same])


def _warmed(i: int, warmup: int, lrs: list[float]) -> TrialRecord:
    rec = TrialRecord(trial_id=str(i), values={"warmup": warmup, "lr": 0.01}, seed=0,
                      role="search")
    rec.history = [{"step": s, "lr": lr} for s, lr in enumerate(lrs, start=1)]
    rec.finished, rec.status = True, "ok"
    return rec


def test_a_warmup_that_never_moves_the_lr_is_caught():
    """A scheduler never stepped (or a warmup path never read): one LR all run long."""
    flat = [_warmed(i, w, [0.01] * 60) for i, w in enumerate((10, 20, 40))]
    why = warmup_ignored(flat)
    assert why and "3 search trials with warmup 10 to 40" in why and "the LR was 0.01" in why
    assert inert_knob(flat).key == "write_back.warmup"
    ramp = [min(1.0, s / 20) * 0.01 for s in range(1, 61)]
    assert warmup_ignored([*flat, _warmed(9, 20, ramp)]) is None, "one trial warmed up"
    assert warmup_ignored(flat[:2]) is None, "too few trials"
    # stopped inside its warmup, or a warmup of 0: nothing to tell
    assert warmup_ignored([_warmed(i, 40, [0.01] * 30) for i in range(3)]) is None
    assert warmup_ignored([_warmed(i, 0, [0.01] * 60) for i in range(3)]) is None
    # a schedule stepped per epoch: the LR moves later in the run
    epochs = [_warmed(i, 20, [0.001] * 30 + [0.01] * 30) for i in range(3)]
    assert warmup_ignored(epochs) is None


@pytest.mark.slow
def test_a_sweep_that_tunes_nothing_stops_and_exits_2(linreg_dir, ray_session):
    edit_linreg(linreg_dir, name="deaf", new_keys=True,
                write_back={"lr": "train.lr_unused"},  # the trainer reads train.lr
                initial_points=[{"lr": lr} for lr in (1e-4, 1e-2, 1.0)],
                budget={"trials": 12, "max_steps": 30, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 0})
    err, ran = _run_refused(linreg_dir, "deaf")
    assert "error: write_back.lr:" in err
    assert "every one reported the same optimizer LR (peak 0.1)" in err
    # the base config's trial and the three points; LR probes of the race that started
    # before three search trials had finished
    assert 3 <= ran <= 7, "no trial starts once the problem is known"


def _compiled(i: int, mode: str, graphs: int, status: str = "ok") -> TrialRecord:
    rec = TrialRecord(trial_id=str(i), values={"compile": mode}, seed=0, role="search")
    rec.history = [{"step": 1, "loss": 1.0}]
    rec.finished, rec.status, rec.compile = True, status, {"graphs": graphs}
    return rec


def test_compiled_labels_that_never_compiled_a_graph_are_caught():
    deaf = [_compiled(i, m, 0) for i, m in enumerate(("default", "none", "max-autotune",
                                                       "default"))]
    assert "not one compiled a graph" in compile_ignored(deaf)
    assert inert_knob(deaf).key == "write_back.compile"
    assert compile_ignored(deaf[:3]) is None, "two compiled labels are too few to tell"
    assert compile_ignored([*deaf, _compiled(9, "default", 2)]) is None, "one compiled"
    crashed = [_compiled(i, "default", 0, status="crash") for i in range(4)]
    assert compile_ignored(crashed) is None, "a crash sent no evidence worth reading"


def test_a_model_torch_compile_cannot_trace_is_told_apart_from_an_unread_knob():
    import torch

    from sweeps.trial.compile import compile_evidence, compile_model, reset_compiler

    reset_compiler()
    gru = compile_model(torch.nn.GRU(4, 8, batch_first=True), "default")
    gru(torch.randn(2, 5, 4))
    evidence = compile_evidence()
    reset_compiler()
    assert evidence["calls"] == 1 and evidence["graphs"] == 0
    traced_nothing = [_compiled(i, "default", 0) for i in range(3)]
    for rec in traced_nothing:
        rec.compile = dict(evidence)
    why = compile_ignored(traced_nothing)
    assert "though the trainer called sweeps.compile_model" in why and "GRU" in why
    assert "does not read the compile knob" not in why
    assert "make the model one torch.compile can trace" in inert_knob(traced_nothing).fix


@pytest.mark.slow
def test_a_compile_knob_the_trainer_ignores_stops_the_sweep(linreg_dir, ray_session):
    edit_linreg(linreg_dir, name="eager", new_keys=True,
                search_space={"lr": {"type": "loguniform", "low": 1e-2, "high": 0.3},
                              "compile": {"type": "categorical", "choices": ["none", "default"]}},
                write_back={"lr": "train.lr", "compile": "train.compile_mode"},  # reads .compile
                initial_points=[{"lr": 0.1, "compile": "default"}] * 3,
                budget={"trials": 12, "max_steps": 30, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 0})
    err, ran = _run_refused(linreg_dir, "eager")
    assert "error: write_back.compile:" in err and "not one compiled a graph" in err
    assert ran <= 8, "no trial starts once the problem is known (and their race runs)"


def _ended_without(i: int, metric: str, reported: str = "val_loss") -> TrialRecord:
    rec = TrialRecord(trial_id=str(i), values={"lr": 0.1}, seed=0, role="search")
    rec.history = [{"step": 1, "loss": 1.0, reported: 0.5}]
    rec.finished, rec.status, rec.reason = True, "crash", "bad_metric"
    rec.evidence = {"metric": metric}
    return rec


def test_an_objective_no_trial_reports_is_caught_after_two_trials():
    one = [_ended_without(0, "val_los")]
    assert unreported_objective(one, ["val_los"]) is None, "one trial is too few"
    two = [*one, _ended_without(1, "val_los")]
    found = unreported_objective(two, ["val_los"])
    assert found.key == "objectives.0.metric" and "did you mean 'val_loss'?" in found.fix
    assert "(they reported: loss, val_loss)" in found.why
    reported = [*two, _ended_without(2, "x", reported="val_los")]  # one trial did report it
    assert unreported_objective(reported, ["val_los"]) is None


def test_an_objective_the_trainer_never_reports_stops_the_sweep(linreg_dir, ray_session):
    edit_linreg(linreg_dir, name="misnamed",
                objectives=[{"metric": "val_los", "mode": "min"},
                            {"metric": "instability", "mode": "min"}],
                budget={"trials": 12, "max_steps": 30, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 0})
    err, ran = _run_refused(linreg_dir, "misnamed")
    assert "error: objectives.0.metric:" in err and "did you mean 'val_loss'?" in err
    assert ran <= 6, "no trial starts once the problem is known (and their race runs)"


def test_a_baseline_far_below_every_trials_start_is_named():
    from sweeps.rules.settings import RuleSettings
    from sweeps.trial.knob_check import baseline_off, sweep_problem

    def started(i: int, first: float, status: str = "unstable") -> TrialRecord:
        rec = TrialRecord(trial_id=str(i), values={"lr": 0.01}, seed=0, role="search")
        rec.history = [{"step": 1, "loss": first}, {"step": 2, "loss": first * 0.9}]
        rec.finished, rec.status = True, status
        return rec

    low = RuleSettings(baseline_loss=0.05)  # MSE of a target with variance 0.5
    trials = [started(i, 0.55 + 0.001 * i) for i in range(3)]
    found = sweep_problem(trials, [], low)
    assert found is not None and found.key == "rules.baseline_loss"
    assert "3 search trials started at a loss of 0.55 to 0.552" in found.why
    assert "the target variance for MSE" in found.fix
    assert baseline_off(trials[:2], low) is None, "two trials are too few to tell"
    mixed = [*trials, started(9, 0.06, "ok")]  # raw inputs against normalised ones
    assert baseline_off(mixed, low) is None
    assert baseline_off(trials, RuleSettings(baseline_loss=0.5)) is None


def test_a_fresh_seed_that_repeats_the_search_run_exactly_is_a_trainer_deaf_to_its_seed():
    """A trainer seeding from its own config's seed: the re-run on seed 1 repeated the
    search run on seed 0 to the last bit, so every fresh seed confirms nothing."""
    from sweeps.trial.knob_check import seed_ignored, sweep_problem

    def run(trial_id: str, seed: int, role: str, losses: list[float]) -> TrialRecord:
        rec = TrialRecord(trial_id=trial_id, values={"lr": 0.01}, seed=seed, role=role)
        rec.history = [{"step": s, "loss": v} for s, v in enumerate(losses, start=1)]
        rec.finished, rec.status = True, "ok"
        return rec

    cand = run("c", 0, "search", [1.02, 0.8, 0.61, 0.5])
    deaf = run("r", 1, "confirm:c", [1.02, 0.8, 0.61, 0.5])
    found = sweep_problem([cand, deaf], [])
    assert found is not None and found.key == "trainer"
    assert "trial c on seed 0 and its re-run on seed 1 reported the very same losses on " \
        "each of 4 steps" in found.why and "config['sweep']['seed']" in found.fix
    seeded = run("r", 1, "confirm:c", [1.03, 0.79, 0.6, 0.52])
    assert seed_ignored([cand, seeded]) is None
    short = run("r", 1, "confirm:c", [1.02, 0.8])  # two equal losses can be chance
    assert seed_ignored([cand, short]) is None
    probe = run("p", 0, "probe:c", [1.02, 0.8, 0.61, 0.5])  # the same seed on purpose
    assert seed_ignored([cand, probe]) is None


def test_an_objectives_baseline_far_below_every_trials_first_value_is_named():
    """``{metric: val_loss, mode: min, baseline: 0.1}`` for a 10-class cross-entropy that
    starts at 2.3: a config was handed over with gaps measured against 0.1."""
    from sweeps.rules.settings import RuleSettings
    from sweeps.spec.loader import Objective
    from sweeps.trial.knob_check import objective_baseline_off, sweep_problem

    def started(i: int, first: float) -> TrialRecord:
        rec = TrialRecord(trial_id=str(i), values={"lr": 0.01}, seed=0, role="search")
        rec.history = [{"step": 50, "val_loss": first}, {"step": 100, "val_loss": first / 2}]
        rec.finished, rec.status = True, "ok"
        return rec

    trials = [started(i, 2.28 + 0.01 * i) for i in range(3)]
    wrong = [Objective(metric="val_loss", mode="min", baseline=0.1)]
    found = sweep_problem(trials, ["val_loss"], RuleSettings(), wrong)
    assert found is not None and found.key == "objectives.0.baseline"
    assert "3 search trials first reported val_loss at 2.28 to 2.3, 10x its baseline 0.1" \
        in found.why
    right = [Objective(metric="val_loss", mode="min", baseline=2.3026)]
    assert objective_baseline_off(trials, right, 10.0) is None
    assert objective_baseline_off(trials[:2], wrong, 10.0) is None, "two are too few"
    acc = [Objective(metric="val_loss", mode="max", baseline=0.1)]
    assert objective_baseline_off(trials, acc, 10.0) is None, "a max objective: not judged"
