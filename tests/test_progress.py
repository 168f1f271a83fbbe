"""The progress view: plain lines off a terminal, a live panel on one."""

from __future__ import annotations

import io
import math
from types import SimpleNamespace

import yaml
from rich.console import Console

from sweeps.record.book import TrialBook
from sweeps.spec.loader import load_sweep
from sweeps.tune.callbacks import TrialEvents
from sweeps.tune.progress import ProgressLines
from tests.conftest import edit_linreg


def _trial(trial_id, lr, steps, val, reason=None):
    history = [{"step": s, "loss": 1.0 / s} for s in range(1, steps + 1)]
    history[-1]["val_loss"] = val
    last = {**history[-1], "config": {"lr": lr}}
    if reason:
        last.update({"sweeps/status": "unstable", "sweeps/reason": reason,
                     "sweeps/stop_step": steps, "sweeps/evidence": "{}"})
    else:
        last.update({"sweeps/status": "ok", "sweeps/final": 1})
    return SimpleNamespace(trial_id=trial_id, last_result=last, status="TERMINATED",
                           history=history)


def _feed(progress, book, trial):
    progress.on_trial_result(0, [], trial, trial.last_result)
    final = trial.last_result.get("sweeps/final")
    for h in trial.history if final else trial.history[:-1]:
        book.record(trial.trial_id, {**h, "config": trial.last_result["config"]})
    book.record(trial.trial_id, trial.last_result)
    TrialEvents(book).on_trial_complete(0, [], trial)  # Ray Tune calls it first: it closes
    progress.on_trial_complete(0, [], trial)


def test_plain_lines_with_tally_and_best(linreg_dir):
    book = TrialBook(load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir))
    out = io.StringIO()
    progress = ProgressLines(book, 3, console=Console(file=out, width=200))
    _feed(progress, book, _trial("a", 0.1, 20, 0.5))
    _feed(progress, book, _trial("b", 20.0, 4, float("nan"), reason="non_finite"))
    _feed(progress, book, _trial("c", 0.05, 20, 0.2))
    text = out.getvalue()
    assert "[2/3] b unstable (non_finite @ 4)  lr=20" in text
    assert "best val_loss 0.2 (c)" in text
    assert "non_finite 1, ok 2" in text and "s left with confirmation" in text


def test_live_panel_on_a_terminal(linreg_dir):
    book = TrialBook(load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir))
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True)
    progress = ProgressLines(book, 2, console=console)
    progress.on_step_end(0, [SimpleNamespace(status="RUNNING")] * 2)
    _feed(progress, book, _trial("a", 0.1, 20, 0.5))
    progress.on_experiment_end([])
    text = out.getvalue()
    assert "1/2 done" in text and "best so far" in text and "val_loss 0.5 (a)" in text


def test_step_budget_counts_steps(linreg_dir):
    edit_linreg(linreg_dir, budget={"total_steps": 100}, confirm={"seeds": 0, "lr_probe": 0})
    data = yaml.safe_load((linreg_dir / "linreg.yaml").read_text())
    del data["budget"]["trials"]
    (linreg_dir / "linreg.yaml").write_text(yaml.safe_dump(data))
    book = TrialBook(load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir))
    assert book.sweep.spec.budget.trial_cap is None
    out = io.StringIO()
    progress = ProgressLines(book, None, console=Console(file=out, width=200))
    _feed(progress, book, _trial("a", 0.1, 20, 0.5))
    _feed(progress, book, _trial("b", 20.0, 5, float("nan"), reason="non_finite"))
    text = out.getvalue()
    assert "[2 done, 25/100 steps] b unstable (non_finite @ 5)" in text
    assert book.steps_spent() == 25


