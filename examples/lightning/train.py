"""A Lightning user's training script, swept by sweeps as it is.

Everything but ``train`` (and the two optional preflight hooks) is the user's own code:
a LightningModule, a LightningDataModule and ``main``, which runs one training from a
YAML config. ``train(config, report)`` is what the sweep file names::

    python train.py --config config.yaml                 # your own run
    sweeps run sweep.yaml                                # the sweep
    python train.py --config results/lightning-regression/stable/rank-01-<trial>.yaml

The task: an MLP regresses a fixed random nonlinear function of 16 Gaussian inputs,
with noise, on data generated in memory (nothing is downloaded). Targets are
standardised, so predicting their mean scores an MSE of ~1.0 (the sweep's
``rules.baseline_loss``). With SGD (momentum 0.9) an LR past ~0.1 blows up (past
~0.3 with ``gradient_clip_val: 1``).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
import yaml
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from sweeps.integrations.lightning import linear_warmup


class SyntheticData(pl.LightningDataModule):
    """Inputs ~ N(0, 1); targets a random tanh layer plus a sine term plus noise, deterministic
    in ``seed`` and standardised with the training set's mean and std."""

    def __init__(self, n_train: int = 4096, n_val: int = 1024, in_features: int = 16,
                 noise: float = 0.3, batch_size: int = 64, seed: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        g = torch.Generator().manual_seed(seed)
        w1 = torch.randn(in_features, 32, generator=g) * (1.5 / math.sqrt(in_features))
        w2 = torch.randn(32, 1, generator=g) / math.sqrt(32)
        w3 = torch.randn(in_features, 1, generator=g) / math.sqrt(in_features)
        x = torch.randn(n_train + n_val, in_features, generator=g)
        y = torch.tanh(x @ w1) @ w2 + 0.5 * torch.sin(2 * (x @ w3))
        y = (y - y[:n_train].mean()) / y[:n_train].std()
        y = y + noise * torch.randn(y.shape, generator=g)
        y = (y - y[:n_train].mean()) / y[:n_train].std()
        self.train_set = TensorDataset(x[:n_train], y[:n_train])
        self.val_set = TensorDataset(x[n_train:], y[n_train:])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=len(self.val_set))


class Regressor(pl.LightningModule):
    """MLP: ``layers`` x (Linear, ReLU, Dropout) with He init, then a linear head; MSE."""

    def __init__(self, in_features: int = 16, hidden: int = 64, layers: int = 2,
                 dropout: float = 0.1, lr: float = 0.01, weight_decay: float = 0.0,
                 warmup_steps: int = 0, optimizer: str = "sgd") -> None:
        super().__init__()
        self.save_hyperparameters()
        blocks: list[nn.Module] = []
        width = in_features
        for _ in range(layers):
            linear = nn.Linear(width, hidden)
            nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")  # keeps the scale
            blocks += [linear, nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        self.net = nn.Sequential(*blocks, nn.Linear(width, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x, y = batch
        pred = self(x)
        loss = F.mse_loss(pred, y)
        self.log("train_loss", loss)
        # pred and target are optional: sweeps then reports pred_std / target_std too
        return {"loss": loss, "pred": pred.detach(), "target": y}

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y))

    def configure_optimizers(self) -> dict[str, Any]:
        h = self.hparams
        if h.optimizer == "sgd":
            opt = torch.optim.SGD(self.parameters(), lr=h.lr, momentum=0.9,
                                  weight_decay=h.weight_decay)
        elif h.optimizer == "adamw":
            opt = torch.optim.AdamW(self.parameters(), lr=h.lr, weight_decay=h.weight_decay)
        else:
            raise ValueError(f"model.optimizer: unknown {h.optimizer!r}; use sgd or adamw")
        # linear warmup over warmup_steps optimizer steps (interval: step), then flat
        return {"optimizer": opt, "lr_scheduler": linear_warmup(opt, h.warmup_steps)}


def main(argv: list[str] | None = None) -> float:
    """The user's own entry point: one training run from a YAML config; returns val_loss."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="YAML with data, model, trainer")
    parser.add_argument("--max-steps", type=int, default=None, help="cut the run short")
    args = parser.parse_args(argv)
    with open(args.config) as f:
        cfg = yaml.safe_load(f)
    pl.seed_everything(cfg.get("seed", 0))
    trainer_args = dict(cfg["trainer"])
    if args.max_steps is not None:
        trainer_args["max_steps"] = args.max_steps
    trainer = pl.Trainer(**trainer_args)
    model, data = Regressor(**cfg["model"]), SyntheticData(**cfg["data"])
    trainer.fit(model, datamodule=data)
    val_loss = float(trainer.validate(model, datamodule=data, verbose=False)[0]["val_loss"])
    print(f"val_loss {val_loss:.4f}")
    return val_loss


# --------------------------------------------------------------------------- for sweeps


def train(config: dict[str, Any], report) -> None:
    """The sweep's trainer: the config's sections go to Regressor, SyntheticData and the
    Trainer; sweeps seeds, sets the budget and device, and reports every step."""
    from sweeps.integrations.lightning import fit

    fit(config, report, module=Regressor, data=SyntheticData)


def lr_scheduler(config: dict[str, Any], optimizer: torch.optim.Optimizer):
    """Preflight hook: the schedule ``configure_optimizers`` builds for this config."""
    return linear_warmup(optimizer, config["model"].get("warmup_steps", 0))["scheduler"]


def sample_batch(config: dict[str, Any]) -> torch.Tensor:
    """Preflight hook: a batch of model inputs (its input-scale check)."""
    data = SyntheticData(**{**config["data"], "n_train": 256, "n_val": 1})
    return data.train_set.tensors[0]


if __name__ == "__main__":
    main()
