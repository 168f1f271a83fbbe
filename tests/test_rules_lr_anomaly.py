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


def torch_lrs(make, steps: int) -> list[float]:
    """The LR actually in the optimizer at each step, under a real torch scheduler."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
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
    assert verdict.evidence["ratio"] > 10
    assert first_firing(lrs(values), RuleSettings(allow_lr_restarts=True)) is None


def test_cosine_stepped_past_t_max_is_a_restart():
    values = torch_lrs(lambda o: sched.CosineAnnealingLR(o, T_max=300), 400)
    assert first_firing(lrs(values)).step == 301


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