def test_time_left_ignores_start_up_and_counts_confirmation(linreg_dir):
    """Ray's start-up is not spread over what is left, no estimate is shown before as
    many trials finished as run at once (budget.concurrent: 2 here), and the steps
    confirmation keeps back are part of what is left."""
    book = TrialBook(load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir))
    progress = ProgressLines(book, 10, console=Console(file=io.StringIO(), width=200))
    progress.start, progress.first_result = 0.0, 30.0  # 30 s to start Ray and the trainer
    _feed(progress, book, _trial("a", 0.1, 20, 0.5))
    assert math.isnan(progress.eta(now=40.0)[1])
    _feed(progress, book, _trial("b", 0.05, 20, 0.4))
    # 40 steps in 10 s of training: 0.25 s a step; 8 more trials of ~20 steps, and
    # confirmation's 3 x (1 seed + 1 probe) + the base config's run on the fresh seed,
    # 60 steps each
    assert book.sweep.confirm_steps == 7 * 60
    elapsed, left = progress.eta(now=40.0)
    assert elapsed == 40.0 and left == 0.25 * (8 * 20 + 7 * 60)
    # fragile candidates cost one more round: 3 candidates x (1 seed + 1 probe) x 60 steps
    assert progress.fragile_extra(now=40.0) == 0.25 * 3 * 2 * 60
    assert progress.time_text(now=40.0).endswith(
        "~145s left with confirmation (+~90s if candidates prove fragile)")


def test_trials_still_running_count_as_at_least_as_long_as_they_ran(linreg_dir):
    """The first trials to finish are the short ones: with two finished at 20 steps and two
    still running past them, the rest of the search is not taken to be 20-step trials."""
    book = TrialBook(load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir))
    progress = ProgressLines(book, 10, console=Console(file=io.StringIO(), width=200))
    progress.start, progress.first_result = 0.0, 30.0
    _feed(progress, book, _trial("a", 0.1, 20, 0.5))
    _feed(progress, book, _trial("b", 0.05, 20, 0.4))
    short = progress.search_steps_left()
    assert short == 8 * 20  # all finished, none running: the finished mean
    for trial_id in ("c", "d"):
        for step in range(1, 41):
            book.record(trial_id, {"step": step, "loss": 1.0 / step, "config": {"lr": 0.01}})
    # half the trials got past step 20: the Kaplan-Meier mean is 20 + 0.5 * (60 - 20) = 40
    # steps a trial, for the 8 unfinished, less the 80 the running two already ran
    assert progress.search_steps_left() == 8 * 40 - 80 > short


def test_a_step_budget_bounds_the_extra_confirmation_round(linreg_dir):
    """With ``budget.total_steps`` a later confirmation round only takes what is left of
    it: a budget the search and the first round spend leaves no extra time to tell."""
    edit_linreg(linreg_dir, budget={"total_steps": 1000})
    data = yaml.safe_load((linreg_dir / "linreg.yaml").read_text())
    del data["budget"]["trials"]
    (linreg_dir / "linreg.yaml").write_text(yaml.safe_dump(data))
    book = TrialBook(load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir))
    progress = ProgressLines(book, None, console=Console(file=io.StringIO(), width=200))
    progress.start, progress.first_result = 0.0, 30.0
    _feed(progress, book, _trial("a", 0.1, 20, 0.5))
    _feed(progress, book, _trial("b", 0.05, 20, 0.4))
    assert progress.fragile_extra(now=40.0) == 0.0
    assert "prove fragile" not in progress.time_text(now=40.0)


def test_a_confirmation_stage_tells_its_own_time_left(linreg_dir):
    """A confirmation stage runs fixed full-length re-runs: its time left is its own runs
    still to go, and the line names the stage."""
    book = TrialBook(load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir))
    out = io.StringIO()
    progress = ProgressLines(book, 4, console=Console(file=out, width=200), stage="confirm-2")
    progress.start, progress.first_result = 0.0, 20.0
    _feed(progress, book, _trial("a", 0.1, 20, 0.5))
    elapsed, left = progress.eta(now=30.0)  # 1 run in 10 s of training: 3 more in 30 s
    assert elapsed == 30.0 and left == 30.0
    assert "confirm-2: elapsed" in out.getvalue() and "left in this stage" in out.getvalue()
    rerun = _trial("r2", 0.1, 20, 0.3)  # a fresh seed of candidate c1: named by c1
    rerun.last_result["config"].update({"_role": "confirm:c1", "_seed": 2})
    _feed(progress, book, rerun)
    assert "best fresh-seed run val_loss 0.3 (c1, seed 2)" in out.getvalue()
    probe = _trial("p1", 0.2, 20, 0.1)  # the LR x 2 probe of c1: not a config's result
    probe.last_result["config"].update({"_role": "probe:c1", "_seed": 0, "_lr_scale": 2.0})
    _feed(progress, book, probe)
    assert "(c1, seed 0)" not in out.getvalue()
    base = _trial("b3", 0.1, 20, 0.35)  # the base config's own values on a fresh seed
    base.last_result["config"].update({"_role": "base", "_seed": 3})
    _feed(progress, book, base)
    lines = " ".join(out.getvalue().split())  # each re-run's line says what it is
    assert "r2 (c1 on seed 2) ok" in lines and "p1 (c1 at LR x2, seed 0) ok" in lines
    assert "b3 (your base config, seed 3) ok" in lines


