"""An LR probe holds once the rules' windows closed with no verdict, not at its last step."""

from __future__ import annotations

import math

import pytest

from sweeps.rules.settings import RuleSettings
from sweeps.trial import horizon
from sweeps.trial.reporter import TrialHeld, TrialReporter, TrialStopped


def _run(reporter: TrialReporter, steps: int, every: int = 1, nan_at: int | None = None
         ) -> int:
    """Report a falling loss every ``every`` steps up to ``steps``; the last step reported."""
    last = 0
    for step in range(every, steps + 1, every):
        loss = math.nan if nan_at is not None and step >= nan_at else 1.0 / step
        reporter({"step": step, "loss": loss, "grad_norm": 1.0, "lr": 1e-3})
        last = step
    return last


def test_hold_step_is_past_warmup_and_every_window_and_half_the_run():
    plain = RuleSettings()
    assert horizon.hold_step(plain, 300) == 150  # the windows close earlier: half the run
    late = RuleSettings(warmup_steps=120, baseline_loss=1.0, flat_patience=100)
    assert horizon.hold_step(late, 300) == 220  # warmup + flat_patience
    assert horizon.hold_step(late, 200) == 200  # never past the run's end
    collapse = RuleSettings(collapse_min_step=200, collapse_patience=20)
    assert horizon.settle_step(collapse) == 220  # a run that reports pred_std, or may
    assert horizon.settle_step(collapse, {"step", "loss", "pred_std", "target_std"}) == 220
    assert horizon.settle_step(collapse, {"step", "loss"}) == 40  # collapse cannot fire


def test_a_probe_that_holds_ends_at_its_hold_step():
    sink: list[dict] = []
    reporter = TrialReporter(RuleSettings(warmup_steps=10), sink.append, hold_max_steps=300)
    with pytest.raises(TrialHeld) as info:
        _run(reporter, 300)
    assert info.value.step == 150 and info.value.verdict is None
    assert isinstance(info.value, TrialStopped)  # a trainer's clean-up for a stop runs
    assert sink[-1]["step"] == 150 and sink[-1]["sweeps/status"] == "running"


def test_a_sparse_reporter_holds_only_once_the_windows_have_their_reports():
    settings = RuleSettings()
    need = horizon.settle_reports(settings)  # smoothing + divergence_patience = 40
    reporter = TrialReporter(settings, [].append, hold_max_steps=300)
    with pytest.raises(TrialHeld) as info:
        _run(reporter, 3000, every=10)
    assert info.value.step == 10 * need  # 40 reports, past half the run's 300 steps


def test_an_unstable_probe_fails_as_before_and_without_hold_runs_to_its_end():
    reporter = TrialReporter(RuleSettings(), [].append, hold_max_steps=300)
    with pytest.raises(TrialStopped) as info:
        _run(reporter, 300, nan_at=120)
    assert not isinstance(info.value, TrialHeld) and info.value.verdict.reason == "non_finite"
    assert _run(TrialReporter(RuleSettings(), [].append), 300) == 300


def test_a_run_that_is_diverging_slowly_does_not_hold():
    """Past every window but its loss gave back a third of its progress, rising slowly
    (no rule has fired yet): not quiet, so it runs on."""
    settings = RuleSettings()
    falling = [{"step": s, "loss": 1.0 - 0.008 * s, "grad_norm": 1.0} for s in range(1, 101)]
    rising = [{"step": s, "loss": 0.2 + 0.01 * (s - 100), "grad_norm": 1.0}
              for s in range(101, 131)]
    assert horizon.quiet(falling, settings)
    assert not horizon.quiet(falling + rising, settings)
    assert not horizon.holds_now(settings, 200, falling + rising, 130)
    assert horizon.holds_now(settings, 200, falling, 100)


def test_a_growing_grad_norm_is_not_quiet():
    settings = RuleSettings()
    flat = [{"step": s, "loss": 0.5, "grad_norm": 1.0} for s in range(1, 101)]
    growing = [{"step": s, "loss": 0.5, "grad_norm": 3.0} for s in range(101, 121)]
    assert horizon.quiet(flat, settings) and not horizon.quiet(flat + growing, settings)


def test_a_probe_on_a_slowly_diverging_run_runs_to_its_verdict():
    """The reporter keeps a brewing probe going: it ends on the rule's verdict."""
    reporter = TrialReporter(RuleSettings(), [].append, hold_max_steps=300)
    with pytest.raises(TrialStopped) as info:
        for step in range(1, 301):  # falls to step 120, then climbs ~3 % a step
            loss = 1.0 / step if step <= 120 else (1.0 / 120) * 1.03 ** (step - 120)
            reporter({"step": step, "loss": loss, "grad_norm": 1.0})
    assert not isinstance(info.value, TrialHeld)
    assert info.value.verdict.reason == "divergence" and info.value.verdict.step > 150


