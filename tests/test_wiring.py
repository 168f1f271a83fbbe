"""Mistakes in how a trainer is wired to report and Monitor are named, not judged as
instability: a grad norm measured after zero_grad, gradients clipped to zero by the
trainer's own clip, a step reported once per micro-batch."""

from __future__ import annotations

import re

import pytest

from sweeps.commands.cli import main
from sweeps.trial.knob_check import sweep_problem
from sweeps.trial.wiring import ZERO_REPORTS, WiringWatch
from tests.conftest import edit_linreg, read_results_csv


def _given(reports: list[dict]) -> list[str]:
    watch, history, out = WiringWatch(), [], []
    for report in reports:
        history.append(report)
        out += [f"{w['warning'].split(':')[0]} @ {w['step']}" for w in watch.check(history)]
    return out


def test_each_wiring_warning_comes_once_on_the_report_where_it_shows():
    zero = [{"step": s, "loss": 1.0, "grad_norm": 0.0} for s in range(1, 12)]
    assert _given(zero) == [f"grad_norm was 0 on every report @ {ZERO_REPORTS}"]
    dead = [{**r, "dead_params": 2.0} for r in zero]  # Monitor saw gradients, all zero
    assert _given(dead) == [f"grad_norm was 0 on every report, with a gradient on the "
                            f"parameters each time @ {ZERO_REPORTS}"]
    measured = [{"step": 1, "grad_norm": 0.5}] + zero[1:]
    assert _given(measured) == [], "a measured gradient first: a dead net later, not wiring"
    twice = [{"step": s // 2, "grad_norm": 1.0} for s in range(2, 10)]
    assert _given(twice) == ["a step was reported again @ 1"]
    per_epoch = [{"step": s % 7, "loss": 1.0} for s in range(1, 20)]  # counter per epoch
    assert _given(per_epoch) == ["a step went backwards @ 0"]
    validation = [{"step": 10, "loss": 1.0, "grad_norm": 1.0}, {"step": 10, "val_loss": 1.0}]
    assert _given(validation) == [], "a validation report at the training step is fine"
    zeroed = [{"step": 1, "grad_norm": 1.0}, {"step": 2, "grad_norm": 1.0, "zeroed_grads": 1.0},
              {"step": 3, "grad_norm": 1.0, "zeroed_grads": 1.0}]
    assert _given(zeroed) == ["every gradient was zero at optimizer.step() although Monitor "
                              "measured them @ 2"]
    frozen = [{"step": s, "grad_norm": 1.0, "frozen_params": 16.0} for s in range(1, 5)]
    assert _given(frozen) == ["16 parameter tensor(s) the optimizer holds have "
                              "requires_grad=False, so they never train (a backbone frozen "
                              "by accident?) @ 1"]


def test_try_names_a_gradient_measured_after_zero_grad(linreg_dir, capsys, monkeypatch):
    monkeypatch.chdir(linreg_dir)
    code = main(["try", "linreg.yaml", "--set", "lr=0.05", "--set", "train.wiring=measure_late",
                 "--steps", "20"])
    out, err = (" ".join(text.split()) for text in capsys.readouterr())
    assert code == 2
    assert "error: trainer: grad_norm was 0 on every report" in err
    assert "fix: call monitor.measure after loss.backward(), before clipping and" in err
    assert "warning at step 5: grad_norm was 0 on every report" in out


def test_try_tells_a_dead_model_from_a_gradient_measured_after_zero_grad(linreg_dir, capsys,
                                                                        monkeypatch):
    """Every gradient there and exactly zero is a dead model: the message blamed wiring."""
    monkeypatch.chdir(linreg_dir)
    code = main(["try", "linreg.yaml", "--set", "lr=0.05", "--set", "train.wiring=dead",
                 "--steps", "20"])
    out, err = (" ".join(text.split()) for text in capsys.readouterr())
    assert code == 2
    assert "error: trainer: grad_norm was 0 on every report, with a gradient on the " \
           "parameters each time: the model is dead" in err
    assert "fix: check the model's initialisation" in err
    assert "warning at step 5: grad_norm was 0 on every report, with a gradient" in out


@pytest.mark.slow
def test_a_sweep_whose_gradients_are_never_measured_stops_and_exits_2(linreg_dir,
                                                                     ray_session, capsys,
                                                                     monkeypatch):
    edit_linreg(linreg_dir, name="unmeasured", train={"wiring": "measure_late"},
                budget={"trials": 8, "max_steps": 30, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 0, "lr_probe": 0})
    monkeypatch.chdir(linreg_dir)
    assert main(["run", "linreg.yaml", "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error: trainer: " in err and "search trials: grad_norm was 0 on every report" in err
    ran = re.search(r"results folder was removed \((\d+) trial\(s\) had run", err)
    assert ran is not None and int(ran.group(1)) < 8, "no further trial started once two " \
        "showed it"
    assert not (linreg_dir / "results" / "unmeasured").exists(), "nothing of it is kept"


@pytest.mark.slow
def test_a_step_reported_twice_is_a_warning_of_the_trial_and_the_run(linreg_dir, ray_session,
                                                                    capsys, monkeypatch):
    edit_linreg(linreg_dir, name="twice", train={"wiring": "report_twice"},
                search_space={"lr": {"type": "loguniform", "low": 0.02, "high": 0.1}},
                budget={"trials": 2, "max_steps": 20, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 0, "lr_probe": 0})
    monkeypatch.chdir(linreg_dir)
    assert main(["run", "linreg.yaml"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    trials = read_results_csv(linreg_dir / "results" / "twice" / "trials.csv")
    assert trials["warnings"].str.contains("a step was reported again").all()
    assert "2 trials (" in out and "a step was reported again" in out
    assert sweep_problem([], ["val_loss"]) is None


def test_an_unseeded_trainer_is_told_by_a_probe_that_started_elsewhere(linreg_dir):
    from sweeps.commands.run import unseeded_lines
    from sweeps.record.book import TrialBook
    from sweeps.spec.loader import load_sweep

    book = TrialBook(load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir))

    def ran(trial_id: str, first_loss: float, **config: object) -> None:
        for step, loss in ((1, first_loss), (2, first_loss / 2)):
            book.record(trial_id, {"step": step, "loss": loss,
                                   "config": {"lr": 0.05, "_seed": 0, **config}})
        book.finish(trial_id, {"done": True}, error=False)

    ran("cand", 0.4948)
    ran("probe", 0.4948, _role="probe:cand", _lr_scale=2.0)
    assert unseeded_lines(book) == [], "seeded: the probe starts where its candidate did"
    ran("other", 0.6334, _role="probe:cand", _lr_scale=2.0)
    line = " ".join(unseeded_lines(book))
    assert "trial cand and its LR probe other ran seed 0 and started at different losses" in line
    assert "torch.manual_seed(config['sweep']['seed'])" in line


def test_absent_gradients_name_a_detached_output_as_well_as_the_call_order():
    """A model whose output was detached before the loss has no gradient on any parameter,
    as a measure after zero_grad(): the message told a user whose calls were in order only
    to move them."""
    from sweeps.trial.wiring import zero_norm_cause

    problem, fix = zero_norm_cause([{"grad_norm": 0.0, "dead_params": 4.0,
                                     "grads_absent": 1.0}])
    assert ".detach()ed" in problem and "after optimizer.zero_grad()" in problem
    assert "without detaching it" in fix
