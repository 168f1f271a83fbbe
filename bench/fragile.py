"""A planted fragile region: configs that are the best on the search seed and bad on most others.

The benchmark case ``bench/efficiency.py --trainer fragile`` (base config
``bench/cases/fragile.yaml``). A small MLP regresses one standardised target on
16 Gaussian inputs (a fixed random nonlinear function plus noise, generated in
memory from ``data.seed``: the same task on every trial seed), SGD with momentum 0.9
(``training.optimizer: adamw`` is the alternative), a linear warmup and a cosine decay,
well under 1 ms per step on one CPU core.

**The plant.** Above the LR edge (``fragile.edge_lr``) a run's trial seed picks one
of two basins, from a hash of the seed alone (the same basin for every config and
every trial id on that seed; ``lucky(seed)``):

* a *lucky* seed (``fragile.lucky_share`` of all seeds, 1 in 4 by default) trains
  normally, and there a higher LR simply trains further in the step budget: the
  configs above the edge are the best ones of a search run on that seed (by ~5-10 %);
* every other seed settles in a bad basin: the run fits a spurious, seed-specific
  pattern on top of the signal (its training targets carry ``fragile.bad_amplitude``
  × a fixed random function of the inputs drawn from the seed), so its val_loss ends
  ~2-3x worse. The curve is as smooth as a good run's: it falls from the first step
  and flattens, no spike, no NaN, no grad blowup, far from the random-guess loss.
  No instability rule can fire; only re-running the config on other seeds shows it.

Below the edge every seed trains normally: those configs are robust, and only
slightly worse than the lucky ones above the edge. Far above it (lr ~1) SGD blows up
on any seed (NaN, grad blowups, loss spikes), which the rules do see.

What a run reports every step: ``step``, ``loss``, ``grad_norm`` (``sweeps.Monitor``,
before clipping), ``lr``, ``pred_std``/``target_std``, ``step_time``, and
``val_loss`` every ``training.eval_every`` steps and at the last step; ``basin``
(1 = bad, 0 = not) is reported with ``val_loss`` so a result can be checked.

    sweeps try <a sweep file with trainer: bench.fragile:train> --set lr=3e-2 --seed 3
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sweeps import Monitor
from sweeps.trainers.regression import TEACHER_SEED_OFFSET, noisy_targets

SPURIOUS_SEED_OFFSET = 104_729


DEFAULTS = {"edge_lr": 2e-2, "lucky_share": 0.25, "salt": "fragile-basin",
            "bad_amplitude": 0.6}


def lucky(seed: int, share: float = 0.25, salt: str = "fragile-basin") -> bool:
    """Whether trial seed ``seed`` lands in the good basin above the edge: a hash of the
    seed alone (crc32 of ``"<salt>:<seed>"``), true for about ``share`` of all seeds."""
    return zlib.crc32(f"{salt}:{int(seed)}".encode()) % 10_000 < share * 10_000


def lucky_seeds(count: int, share: float = 0.25, salt: str = "fragile-basin",
                start: int = 0) -> list[int]:
    """The first ``count`` lucky seeds from ``start`` on (the benchmark's search seeds)."""
    out, seed = [], start
    while len(out) < count:
        if lucky(seed, share, salt):
            out.append(seed)
        seed += 1
    return out


def _random_function(in_features: int, seed: int, hidden: int = 32, gain: float = 1.5,
                     wave: float = 0.5):
    """A fixed random smooth function R^in -> R, deterministic in ``seed``: a random tanh
    layer read out linearly, plus ``wave`` × a sinusoid of one input projection."""
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(in_features, hidden, generator=g) * (gain / math.sqrt(in_features))
    b1 = 0.5 * torch.randn(hidden, generator=g)
    w2 = torch.randn(hidden, 1, generator=g) / math.sqrt(hidden)
    w3 = torch.randn(in_features, 1, generator=g) / math.sqrt(in_features)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ w1 + b1) @ w2 + wave * torch.sin(2.0 * (x @ w3))

    return f