def test_a_run_whose_outputs_are_collapsed_now_does_not_hold():
    """The collapse rule gives a plateau five patiences: a probe sitting in one past its
    hold step has not held; once its outputs spread again it may."""
    settings = RuleSettings()
    learning = [{"step": s, "loss": 1.0 - 0.008 * s, "grad_norm": 1.0, "pred_std": 0.5,
                 "target_std": 1.0} for s in range(1, 101)]
    stuck = [dict(r, pred_std=0.005) for r in learning]
    assert horizon.holds_now(settings, 200, learning, 100)
    assert not horizon.quiet(stuck, settings)
    assert not horizon.holds_now(settings, 200, stuck, 100)


def test_collapsed_outputs_do_not_keep_a_probe_running_when_collapse_is_disabled():
    """A user who disabled ``collapse`` (a model whose outputs are legitimately narrow)
    gets probes that hold on the loss and grad norm alone."""
    learning = [{"step": s, "loss": 1.0 - 0.008 * s, "grad_norm": 1.0, "pred_std": 0.005,
                 "target_std": 1.0} for s in range(1, 101)]
    assert not horizon.quiet(learning, RuleSettings())
    disabled = RuleSettings(disabled=["collapse"])
    assert horizon.quiet(learning, disabled)
    assert horizon.holds_now(disabled, 200, learning, 100)


def test_a_probe_sitting_at_the_random_guess_does_not_hold_until_the_rule_can_tell():
    """An LR x 2 probe that learnt a little and fell back to the random guess at step 25:
    at its hold step (warmup + flat_patience) flat_at_baseline's window, counted from
    when the loss went flat, has not closed; the probe ran on to the verdict instead of
    holding as "ok, margin wide". A declared quality well above chance still holds."""
    settings = RuleSettings(baseline_loss=1.0986, flat_patience=100, warmup_steps=8)
    flat = [{"step": s, "loss": 1.05 if s < 25 else 1.0986, "grad_norm": 1.0}
            for s in range(1, 121)]
    assert not horizon.quiet(flat, settings)
    assert not horizon.holds_now(settings, 200, flat, 112)
    learning = [dict(r, loss=1.0986 - 0.005 * r["step"]) for r in flat]
    assert horizon.holds_now(settings, 200, learning, 112)
    stuck = [{"step": s, "loss": 1.0986, "grad_norm": 1.0} for s in range(1, 121)]
    assert not horizon.quiet(stuck, settings)
    accurate = settings.model_copy(update={"quality_metric": "acc", "quality_mode": "max",
                                           "quality_baseline": 0.333})
    assert horizon.quiet([*stuck[:-1], dict(stuck[-1], acc=0.9)], accurate)
    assert horizon.quiet(stuck, settings.model_copy(update={"disabled": ["flat_at_baseline"]}))


def test_two_chance_reads_of_an_accuracy_do_not_make_a_dead_network_hold():
    """A 10-class CNN dead at lr 0.23 (loss at ln 10, dead ReLUs) read val_acc 0.112 and
    0.100, whose mean passed the flat rule's margin above chance (0.1 + 0.05 x 0.1): its
    LR probe held, and the stability probe put the edge above it."""
    settings = RuleSettings(baseline_loss=2.3026, flat_patience=100, warmup_steps=8,
                            quality_metric="val_acc", quality_mode="max",
                            quality_baseline=0.1)
    dead = [{"step": s, "loss": 2.3026, "grad_norm": 0.1} for s in range(1, 121)]
    dead[59]["val_acc"], dead[119]["val_acc"] = 0.1123, 0.0996
    assert not horizon.quiet(dead, settings)
    learnt = [dict(r) for r in dead]
    learnt[59]["val_acc"], learnt[119]["val_acc"] = 0.35, 0.6
    assert horizon.quiet(learnt, settings)


def test_a_probe_at_the_labels_own_guess_does_not_hold_with_no_baseline_declared():
    """Unequal classes, no ``rules.baseline_loss``: the trainer reports label_entropy
    (1.61) and label_majority (0.365), and an LR too high sat at them from step 1. Its
    hold step counted no flat_at_baseline window (no baseline was declared) and it held
    at half its 200 steps, step 100, before the rule could fire at warmup 20 + patience
    100; the boundary probe then put the edge above it. It now runs to the verdict."""
    settings = RuleSettings(flat_patience=100, warmup_steps=20, quality_metric="val_acc",
                            quality_mode="max", quality_baseline=0.35)
    reporter = TrialReporter(settings, [].append, hold_max_steps=200)
    with pytest.raises(TrialStopped) as info:
        for step in range(1, 201):
            report = {"step": step, "loss": 1.61, "grad_norm": 0.5, "lr": 0.5,
                      "label_entropy": 1.61, "label_majority": 0.365}
            if step % 50 == 0:
                report["val_acc"] = 0.3647
            reporter(report)
    assert not isinstance(info.value, TrialHeld)
    assert info.value.verdict.reason == "flat_at_baseline" and info.value.verdict.step <= 125
