"""The sharpness estimate that seeds the boundary probe: the largest Hessian eigenvalue at
the base config, turned into a predicted LR boundary.

A trainer module may define ``loss_closure(config)`` (:data:`HOOK`) returning
``(params, closure)`` or ``(params, closure, optimizer)``: the model's parameters as
training starts, a closure that returns the training loss on one fixed batch as a scalar
tensor (the same value on every call), and the optimizer the trainer would build for them.
:func:`estimate` runs power iteration (in Lanczos' form, :func:`top_eigenvalue`) with
Hessian-vector products (double backward), at most 20 of them, and predicts:

- SGD (or no optimizer: plain GD): ``(2 + 2μ) / ((1 - d)·λ_max)`` with momentum ``μ``
  and dampening ``d``, ``(2 + 2μ) / ((1 + 2μ)·λ_max)`` with Nesterov: ``2/λ_max`` without
  momentum, exact on a quadratic;
- Adam / AdamW: the preconditioned sharpness ``λ_P = λ_max(P⁻¹H)`` with
  ``P = diag(sqrt(v̂) + eps)`` after a few Adam steps on the fixed batch (Cohen et al. 2022,
  *Adaptive gradient methods at the edge of stability*), ``(2 + 2β1) / ((1 - β1)·λ_P)``,
  ``38/λ_P`` at ``β1 = 0.9``.

L2 weight decay (SGD's and Adam's ``weight_decay``) adds ``weight_decay·I`` to ``H``;
AdamW's decoupled decay is left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

#: The optional trainer-module function that makes the estimate possible.
HOOK = "loss_closure"
#: Hessian-vector products at most (it stops earlier once the estimate settles).
ITERATIONS = 20
#: Adam steps taken on the fixed batch before P is read.
ADAM_STEPS = 5
#: Relative change between iterations at which power iteration stops.
TOLERANCE = 1e-6
#: The Adam-type optimizers (their boundary comes from the preconditioned sharpness).
ADAMS = ("Adam", "AdamW")

Vec = list[torch.Tensor]


@dataclass(frozen=True)
class Sharpness:
    """An estimate: the (preconditioned) top eigenvalue, the optimizer it was read for,
    the predicted boundary LR and the formula that gave it."""

    lam: float
    optimizer: str
    predicted: float
    formula: str
    iterations: int
    adam_steps: int = 0

    @property
    def exact(self) -> bool:
        """Whether the prediction is sharp enough to bracket by 1.25 from it: the SGD /
        GD one (exact on a quadratic). The Adam one, read at initialisation, lay 2–24×
        below the edge on the benchmark's networks (docs/stability.md), so the bracket
        steps ×4 from it."""
        return self.optimizer not in ADAMS

    def as_dict(self) -> dict[str, Any]:
        return {"lambda_max": self.lam, "optimizer": self.optimizer,
                "predicted": self.predicted, "formula": self.formula,
                "iterations": self.iterations, "adam_steps": self.adam_steps}

    def line(self, name: str = "lr") -> str:
        """One line of text: what was measured and the prediction."""
        where = (f"λ_P {self.lam:.4g} after {self.adam_steps} {self.optimizer} steps from the base "
                 "config" if self.optimizer in ADAMS else
                 f"λ_max {self.lam:.4g} at the base config ({self.optimizer})")
        return (f"predicted: {name} {self.predicted:.4g} = {self.formula} with {where}, "
                f"{self.iterations} Hessian-vector products; the bracket starts there")


def _dot(a: Vec, b: Vec) -> torch.Tensor:
    return sum((x * y).sum() for x, y in zip(a, b, strict=True))  # type: ignore[return-value]


def top_eigenvalue(hvp: Callable[[Vec], Vec], like: Sequence[torch.Tensor], *,
                   iters: int = ITERATIONS, seed: int = 0,
                   tol: float = TOLERANCE) -> tuple[float, int]:
    """The largest (algebraic) eigenvalue of the symmetric operator ``hvp`` on tensors
    shaped as ``like``, and the products used: power iteration from a seeded random vector
    with Lanczos' three-term recurrence (the top eigenvalue of the tridiagonal matrix of
    the iterates' Rayleigh quotients), which needs no more products or memory than plain
    power iteration (three vectors) but resolves a top eigenvalue close to the next ones,
    and gives the largest *positive* curvature at a saddle. Stops when it changes by less
    than ``tol`` (relative)."""
    gen = torch.Generator().manual_seed(seed)
    v = [torch.randn(t.shape, generator=gen, dtype=t.dtype).to(t.device) for t in like]
    norm = torch.sqrt(_dot(v, v))
    v = [x / norm for x in v]
    prev: Vec = [torch.zeros_like(x) for x in v]
    alphas: list[float] = []
    betas: list[float] = []
    top, done = float("nan"), 0
    for done in range(1, iters + 1):
        w = hvp(v)
        alpha = float(_dot(v, w))
        beta_prev = betas[-1] if betas else 0.0
        w = [a - alpha * x - beta_prev * y for a, x, y in zip(w, v, prev, strict=True)]
        alphas.append(alpha)
        new = _ritz_top(alphas, betas)
        settled = done > 1 and abs(new - top) <= tol * abs(new)
        top = new
        beta = float(torch.sqrt(_dot(w, w)))
        if settled or not math.isfinite(beta) or beta <= 1e-12 * max(abs(new), 1e-30):
            break
        betas.append(beta)
        prev, v = v, [x / beta for x in w]
    return top, done


def _ritz_top(alphas: list[float], betas: list[float]) -> float:
    """The largest eigenvalue of the tridiagonal matrix with ``alphas`` on the diagonal
    and ``betas`` beside it."""
    if not all(math.isfinite(x) for x in (*alphas, *betas)):
        return float("nan")
    n = len(alphas)
    t = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if n > 1:
        off = torch.tensor(betas[:n - 1], dtype=torch.float64)
        t += torch.diag(off, 1) + torch.diag(off, -1)
    return float(torch.linalg.eigvalsh(t)[-1])


def hessian_vp(params: Sequence[torch.Tensor], closure: Callable[[], torch.Tensor],
               weight_decay: float = 0.0) -> tuple[Callable[[Vec], Vec], Vec]:
    """``v -> (H + weight_decay·I)·v`` at ``params`` for the loss of ``closure`` (one
    forward and backward with ``create_graph``, then one double backward per product), and
    the parameters it acts on (those whose gradient depends on the parameters)."""
    loss = closure()
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ValueError(f"the closure returned {type(loss).__name__}, not a scalar tensor")
    grads = torch.autograd.grad(loss, list(params), create_graph=True, allow_unused=True)
    pairs = [(p, g) for p, g in zip(params, grads, strict=True)
             if g is not None and g.requires_grad]
    if not pairs:
        raise ValueError("the loss has no curvature in the parameters (every gradient is "
                         "constant or unused)")
    ps, gs = [p for p, _ in pairs], [g for _, g in pairs]

    def hvp(v: Vec) -> Vec:
        out = torch.autograd.grad(gs, ps, grad_outputs=v, retain_graph=True, allow_unused=True)
        return [(torch.zeros_like(p) if h is None else h.detach()) + weight_decay * x
                for p, h, x in zip(ps, out, v, strict=True)]

    return hvp, ps


def _adam_preconditioner(params: Sequence[torch.Tensor], closure: Callable[[], torch.Tensor],
                         opt: torch.optim.Optimizer, steps: int) -> dict[int, torch.Tensor]:
    """``sqrt(v̂) + eps`` per parameter after ``steps`` steps of ``opt`` on the closure's
    batch (the parameters move: λ_P is read at the iterate reached, as Cohen et al. do);
    infinite where ``v̂`` is 0, so such a coordinate drops out of ``P^-1/2 H P^-1/2``."""
    for _ in range(steps):
        opt.zero_grad()
        closure().backward()
        opt.step()
    opt.zero_grad()
    out = {}
    for group in opt.param_groups:
        beta2, eps = group["betas"][1], group["eps"]
        for p in group["params"]:
            state = opt.state.get(p, {})
            if "exp_avg_sq" not in state:
                continue
            step = float(state["step"])
            v_hat = state["exp_avg_sq"] / (1 - beta2 ** step)
            # a coordinate that saw no gradient does not move under Adam: left out of P⁻¹H
            # (else eps alone scales it and weight_decay / eps swamps λ_P)
            out[id(p)] = torch.where(v_hat > 0, v_hat.sqrt() + eps,
                                     torch.full_like(v_hat, math.inf))
    return out


def _group(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's one set of hyperparameters (all its groups must agree)."""
    keys = ("momentum", "dampening", "nesterov", "betas", "eps", "weight_decay")
    first = {k: opt.param_groups[0].get(k) for k in keys}
    for g in opt.param_groups[1:]:
        if {k: g.get(k) for k in keys} != first:
            raise ValueError("the optimizer's parameter groups differ in "
                             "momentum/betas/eps/weight_decay: one prediction cannot hold "
                             "for all")
    return first


