"""lr_anomaly: invalid LRs, a zero LR after warmup, unintended warm restarts."""

from __future__ import annotations

import math

import pytest
import torch
from torch.optim import lr_scheduler as sched

from sweeps.rules.lr_anomaly import check
from sweeps.rules.settings import RuleSettings

S = RuleSettings()


def lrs(values, start: int = 0) -> list[dict]:
    return [{"step": start + t, "lr": float(v)} for t, v in enumerate(values)]


def torch_lrs(make, steps: int, lr: float = 0.1) -> list[float]:
    """The LR actually in the optimizer at each step, under a real torch scheduler."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = make(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    return out


def first_firing(history: list[dict], settings: RuleSettings = S):
    for k in range(1, len(history) + 1):
        verdict = check(history[:k], settings)
        if verdict is not None:
            return verdict
    return None


def warmup_cosine(opt, warmup: int = 20, steps: int = 400):
    return sched.SequentialLR(
        opt,
        [sched.LambdaLR(opt, lambda t: t / warmup), sched.CosineAnnealingLR(opt, steps - warmup)],
        milestones=[warmup],
    )


def test_warm_restarts_fire_at_the_jump():
    values = torch_lrs(lambda o: sched.CosineAnnealingWarmRestarts(o, T_0=150), 400)
    verdict = first_firing(lrs(values))
    assert verdict.step == 150
    assert verdict.evidence["kind"] == "warm_restart"
    assert "rules.allow_lr_restarts: true" in verdict.evidence["hint"], "the fix, for sweeps try"
    assert verdict.evidence["ratio"] > 10
    assert first_firing(lrs(values), RuleSettings(allow_lr_restarts=True)) is None


def test_cosine_stepped_past_t_max_is_a_restart():
    values = torch_lrs(lambda o: sched.CosineAnnealingLR(o, T_max=300), 400)
    # once it rose by 1 % of its peak (RESTART_FLOOR): 16 steps past T_max
    assert first_firing(lrs(values)).step == 316


def test_a_rise_at_the_tail_of_a_one_cycle_is_no_restart():
    # the LR logged after the scheduler's last step: 1.2e-8 up to 3.9e-7 of a 3e-3 peak
    values = torch_lrs(lambda o: sched.OneCycleLR(o, max_lr=3e-3, total_steps=200), 200)
    tail = [*values, 3.9e-7]  # OneCycleLR's value one step past its end
    assert values[-1] < 3.9e-7 / 2
    assert first_firing(lrs(tail)) is None


@pytest.mark.parametrize("warmup_steps", [0, 20])
def test_warmup_then_cosine_is_fine(warmup_steps):
    values = torch_lrs(warmup_cosine, 401)  # ends exactly at 0
    assert values[0] == 0.0 and values[-1] < 1e-12
    assert first_firing(lrs(values), RuleSettings(warmup_steps=warmup_steps)) is None


@pytest.mark.parametrize(
    "make",
    [
        lambda o: sched.StepLR(o, step_size=100, gamma=0.3),
        lambda o: sched.ExponentialLR(o, gamma=0.99),
        lambda o: sched.OneCycleLR(o, max_lr=0.1, total_steps=500),
        lambda o: sched.LinearLR(o, start_factor=1.0, end_factor=0.0, total_iters=300),
        lambda o: sched.PolynomialLR(o, total_iters=300, power=2.0),
        lambda o: sched.ConstantLR(o, factor=1.0),
    ],
)
def test_ordinary_schedules_are_fine(make):
    assert first_firing(lrs(torch_lrs(make, 500))) is None


def test_a_constant_lr_with_float_noise_is_fine():
    values = [1e-3 * (1 + 1e-15 * (-1) ** t) for t in range(300)]
    assert first_firing(lrs(values)) is None


def test_zero_lr_after_warmup_fires():
    s = RuleSettings(warmup_steps=20)
    values = [0.1 * t / 20 for t in range(20)] + [0.0] * 30  # warmup, then nothing
    verdict = first_firing(lrs(values), s)
    assert verdict.step == 20 and verdict.evidence["kind"] == "zero_lr"
    dropped = [0.1] * 100 + [0.0]  # a scheduler change that zeroes a constant LR
    assert first_firing(lrs(dropped)).step == 100


def test_zero_lr_at_the_start_of_warmup_is_fine():
    values = torch_lrs(lambda o: sched.LambdaLR(o, lambda t: min(1.0, t / 20)), 100)
    assert values[0] == 0.0
    assert first_firing(lrs(values), RuleSettings(warmup_steps=20)) is None
    assert first_firing(lrs(values)) is None  # undeclared warmup: step 0 alone is fine


def test_an_lr_that_never_leaves_zero_fires():
    assert first_firing(lrs([0.0] * 50)).step == 1
    assert first_firing(lrs([0.0] * 50), RuleSettings(warmup_steps=10)).step == 10


@pytest.mark.parametrize(("peak", "fires"), [(0.02, False), (0.0201, True)])
def test_restart_factor_boundary(peak, fires):
    values = [0.1, 0.05, 0.02, 0.01, 0.01, peak]
    assert (check(lrs(values), S) is not None) is fires


def test_rises_during_warmup_are_not_judged():
    values = [0.1, 0.01, 0.05, 0.1] + [0.1] * 10  # a bumpy warmup
    assert first_firing(lrs(values), RuleSettings(warmup_steps=4)) is None
    assert first_firing(lrs(values)).step == 2


@pytest.mark.parametrize("bad", [-1e-3, math.nan, math.inf])
def test_invalid_lr_fires_at_any_step(bad):
    verdict = check(lrs([0.1, bad]), RuleSettings(warmup_steps=100))
    assert verdict.step == 1 and verdict.evidence["kind"] == "invalid_lr"


def test_missing_lr_is_not_judged():
    assert check([], S) is None
    assert check([{"step": 0, "loss": 1.0}], S) is None
    history = lrs([0.1, 0.01]) + [{"step": 2, "loss": 1.0}]
    assert check(history, S) is None
    assert check(history + [{"step": 3, "lr": 0.1}], S).step == 3


# -- climbs_past_lr: the LR rises past the trial's sampled lr ------------------------------

LR = 1e-3


def min_lr_cosine(lr: float, min_lr: float, warmup: int, steps: int) -> list[float]:
    """A trainer's own warmup + cosine from lr to an absolute min_lr (nanoGPT's get_lr)."""
    out = []
    for t in range(steps):
        if t < warmup:
            out.append(lr * (t + 1) / (warmup + 1))
        else:
            coeff = 0.5 * (1 + math.cos(math.pi * (t - warmup) / (steps - warmup)))
            out.append(min_lr + coeff * (lr - min_lr))
    return out


@pytest.mark.parametrize("warmup", [0, 20])
def test_a_min_lr_above_the_sampled_lr_fires_where_it_crosses(warmup):
    values = min_lr_cosine(LR, 0.01, warmup, 300)  # climbs 10x over the run
    settings = RuleSettings(sampled_lr=LR, warmup_steps=warmup)
    verdict = first_firing(lrs(values), settings)
    crossing = next(t for t, v in enumerate(values) if t >= warmup and v > 2 * LR)
    assert verdict.step == crossing
    ev = verdict.evidence
    assert ev["kind"] == "climbs_past_lr" and ev["sampled_lr"] == LR
    assert ev["reference"] == LR and ev["ratio"] > 2 and ev["step"] == crossing
    assert first_firing(lrs(values), settings.model_copy(update={"sampled_lr": None})) is None
    assert first_firing(lrs(values), RuleSettings(sampled_lr=LR, allow_lr_restarts=True)) is None


def test_one_cycle_up_to_the_sampled_lr_is_fine():
    values = torch_lrs(lambda o: sched.OneCycleLR(o, max_lr=LR, total_steps=300), 300, LR)
    assert max(values) / values[0] > 24  # climbs 25x, to the sampled lr
    assert first_firing(lrs(values), RuleSettings(sampled_lr=LR)) is None


def test_warmup_then_cosine_to_zero_is_fine_against_the_sampled_lr():
    values = torch_lrs(warmup_cosine, 401, LR)
    for warmup in (0, 20):
        assert first_firing(lrs(values), RuleSettings(sampled_lr=LR, warmup_steps=warmup)) is None


def test_a_trainer_scaling_the_lr_itself_after_warmup_is_fine():
    scaled = 4 * LR  # e.g. linear batch-size scaling, from the end of warmup on
    values = [scaled * t / 20 for t in range(20)] + [scaled] * 100 + \
        torch_lrs(lambda o: sched.CosineAnnealingLR(o, 200), 200, scaled)
    assert first_firing(lrs(values), RuleSettings(sampled_lr=LR, warmup_steps=20)) is None


def test_cosine_to_an_eta_min_below_the_lr_is_fine():
    values = torch_lrs(lambda o: sched.CosineAnnealingLR(o, T_max=300, eta_min=1e-4), 300, LR)
    assert first_firing(lrs(values), RuleSettings(sampled_lr=LR)) is None


@pytest.mark.parametrize(("lr", "fires"), [(2 * LR, False), (2.001 * LR, True)])
def test_climb_factor_boundary(lr, fires):
    history = lrs([LR] * 5 + [lr])
    assert (check(history, RuleSettings(sampled_lr=LR)) is not None) is fires


def test_the_bench_controls_lr_histories_do_not_fire_and_the_restart_still_does():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from planted import CONTROLS, _lr_at

    settings = RuleSettings(sampled_lr=0.05, warmup_steps=10)
    for case in CONTROLS:
        values = [_lr_at(case, t, 0.05, 10, 60, 400) for t in range(1, 401)]
        assert first_firing(lrs(values, start=1), settings) is None, case
    values = [_lr_at("restart", t, 0.05, 10, 60, 400) for t in range(1, 401)]
    assert first_firing(lrs(values, start=1), settings).evidence["kind"] == "warm_restart"


def test_a_schedule_compounding_every_step_fires_once_the_lr_stayed_gone():
    """A linear warmup over 100 steps, then ``MultiplicativeLR`` where ``LambdaLR`` was
    meant: a factor of 0.3 multiplied in on every step takes the LR from 0.01 to 3e-13
    in 20 steps and to 1e-55 by step 200; the rules used to excuse it as a decay to 0."""
    warm = 100
    history = lrs([0.01 * t / warm for t in range(warm + 1)]
                  + torch_lrs(lambda o: sched.MultiplicativeLR(o, lambda t: 0.3), 100, lr=0.01))
    verdict = first_firing(history, RuleSettings(warmup_steps=warm, sampled_lr=0.01))
    assert verdict is not None and verdict.evidence["kind"] == "vanished_lr"
    gone, peak_at = verdict.evidence["vanished_at_step"], verdict.evidence["peak_step"]
    assert peak_at == warm and gone == warm + 13  # 0.01 held a step, then 0.3 ** 12 < 1e-6
    assert verdict.step == gone + (gone - peak_at) + 1, "once gone longer than it fell"
    assert "MultiplicativeLR" in verdict.evidence["hint"]


@pytest.mark.parametrize("make", [
    lambda o: sched.CosineAnnealingLR(o, T_max=300),
    lambda o: sched.LinearLR(o, start_factor=1.0, end_factor=0.0, total_iters=300),
])
def test_a_decay_to_zero_at_the_end_of_the_run_is_not_vanished(make):
    assert first_firing(lrs(torch_lrs(make, 301)), RuleSettings(sampled_lr=0.1)) is None


def test_a_per_epoch_decay_stepped_per_batch_vanishes():
    """``ExponentialLR(gamma=0.9)`` meant per epoch, stepped per batch: under 1e-6 of the
    peak after 132 of 300 steps; called once it stayed there as long (step 265)."""
    history = lrs(torch_lrs(lambda o: sched.ExponentialLR(o, gamma=0.9), 301))
    verdict = first_firing(history, RuleSettings(sampled_lr=0.1))
    assert verdict.evidence["kind"] == "vanished_lr" and verdict.evidence["peak_step"] == 0
    assert verdict.evidence["vanished_at_step"] == 132 and verdict.step == 265


def test_a_step_decay_stepped_per_batch_reaches_zero_and_says_why():
    """``StepLR(step_size=2, gamma=0.5)`` meant per epoch, stepped per batch: the LR halves
    every 2 steps and is under 1e-12 at step 72, before ``vanished_lr`` could call it. It
    is ``zero_lr`` there, and the hint names the compounding schedule, not an abrupt drop."""
    history = lrs(torch_lrs(lambda o: sched.StepLR(o, step_size=2, gamma=0.5), 100, lr=0.05))
    verdict = first_firing(history)
    assert verdict.evidence["kind"] == "zero_lr" and verdict.step == 72
    assert "the LR fell from 0.05 to 7.28e-13 by step 72" in verdict.evidence["hint"]
    assert "StepLR or ExponentialLR stepped per batch" in verdict.evidence["hint"]
    abrupt = first_firing(lrs([0.1] * 30 + [0.0] * 5))
    assert abrupt.evidence["kind"] == "zero_lr" and "hint" not in abrupt.evidence


def test_a_warmup_stepped_per_epoch_is_still_rising_at_the_end_and_says_so(linreg_dir):
    """``scheduler.step()`` once per epoch of 40 steps under a 48-step warmup: the LR
    rises all run and ends at an eighth of the sampled lr; with epochs longer than the
    run, it sits at 1/48 of it from the first step. No rule stops either (they train); a
    run that ends ok carries ``lr_still_warming``. A warmup that ended, and a run
    with no warmup declared, do not."""
    from sweeps.protocol import FINAL_KEY, LR_STILL_WARMING, STATUS_KEY
    from sweeps.record.book import TrialBook
    from sweeps.spec.loader import load_sweep
    from tests.conftest import edit_linreg

    edit_linreg(linreg_dir, rules={"baseline_loss": 1.0, "warmup_steps": 48})
    book = TrialBook(load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir))
    lrs = {"per-epoch": lambda k: 0.25 * (k // 40 + 1) / 48,
           "long-epochs": lambda k: 0.25 / 48,  # no epoch ended: the LR never rose
           "per-step": lambda k: 0.25 * min(1.0, k / 48),
           "step-decay": lambda k: 0.25 * min(1.0, k / 48) * (0.1 if k > 100 else 1.0)}
    for name, lr in lrs.items():
        for k in range(1, 201):
            book.record(name, {"step": k, "loss": 1 / k, "lr": lr(k), "config": {"lr": 0.25}})
        book.record(name, {"step": 200, "loss": 0.005, "lr": lr(200), "config": {"lr": 0.25},
                           STATUS_KEY: "ok", FINAL_KEY: 1})
    # a per-epoch warmup whose one epoch ended mid-run, each 50th step a validation
    # report with no LR, the last of them at the run's end (Lightning's val_check_interval)
    for k in range(1, 201):
        book.record("val-reports", {"step": k, "loss": 1 / k, "lr": 0.25 * (k // 156 + 1) / 48,
                                    "config": {"lr": 0.25}})
        if k % 50 == 0:
            book.record("val-reports", {"step": k, "val_loss": 1 / k, "config": {"lr": 0.25}})
    book.record("val-reports", {"step": 200, "val_loss": 0.005, "config": {"lr": 0.25},
                                STATUS_KEY: "ok", FINAL_KEY: 1})
    late = book.trials["val-reports"].warnings
    assert len(late) == 1 and "lr 0.0104 at step 200, 4% of the sampled 0.25, up from " \
        "0.00521 at step 96" in late[0]
    warned = book.trials["per-epoch"].warnings
    assert len(warned) == 1 and warned[0].startswith(LR_STILL_WARMING)
    assert "lr 0.0312 at step 200, 12% of the sampled 0.25, up from 0.0156 at step 96" \
        in warned[0]
    held = book.trials["long-epochs"].warnings
    assert len(held) == 1 and held[0].startswith(LR_STILL_WARMING)
    assert "lr 0.00521 at step 200, 2% of the sampled 0.25, where it was on every report: " \
        "a warmup of 48 steps never raised it" in held[0]
    assert book.trials["per-step"].warnings == [] == book.trials["step-decay"].warnings
    assert book.trials["per-epoch"].status == "ok"


@pytest.mark.parametrize("warm", [0, 40])
def test_a_compounding_schedule_vanishes_in_a_sweep_without_an_lr_knob(warm):
    """No ``sampled_lr`` (the sweep has no lr knob): the cheap first look measures the LR
    against the end of warmup, the window and a sample of the history, so a warmup the
    trainer runs itself (none declared) and one declared both still get caught."""
    ramp = [0.01 * t / 40 for t in range(41)]
    slow = torch_lrs(lambda o: sched.MultiplicativeLR(o, lambda t: 0.95), 800, lr=0.01)
    history = lrs(ramp + slow)  # under 1e-6 of the peak after 270 steps: past the window
    verdict = first_firing(history, RuleSettings(warmup_steps=warm))
    assert verdict is not None and verdict.evidence["kind"] == "vanished_lr"
    assert verdict.evidence["peak_step"] in (40, 41)


def test_a_long_decay_to_zero_without_an_lr_knob_is_not_vanished():
    history = lrs(torch_lrs(lambda o: sched.CosineAnnealingLR(o, T_max=3000), 3001))
    assert first_firing(history, RuleSettings()) is None