def make_data(n_train: int, n_val: int, seed: int, in_features: int, noise: float,
              gain: float = 1.0, wave: float = 0.0):
    """Training and validation sets of one target function (unit variance signal + noise,
    standardised on the training set): the best MSE is about noise² / (1 + noise²)."""
    f = _random_function(in_features, seed + TEACHER_SEED_OFFSET, gain=gain, wave=wave)
    return noisy_targets(f, n_train, n_val, seed, in_features, noise)


def spurious(x: torch.Tensor, seed: int) -> torch.Tensor:
    """The seed's spurious pattern: a random function of the inputs, unit variance."""
    r = _random_function(x.shape[1], seed + SPURIOUS_SEED_OFFSET)(x)
    return (r - r.mean()) / r.std().clamp_min(1e-6)


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden: int, layers: int, dropout: float) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        width = in_features
        for _ in range(layers):
            blocks += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _schedule(optimizer, warmup: int, max_steps: int, min_ratio: float = 0.1):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def lr_scheduler(config: dict[str, Any], optimizer) -> Any:
    """The trainer's LR schedule (the preflight hook)."""
    opt, sweep = config["training"], config.get("sweep") or {}
    max_steps = int(sweep.get("max_steps") or opt.get("max_steps", 300))
    return _schedule(optimizer, int(opt.get("warmup_steps", 0)), max_steps)


def train(config: dict[str, Any], report: Callable[[dict], None]) -> None:
    """Train the MLP, calling ``report(metrics)`` every step (see the module docstring)."""
    data, net_cfg, opt = config.get("data", {}), config.get("model", {}), config["training"]
    plant = {**DEFAULTS, **(config.get("fragile") or {})}
    sweep = config.get("sweep") or {}
    seed = int(sweep.get("seed", 0))
    max_steps = int(sweep.get("max_steps") or opt.get("max_steps", 300))
    batch_size = int(opt.get("batch_size", 64))
    eval_every = int(opt.get("eval_every") or max_steps)
    lr = float(opt["lr"])
    grad_clip = float(opt["grad_clip"]) if opt.get("grad_clip") else None
    torch.manual_seed(seed)

    x_train, y_train, x_val, y_val = make_data(
        int(data.get("n_train", 4096)), int(data.get("n_val", 1024)),
        int(data.get("seed", 0)), int(data.get("in_features", 16)),
        float(data.get("noise", 0.3)), float(data.get("gain", 1.0)),
        float(data.get("wave", 0.0)))
    bad = lr > float(plant["edge_lr"]) and not lucky(seed, float(plant["lucky_share"]),
                                                     str(plant["salt"]))
    if bad:  # the bad basin: the run fits the seed's spurious pattern as well
        y_train = y_train + float(plant["bad_amplitude"]) * spurious(x_train, seed)

    net = MLP(x_train.shape[1], int(net_cfg.get("hidden", 64)), int(net_cfg.get("layers", 2)),
              float(net_cfg.get("dropout", 0.0)))
    wd = float(opt.get("weight_decay", 0.0))
    if opt.get("optimizer", "sgd") == "sgd":
        optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, weight_decay=wd)
    else:
        optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=wd)
    scheduler = _schedule(optimizer, int(opt.get("warmup_steps", 0)), max_steps)
    monitor = Monitor(net, optimizer, grad_clip=grad_clip)
    batches = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x_train), generator=batches)
    at = 0
    for step in range(1, max_steps + 1):
        if at + batch_size > len(order):
            order, at = torch.randperm(len(x_train), generator=batches), 0
        index = order[at:at + batch_size]
        at += batch_size
        start = time.perf_counter()
        pred = net(x_train[index])
        loss = F.mse_loss(pred, y_train[index])
        loss.backward()
        metrics = monitor.measure(loss, pred=pred, target=y_train[index])
        if grad_clip is not None:
            nn.utils.clip_grad_norm_(net.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        metrics.update(step=step, step_time=time.perf_counter() - start)
        if step % eval_every == 0 or step == max_steps:
            net.eval()
            with torch.no_grad():
                metrics["val_loss"] = float(F.mse_loss(net(x_val), y_val))
            net.train()
            metrics["basin"] = float(bad)
        report(metrics)
