"""Smith's LR range test (fastai ``lr_find``, torch-lr-finder) through a trainer's
``loss_closure``: the cheap alternative the boundary probe is benchmarked against.

From the parameters as training starts, ``steps`` optimizer steps with the LR rising
exponentially from ``low`` to ``high`` (step i uses ``low·(high/low)^(i/(steps-1))``), each
on a fresh batch (``closure(i)`` when the closure takes a batch index, as the bench's
trainers' closures do; else the one fixed batch), the trainer's own optimizer and its
grad clip. The loss is smoothed as fastai does (EMA, β = 0.98, bias-corrected).

**The rule** (fastai's stop criterion, read as the boundary): the answer is the LR of the
first step whose smoothed loss exceeds ``diverge`` (4) × the smallest smoothed loss so
far, or whose loss is not finite; the test stops there. ``min_x10`` is the other common
reading, 10 × the LR at the smallest smoothed loss (what a user would call "where the
loss turns up"). When the loss never exceeds 4× its minimum, ``answer`` is None (the
range's top held as far as this test can tell) and ``min_x10`` is still given.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: Steps of the test (fastai's and torch-lr-finder's default is 100).
STEPS = 100
#: The smoothed loss above this × its minimum ends the test: the answer.
DIVERGE = 4.0
#: fastai's smoothing of the loss.
BETA = 0.98


@dataclass
class RangeTest:
    """One test: the LR and (smoothed) loss of every step run, and the readings."""

    lrs: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    smoothed: list[float] = field(default_factory=list)
    #: The LR where the smoothed loss first exceeded DIVERGE × its minimum (None: never).
    answer: float | None = None
    #: 10 × the LR at the smallest smoothed loss.
    min_x10: float | None = None
    fresh_batches: bool = True

    @property
    def steps(self) -> int:
        return len(self.losses)

    def as_dict(self) -> dict[str, Any]:
        return {"answer": self.answer, "min_x10": self.min_x10, "steps": self.steps,
                "fresh_batches": self.fresh_batches, "lrs": self.lrs, "losses": self.losses,
                "smoothed": self.smoothed}


def takes_batch(closure: Callable[..., torch.Tensor]) -> bool:
    """Whether ``closure`` accepts a batch index (the bench trainers' extension)."""
    try:
        return len(inspect.signature(closure).parameters) >= 1
    except (TypeError, ValueError):
        return False


def lr_range_test(params: Sequence[torch.Tensor], closure: Callable[..., torch.Tensor],
                  optimizer: torch.optim.Optimizer | None, low: float, high: float, *,
                  steps: int = STEPS, diverge: float = DIVERGE, beta: float = BETA,
                  grad_clip: float | None = None) -> RangeTest:
    """Run the test on ``params`` (they move) with ``optimizer`` (None: plain SGD on
    ``params``); ``grad_clip`` clips the total gradient norm before each step as the
    trainer does. The global torch RNG is left as it was."""
    params = [p for p in params if p.requires_grad]
    opt = optimizer if optimizer is not None else torch.optim.SGD(params, lr=low)
    fresh = takes_batch(closure)
    out = RangeTest(fresh_batches=fresh)
    avg, best, best_lr = 0.0, math.inf, low
    with torch.random.fork_rng(devices=[]):
        for i in range(steps):
            lr = low * (high / low) ** (i / max(1, steps - 1))
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad()
            loss = closure(i) if fresh else closure()
            value = float(loss.detach())
            out.lrs.append(lr)
            out.losses.append(value)
            if not math.isfinite(value):
                out.smoothed.append(value)
                out.answer = lr
                break
            avg = beta * avg + (1 - beta) * value
            smooth = avg / (1 - beta ** (i + 1))
            out.smoothed.append(smooth)
            if smooth < best:
                best, best_lr = smooth, lr
            if i > 0 and smooth > diverge * best:
                out.answer = lr
                break
            loss.backward()
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            opt.step()
    opt.zero_grad()
    out.min_x10 = 10 * best_lr
    return out


def off(value: float | None, low: float | None, high: float | None) -> float | None:
    """How far ``value`` lies outside ``[low, high]`` as a factor: ``value/high`` above it,
    ``value/low`` below it (< 1), 1.0 inside; None when any is missing."""
    if value is None or low is None or high is None:
        return None
    if value > high:
        return value / high
    if value < low:
        return value / low
    return 1.0
