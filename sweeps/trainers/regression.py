"""Reference trainer: a multi-output MLP regressor that can collapse to the mean.

Modelled on a forecasting model whose predictions collapsed to near-constant
values: prediction std 15-30x below the target std, training loss flat at the
variance of the targets, while gradients and weight updates looked "healthy".
Here a plain MLP regresses ``out_features`` standardised targets on
``in_features`` Gaussian inputs; the targets are a fixed random nonlinear
function of the inputs plus noise, generated in memory from ``data.seed``.
Predicting the mean of every target scores an MSE of ~1.0, the baseline.

The causes the report suspected are all config options here:

* **excessive regularisation**: ``training.optimizer: adam`` adds the L2 term
  ``weight_decay * w`` to the gradient before Adam normalises it (what
  ``torch.optim.Adam(weight_decay=...)`` does), so a large ``weight_decay``
  outweighs the data gradient and shrinks every weight towards 0: the
  predictions collapse to the target mean. ``adamw`` decays decoupled
  (``lr * weight_decay * w`` per step) and is much less sensitive;
* **poor initialisation**: ``model.head_init_scale`` multiplies PyTorch's
  default init of the output layer; a tiny value starts every prediction at ~0,
  and with a low LR (or a long warmup) they stay there;
* **a squashing output activation**: ``model.output_activation: tanh``;
* **a too-low learning rate**, or heavy ``dropout`` / ``grad_clip``.

The loop is the one of ``trainers/direction.py`` (whose ``make_scheduler`` and
``shuffled_batches`` it reuses): ``Monitor.measure(loss, pred=pred, target=y)``
after ``backward()`` adds ``pred_std`` and ``target_std`` to every report, which
is what the ``collapse`` rule judges.

Run one trial of it, with the rules judging every step, from the project folder::

    sweeps try examples/regression.yaml --set weight_decay=0.3
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sweeps import Monitor, compile_mode, compile_model
from sweeps.trainers.direction import make_scheduler, shuffled_batches

VAL_SEED_OFFSET = 1_000_003  # validation inputs use data.seed + this
TEACHER_SEED_OFFSET = 7_919  # the target function uses data.seed + this

# --------------------------------------------------------------------------- data


@dataclass
class Samples:
    """``x`` (n, in_features) inputs and ``y`` (n, out_features) targets."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return self.x.shape[0]


def teacher(in_features: int, out_features: int, seed: int, hidden: int = 64):
    """A fixed random nonlinear function R^in -> R^out, deterministic in ``seed``.

    A random tanh layer, read out linearly, plus a smooth sinusoidal term and a
    pairwise product of two input projections, so no single linear or additive
    fit captures it.
    """
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(in_features, hidden, generator=g) * (1.5 / math.sqrt(in_features))
    b1 = 0.5 * torch.randn(hidden, generator=g)
    w2 = torch.randn(hidden, out_features, generator=g) / math.sqrt(hidden)
    w3 = torch.randn(in_features, out_features, generator=g) / math.sqrt(in_features)
    pa = torch.randn(in_features, out_features, generator=g) / math.sqrt(in_features)
    pb = torch.randn(in_features, out_features, generator=g) / math.sqrt(in_features)

    def f(x: torch.Tensor) -> torch.Tensor:
        return (
            torch.tanh(x @ w1 + b1) @ w2
            + 0.5 * torch.sin(2.0 * (x @ w3))
            + 0.5 * ((x @ pa) * (x @ pb))
        )

    return f


def make_datasets(
    n_train: int,
    n_val: int,
    seed: int,
    *,
    in_features: int = 24,
    out_features: int = 6,
    noise: float = 0.3,
) -> tuple[Samples, Samples]:
    """Training and validation sets of one target function, deterministic in ``seed``.

    Each target column's signal is scaled to unit std on the training set, then
    noise of std ``noise`` is added, and the targets are standardised with the
    training set's mean and std (as a real pipeline would). So the best
    achievable MSE is about ``noise**2 / (1 + noise**2)`` (0.083 at 0.3) and
    predicting the mean scores ~1.0.
    """
    f = teacher(in_features, out_features, seed + TEACHER_SEED_OFFSET)
    x_train, y_train, x_val, y_val = noisy_targets(f, n_train, n_val, seed, in_features, noise)
    return Samples(x_train, y_train), Samples(x_val, y_val)


