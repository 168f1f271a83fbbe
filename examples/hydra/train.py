"""A Hydra user's own entry point: `python train.py training.lr=0.001 model.dropout=0.2`.

After a sweep, train with what it handed over:
    python train.py $(cat results/regression-hydra/stable/rank-01-*.overrides)
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf

from sweeps.trainers.regression import train


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    config = OmegaConf.to_container(cfg, resolve=True)
    last: dict = {}
    train(config, last.update)  # the same function the sweep runs; report keeps the last
    print(f"{config['run_name']}: val_loss {last.get('val_loss')} at step {last.get('step')}")


if __name__ == "__main__":
    main()