def estimate(params: Iterable[torch.Tensor], closure: Callable[[], torch.Tensor],
             optimizer: torch.optim.Optimizer | None = None, *, iters: int = ITERATIONS,
             seed: int = 0, adam_steps: int = ADAM_STEPS) -> Sharpness:
    """The sharpness at ``params`` and the LR boundary it predicts for ``optimizer``
    (None: plain gradient descent). ValueError for an optimizer other than SGD, Adam or
    AdamW, a closure that is not a scalar loss, or a loss with no positive curvature.
    The global torch RNG is left as it was."""
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("no parameter requires grad")
    kind = "GD" if optimizer is None else type(optimizer).__name__
    if kind not in ("GD", "SGD", *ADAMS):
        raise ValueError(f"the estimate knows SGD, Adam and AdamW, not {kind}")
    h = _group(optimizer) if optimizer is not None else {}
    decay = float(h.get("weight_decay") or 0.0) if kind != "AdamW" else 0.0
    with torch.random.fork_rng(devices=[]):
        if kind in ADAMS:
            assert optimizer is not None
            scale = _adam_preconditioner(params, closure, optimizer, adam_steps)
            hvp, kept = hessian_vp(params, closure, decay)
            inv = [scale[id(p)].rsqrt() if id(p) in scale else torch.ones_like(p)
                   for p in kept]

            def op(v: Vec) -> Vec:  # P^-1/2 H P^-1/2, symmetric, same spectrum as P^-1 H
                return [i * x for i, x in zip(inv, hvp([i * y for i, y in zip(inv, v,
                                                        strict=True)]), strict=True)]

            lam, used = top_eigenvalue(op, kept, iters=iters, seed=seed)
        else:
            hvp, kept = hessian_vp(params, closure, decay)
            lam, used = top_eigenvalue(hvp, kept, iters=iters, seed=seed)
    if not 0 < lam < math.inf:  # also NaN
        raise ValueError(f"no finite positive curvature at the base config "
                         f"(λ_max = {lam:.3g})")
    if kind in ADAMS:
        beta1 = float(h["betas"][0])
        num = (2 + 2 * beta1) / (1 - beta1)
        return Sharpness(lam, kind, num / lam, f"(2+2β1)/((1-β1)·λ_P) = {num:.3g}/λ_P", used,
                         adam_steps)
    mu = float(h.get("momentum") or 0.0)
    damp = float(h.get("dampening") or 0.0)
    if h.get("nesterov"):
        num = (2 + 2 * mu) / (1 + 2 * mu)
        formula = f"(2+2μ)/((1+2μ)·λ_max) = {num:.3g}/λ_max"
    else:
        num = (2 + 2 * mu) / (1 - damp)
        formula = "2/λ_max" if mu == 0 and damp == 0 else \
            f"(2+2μ)/((1-dampening)·λ_max) = {num:.3g}/λ_max"
    return Sharpness(lam, kind, num / lam, formula, used)


def from_hook(result: Any, **kwargs: Any) -> Sharpness:
    """:func:`estimate` on what ``loss_closure(config)`` returned: ``(params, closure)`` or
    ``(params, closure, optimizer)``; ValueError naming what is wrong otherwise."""
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        raise ValueError(f"{HOOK} returned {type(result).__name__}, not (params, closure) or "
                         "(params, closure, optimizer)")
    params, closure = result[0], result[1]
    optimizer = result[2] if len(result) == 3 else None
    if not callable(closure):
        raise ValueError(f"{HOOK}'s closure is {type(closure).__name__}, not callable")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"{HOOK}'s optimizer is {type(optimizer).__name__}, not a "
                         "torch.optim.Optimizer (or None)")
    return estimate(params, closure, optimizer, **kwargs)
