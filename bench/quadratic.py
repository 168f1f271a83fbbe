"""A quadratic whose LR stability boundary is known exactly (``bench/boundary.py``).

Loss 0.5·Σ λ_i·x_i² over ``quad.dim`` coordinates, λ_i log-spaced from
``quad.lam / quad.spread`` up to ``quad.lam`` (so λ_max = ``quad.lam``), full-batch
gradient descent from x_0 ~ N(0, 1) drawn from the trial seed. Each coordinate
evolves as x ← (1 − lr·λ_i)·x, so the run diverges iff lr > 2/λ_max: exactly the
boundary. Reports ``step``, ``loss``, ``grad_norm`` and ``lr`` every step.

``loss_closure(config)`` is the sharpness hook of ``sweeps stability --probe``: the start
point x_0 and the loss as a closure, no optimizer (plain GD), so the probe's predicted
boundary is 2/λ_max, exact here.

    sweeps try <a sweep file with trainer: quadratic:train, bench/ on the path> --set lr=0.5
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _problem(config: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The curvatures λ_i and the start point x_0 (from the trial seed)."""
    q, run = config["quad"], config.get("sweep", {})
    lam, dim = float(q["lam"]), int(q.get("dim", 8))
    lams = lam / float(q.get("spread", 100.0)) ** torch.linspace(1, 0, dim, dtype=torch.float64)
    x = torch.randn(dim, generator=torch.Generator().manual_seed(int(run.get("seed", 0))),
                    dtype=torch.float64)
    return lams, x


def loss_closure(config: dict[str, Any]) -> tuple[list[torch.Tensor], Callable[[], torch.Tensor]]:
    """(params, closure) at the start of training: the loss 0.5·Σ λ_i·x_i² at x_0."""
    lams, x = _problem(config)
    x.requires_grad_(True)
    return [x], lambda: 0.5 * (lams * x * x).sum()


def train(config: dict[str, Any], report: Callable[[dict[str, Any]], None]) -> None:
    q = config["quad"]
    run = config.get("sweep", {})
    steps = int(run.get("max_steps", q.get("steps", 200)))
    lr = float(q["lr"])
    lams, x = _problem(config)
    for step in range(1, steps + 1):
        grad = lams * x
        loss = 0.5 * float((lams * x * x).sum())
        report({"step": step, "loss": loss, "grad_norm": float(grad.norm()), "lr": lr})
        x = x - lr * grad