def test_a_stability_grid_counts_its_cells_with_their_seeds(linreg_dir):
    """``sweeps stability``'s runs are cells of its grid, each counted and named with its
    seed, not the search race's re-runs."""
    book = TrialBook(load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir))
    out = io.StringIO()
    progress = ProgressLines(book, 2, console=Console(file=out, width=200), stage="stability")
    for trial_id, seed in (("s0", 0), ("s1", 1)):
        cell = _trial(trial_id, 0.1, 20, 0.4 + seed / 10)
        cell.last_result["config"].update({"_role": "stability", "_seed": seed})
        _feed(progress, book, cell)
    text = out.getvalue()
    assert "[1/2] s0 ok  lr=0.1 seed 0" in text and "[2/2] s1 ok  lr=0.1 seed 1" in text
    assert "race" not in text and "stability: elapsed" in text
    assert "best val_loss 0.4 (s0)" in text


def test_a_resumed_sweep_counts_on_and_prints_no_trial_twice(linreg_dir, capsys):
    """Ray Tune restores the callback as it was saved and tells it again of a trial that
    finished after that save: the count goes on from what the book holds."""
    import pickle

    from sweeps.record.book import books_of, open_book

    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir)
    with books_of(sweep):
        book = open_book(sweep)
        progress = ProgressLines(book, 4, console=Console(file=io.StringIO(), width=200))
        saved = pickle.dumps(progress)  # Ray Tune's saved state, before any trial finished
        _feed(progress, book, _trial("a", 0.1, 20, 0.5))
        _feed(progress, book, _trial("b", 0.05, 20, 0.2))
        restored = pickle.loads(saved)  # the driver died and `sweeps resume` restores it
        capsys.readouterr()
        restored.on_trial_complete(0, [], SimpleNamespace(trial_id="b"))  # told again
        _feed(restored, book, _trial("c", 0.2, 20, 0.3))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("[")]
    assert len(lines) == 1 and lines[0].startswith("[3/4] c ok"), err
    assert "best val_loss 0.2 (b)" in err


def test_a_resumed_sweep_times_only_the_steps_it_ran_itself(linreg_dir):
    """After ``sweeps resume`` the time left came out 4-20x too short: the steps run before
    the interrupt were divided into the resumed driver's training time."""
    import pickle

    from sweeps.record.book import books_of, open_book

    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir)
    with books_of(sweep):
        book = open_book(sweep)
        progress = ProgressLines(book, 4, console=Console(file=io.StringIO(), width=200))
        saved = pickle.dumps(progress)
        _feed(progress, book, _trial("a", 0.1, 20, 0.5))
        _feed(progress, book, _trial("b", 0.05, 20, 0.4))  # 40 steps before the interrupt
        restored = pickle.loads(saved)
        for t in (_trial("c", 0.2, 20, 0.3), _trial("d", 0.3, 20, 0.35)):
            _feed(restored, book, t)
            restored.first_result = 0.0  # set at its first result: training began at 0
    # 40 steps of its own in 10 s: 0.25 s a step, for the race's 7 x 60 steps still to run
    assert book.sweep.confirm_steps == 7 * 60
    assert restored.eta(now=10.0)[1] == 0.25 * 7 * 60