def noisy_targets(
    f: Callable[[torch.Tensor], torch.Tensor], n_train: int, n_val: int, seed: int,
    in_features: int, noise: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs from ``seed`` (validation: ``seed + VAL_SEED_OFFSET``) and targets ``f(x)``:
    the signal scaled to unit std on the training set, noise of std ``noise`` added, then
    standardised with the training set's mean and std."""
    g_train = torch.Generator().manual_seed(seed)
    g_val = torch.Generator().manual_seed(seed + VAL_SEED_OFFSET)
    x_train = torch.randn(n_train, in_features, generator=g_train)
    x_val = torch.randn(n_val, in_features, generator=g_val)
    s_train, s_val = f(x_train), f(x_val)
    mean, std = s_train.mean(0), s_train.std(0).clamp_min(1e-6)
    y_train = (s_train - mean) / std + noise * torch.randn(s_train.shape, generator=g_train)
    y_val = (s_val - mean) / std + noise * torch.randn(s_val.shape, generator=g_val)
    mean, std = y_train.mean(0), y_train.std(0).clamp_min(1e-6)
    return x_train, (y_train - mean) / std, x_val, (y_val - mean) / std


# --------------------------------------------------------------------------- model

OUTPUT_ACTIVATIONS = ("none", "tanh")


class Regressor(nn.Module):
    """MLP: ``layers`` x (Linear, ReLU, Dropout), then a linear head.

    Hidden layers use He (Kaiming) init, so activations keep their scale with
    depth. The head starts from PyTorch's default ``nn.Linear`` init times
    ``head_init_scale`` (weights and bias): 1.0 gives a prediction std of about
    half the target std at step 0, 1e-3 gives ~1e-3. ``output_activation:
    tanh`` squashes every prediction into (-1, 1).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        hidden: int = 128,
        layers: int = 3,
        dropout: float = 0.1,
        head_init_scale: float = 1.0,
        output_activation: str = "none",
    ) -> None:
        super().__init__()
        if output_activation not in OUTPUT_ACTIVATIONS:
            raise ValueError(
                f"model.output_activation: unknown {output_activation!r}; "
                f"choose one of {OUTPUT_ACTIVATIONS}"
            )
        blocks: list[nn.Module] = []
        width = in_features
        for _ in range(layers):
            linear = nn.Linear(width, hidden)
            nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
            nn.init.zeros_(linear.bias)
            blocks += [linear, nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(width, out_features)
        with torch.no_grad():
            self.head.weight.mul_(head_init_scale)
            self.head.bias.mul_(head_init_scale)
        self.squash = nn.Tanh() if output_activation == "tanh" else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.squash(self.head(self.body(x)))


@torch.no_grad()
def evaluate(model: nn.Module, samples: Samples) -> tuple[float, float]:
    """Validation MSE and prediction std over ``samples``, in eval mode (no dropout)."""
    was_training = model.training
    model.eval()
    pred = model(samples.x)
    model.train(was_training)
    return float(F.mse_loss(pred, samples.y)), float(pred.std())


# --------------------------------------------------------------------------- optimizer

OPTIMIZERS = ("adamw", "adam", "sgd")


def make_optimizer(params, name: str, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """``adamw`` (decoupled decay), ``adam`` (L2 in the gradient) or ``sgd`` (momentum 0.9).

    ``adam`` is ``torch.optim.Adam(weight_decay=...)``: the decay term joins the
    gradient before Adam divides by its running RMS, so once ``weight_decay * w``
    outweighs the data gradient every weight is pulled to 0 at a rate of ~``lr``
    per step, however small the data gradient is. ``adamw`` shrinks weights by
    ``lr * weight_decay`` of themselves per step.
    """
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    raise ValueError(f"training.optimizer: unknown {name!r}; choose one of {OPTIMIZERS}")


# --------------------------------------------------------------------------- training


def train(config: dict[str, Any], report: Callable[[dict], None]) -> None:
    """Train the regressor, calling ``report(metrics)`` every step.

    ``config`` has the layout of ``examples/configs/regression.yaml`` plus,
    under sweeps, ``sweep: {trial_id, seed, max_steps}`` (seed 0 and
    ``training.max_steps`` without it). Exceptions raised by ``report``
    propagate: that is how sweeps stops an unstable trial.
    """
    data, net_cfg, opt = config.get("data", {}), config.get("model", {}), config["training"]
    sweep = config.get("sweep") or {}
    seed = int(sweep.get("seed", 0))
    max_steps = int(sweep.get("max_steps") or opt.get("max_steps", 300))
    batch_size = int(opt.get("batch_size", 128))
    eval_every = int(opt.get("eval_every") or max_steps)
    report_every = int(opt.get("report_every", 1))
    grad_clip = float(opt["grad_clip"]) if opt.get("grad_clip") else None
    mode = compile_mode(opt.get("compile"), key="training.compile")  # null / false: eager
    torch.manual_seed(seed)  # initial weights and dropout

    # Data: generated once; a step only indexes into the tensors.
    train_set, val_set = make_datasets(
        int(data.get("n_train", 8_192)),
        int(data.get("n_val", 2_048)),
        int(data.get("seed", 0)),
        in_features=int(data.get("in_features", 24)),
        out_features=int(data.get("out_features", 6)),
        noise=float(data.get("noise", 0.3)),
    )
    batches = shuffled_batches(len(train_set), batch_size, torch.Generator().manual_seed(seed))

    net = Regressor(
        train_set.x.shape[1],
        train_set.y.shape[1],
        hidden=int(net_cfg.get("hidden", 128)),
        layers=int(net_cfg.get("layers", 3)),
        dropout=float(net_cfg.get("dropout", 0.1)),
        head_init_scale=float(net_cfg.get("head_init_scale", 1.0)),
        output_activation=str(net_cfg.get("output_activation", "none")),
    )
    model = compile_model(net, mode)  # evaluation uses the eager `net`
    optimizer = make_optimizer(
        net.parameters(),
        str(opt.get("optimizer", "adamw")),
        lr=float(opt["lr"]),
        weight_decay=float(opt.get("weight_decay", 0.0)),
    )
    scheduler = make_scheduler(
        optimizer,
        str(opt.get("schedule", "warmup_cosine")),
        warmup_steps=int(opt.get("warmup_steps", 0)),
        max_steps=max_steps,
        min_lr_ratio=float(opt.get("min_lr_ratio", 0.1)),
    )
    monitor = Monitor(net, optimizer, grad_clip=grad_clip)

    once: dict[str, float] = {}  # metrics for the next report only
    for step in range(1, max_steps + 1):
        index = next(batches)
        x, y = train_set.x[index], train_set.y[index]
        start = time.perf_counter()
        pred = model(x)
        loss = F.mse_loss(pred, y)
        loss.backward()
        metrics = monitor.measure(loss, pred=pred, target=y)  # before clip and zero_grad
        if grad_clip is not None:
            nn.utils.clip_grad_norm_(net.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        step_time = time.perf_counter() - start  # forward, backward, monitor, clip, step
        if step == 1 and mode != "none":
            once["compile_s"] = step_time  # the first step includes compilation

        is_eval = step % eval_every == 0 or step == max_steps
        if step % report_every and not is_eval:
            continue
        metrics.update(once, step=step, step_time=step_time)
        metrics.setdefault("clipped", 0.0)  # Monitor sets it only when clipping is on
        once = {}
        if is_eval:
            metrics["val_loss"], metrics["val_pred_std"] = evaluate(net, val_set)
        report(metrics)  # no try/except: sweeps stops a trial by raising here


def loss_closure(config: dict[str, Any]) -> tuple[
        list[torch.Tensor], Callable[..., torch.Tensor], torch.optim.Optimizer]:
    """Sharpness hook of ``sweeps stability --probe``: ``(params, closure, optimizer)`` as
    ``train`` builds them for ``config`` (same seed, data, model and optimizer).

    ``closure()`` is the training MSE on the run's first batch, in eval mode (no dropout);
    ``closure(k)`` is the MSE on the k-th batch of the run's stream (k = 0: the first), for
    an LR range test on fresh batches (``bench/lr_range_test.py``). ``train`` is unchanged
    by it.
    """
    data, net_cfg, opt = config.get("data", {}), config.get("model", {}), config["training"]
    seed = int((config.get("sweep") or {}).get("seed", 0))
    torch.manual_seed(seed)  # initial weights, as train draws them
    train_set, _ = make_datasets(
        int(data.get("n_train", 8_192)), int(data.get("n_val", 2_048)),
        int(data.get("seed", 0)), in_features=int(data.get("in_features", 24)),
        out_features=int(data.get("out_features", 6)), noise=float(data.get("noise", 0.3)))
    batches = shuffled_batches(len(train_set), int(opt.get("batch_size", 128)),
                               torch.Generator().manual_seed(seed))
    net = Regressor(
        train_set.x.shape[1], train_set.y.shape[1], hidden=int(net_cfg.get("hidden", 128)),
        layers=int(net_cfg.get("layers", 3)), dropout=float(net_cfg.get("dropout", 0.1)),
        head_init_scale=float(net_cfg.get("head_init_scale", 1.0)),
        output_activation=str(net_cfg.get("output_activation", "none"))).eval()
    optimizer = make_optimizer(net.parameters(), str(opt.get("optimizer", "adamw")),
                               lr=float(opt["lr"]),
                               weight_decay=float(opt.get("weight_decay", 0.0)))
    seen: list[torch.Tensor] = []

    def closure(batch: int | None = None) -> torch.Tensor:
        k = batch or 0
        while len(seen) <= k:
            seen.append(next(batches))
        return F.mse_loss(net(train_set.x[seen[k]]), train_set.y[seen[k]])

    return list(net.parameters()), closure, optimizer
