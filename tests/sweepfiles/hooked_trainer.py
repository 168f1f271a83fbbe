"""A trainer exposing the preflight hooks (used by the tests).

``train.schedule: restarts`` reproduces the warm-restart mistake (a cosine
with a short period stepped per batch); ``train.raw_inputs: true`` feeds
features at raw detector scales (times ~1e4 ns).
"""

import math

import torch

from sweeps import Monitor


def lr_scheduler(config, optimizer):
    t = config["train"]
    steps = config["sweep"]["max_steps"]
    if t.get("schedule") == "restarts":
        return torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=steps // 4)
    if t.get("schedule") == "plateau":  # stepped with the validation loss
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=2)
    warmup = int(t.get("warmup", 0))
    floor = float(t.get("min_lr", 0.0)) / float(t["lr"])  # an absolute floor, as a factor

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, steps - warmup))))
        return max(cosine, floor)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def sample_batch(config):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 3, generator=gen)
    if config["train"].get("raw_inputs"):
        return {"time": 1.3e4 + 8e3 * x[:, 0].abs(), "charge": x[:, 1].exp(), "flag": x[:, 2] > 0}
    return {"features": x}


def train(config, report):
    t = config["train"]
    steps = config["sweep"]["max_steps"]
    torch.manual_seed(config["sweep"]["seed"])
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=float(t["lr"]))
    sched = lr_scheduler(config, opt)
    monitor = Monitor(model, opt)
    for step in range(1, steps + 1):
        x = torch.randn(32, 3)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        metrics = monitor.measure(loss)
        opt.step()
        sched.step()
        report({"step": step, **metrics, **({"val_loss": float(loss)} if step % 10 == 0 else {})})
