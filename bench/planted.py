"""Planted-failure trainer for bench/detection.py (and a near no-op trainer for overhead.py).

A linear regression on 8 standardised features, trained by SGD, reporting every
step (loss, grad_norm before clipping, lr, pred_std, target_std) and val_loss
every 10 steps. Targets are 40 % signal, 60 % noise, so a healthy run sits at a
loss of ~0.6 against the baseline 1.0 (predicting the mean). ``train.case``
plants one failure at step ``train.onset``:

- ``healthy``       warmup then cosine decay, nothing planted (control)
- ``healthy_noisy`` batch of 8 (a noisy loss) and one 10x gradient spike at the onset
                    (below the blowup threshold; control)
- ``nonfinite``     the loss is multiplied by NaN from the onset
- ``blowup``        gradients are multiplied by 1e4 from the onset (then the weights explode)
- ``flat``          labels shuffled against the inputs and an LR of 1e-6: the loss sits at
                    ~1.01 (within 5 % of the baseline) from the first step
- ``collapse``      from the onset the predictions are squashed 50x towards their mean
- ``restart``       cosine decay that jumps back to the peak LR at the onset (a warm restart
                    the schedule was not meant to have)
- ``slow``          a constant LR of 1 % of ``train.lr``: a slow learner (control). Its loss
                    leaves the baseline slowly (~2.5 % below it at step 60, 15–20 % by
                    step 300) and its predictions grow from near-constant (zero weights): it is
                    neither stuck nor collapsed, and no rule may stop it
"""

from __future__ import annotations

import math
import time

import torch

CASES = ("healthy", "healthy_noisy", "slow", "nonfinite", "blowup", "flat", "collapse",
         "restart")
#: Cases no rule may stop (controls).
CONTROLS = ("healthy", "healthy_noisy", "slow")


def _lr_at(case: str, step: int, lr: float, warmup: int, onset: int, steps: int) -> float:
    if case == "slow":
        return 0.01 * lr
    if case == "restart":
        period = onset  # the decay restarts at the onset
        t = step % period
        return 0.05 * lr + 0.95 * lr * 0.5 * (1 + math.cos(math.pi * t / period))
    if step <= warmup:
        return lr * step / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 * lr + 0.9 * lr * 0.5 * (1 + math.cos(math.pi * progress))


def train(config, report):
    t = config["train"]
    run = config.get("sweep", {})
    seed = int(run.get("seed", 0))
    steps = int(run.get("max_steps", t.get("steps", 200)))
    case, onset = str(t.get("case", "healthy")), int(t.get("onset", 60))
    warmup = int(t.get("warmup", 10))
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    x = torch.randn(1024, 8, generator=gen)
    w = torch.randn(8, 1, generator=gen)
    signal = x @ w
    noise = torch.randn(1024, 1, generator=gen)
    y = signal / signal.std() * math.sqrt(0.4) + math.sqrt(0.6) * noise
    y = (y - y[:768].mean()) / y[:768].std()  # standardised on the training rows
    model = torch.nn.Linear(8, 1)
    torch.nn.init.zeros_(model.weight)  # starts at the baseline (predicts the mean)
    torch.nn.init.zeros_(model.bias)
    if case == "flat":  # labels shuffled against the inputs: nothing to learn, loss ~1.01
        x = x[torch.randperm(1024, generator=gen)]
        corr = x[:768].T @ y[:768] / 768  # keep the predictions uncorrelated with the labels
        w0 = torch.full((8, 1), 0.04)
        with torch.no_grad():
            model.weight.copy_((w0 - corr * (w0 * corr).sum() / (corr * corr).sum()).T)
    lr = 1e-6 if case == "flat" else float(t.get("lr", 0.05))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    batch = 8 if case == "healthy_noisy" else 256
    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = _lr_at(case, step, lr, warmup, onset, steps)
        idx = torch.randint(0, 768, (batch,), generator=gen)
        pred = model(x[idx])
        if case == "collapse" and step >= onset:
            pred = pred.mean() + 0.02 * (pred - pred.mean())
        loss = torch.nn.functional.mse_loss(pred, y[idx])
        if case == "nonfinite" and step >= onset:
            loss = loss * float("nan")
        opt.zero_grad()
        loss.backward()
        scale = 1.0
        if case == "blowup" and step >= onset:
            scale = 1e4
        elif case == "healthy_noisy" and step == onset:
            scale = 10.0
        if scale != 1.0:
            for p in model.parameters():
                p.grad.mul_(scale)
        grad_norm = float(torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters())))
        opt.step()
        metrics = {"step": step, "loss": float(loss.detach()), "grad_norm": grad_norm,
                   "lr": opt.param_groups[0]["lr"], "pred_std": float(pred.detach().std()),
                   "target_std": float(y[idx].std())}
        if step % 10 == 0 or step == steps:
            with torch.no_grad():
                vp = model(x[768:])
                if case == "collapse" and step >= onset:
                    vp = vp.mean() + 0.02 * (vp - vp.mean())
                metrics["val_loss"] = float(torch.nn.functional.mse_loss(vp, y[768:]))
        report(metrics)


def noop(config, report):
    """Almost no work: ``train.reports`` reports of constant metrics (overhead benchmark)."""
    t = config.get("train", {})
    n = int(t.get("reports", 30))
    x = float(t.get("x", 0.5))
    sleep = float(t.get("sleep", 0.0))
    for step in range(1, n + 1):
        if sleep:
            time.sleep(sleep)
        metrics = {"step": step, "loss": 1.0 - 0.01 * step * x, "grad_norm": 1.0, "lr": 1e-3}
        if step % 10 == 0 or step == n:
            metrics["val_loss"] = 1.0 - 0.01 * step * x
        report(metrics)
