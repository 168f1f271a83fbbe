"""A tiny GPT-2 language model trained with ``transformers.Trainer``: your own script.

It trains as it always did::

    python train.py --config config.yaml

and ``train(config, report)`` below, three lines, is all a sweep needs
(``trainer: train:train`` in sweep.yaml). Nothing is downloaded: the model is built
from a ``GPT2Config`` with random weights, and the data are generated token sequences
in which each token is followed by a fixed successor (a random permutation of the
vocabulary) except with probability ``data.noise``. A model that guesses scores
ln(vocab_size) = ln 64 = 4.159; one that learned the successors ~0.73 (noise 0.1).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import yaml
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


def make_datasets(data: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """Training and validation sequences (``input_ids`` = ``labels``), deterministic in
    ``data.seed``: the same successor table for both, other sequences."""
    vocab, length, noise = int(data["vocab_size"]), int(data["seq_len"]), float(data["noise"])
    g = torch.Generator().manual_seed(int(data["seed"]))
    successor = torch.randperm(vocab, generator=g)

    def sequences(n: int) -> list[dict]:
        ids = torch.empty(n, length, dtype=torch.long)
        ids[:, 0] = torch.randint(vocab, (n,), generator=g)
        for t in range(1, length):
            random = torch.randint(vocab, (n,), generator=g)
            keep = torch.rand(n, generator=g) >= noise
            ids[:, t] = torch.where(keep, successor[ids[:, t - 1]], random)
        return [{"input_ids": row, "labels": row} for row in ids]

    return sequences(int(data["n_train"])), sequences(int(data["n_val"]))


def build_model(model: dict[str, Any], data: dict[str, Any]) -> GPT2LMHeadModel:
    """A randomly initialised GPT-2 of the configured size; ``dropout`` sets all three."""
    dropout = float(model["dropout"])
    return GPT2LMHeadModel(GPT2Config(
        vocab_size=int(data["vocab_size"]), n_positions=int(data["seq_len"]),
        n_embd=int(model["n_embd"]), n_layer=int(model["n_layer"]), n_head=int(model["n_head"]),
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
        bos_token_id=0, eos_token_id=0))


def train(config: dict[str, Any], report) -> None:
    """The sweeps trainer: the trial's knobs are already in ``config``."""
    from sweeps.integrations.huggingface import train_hf

    train_set, val_set = make_datasets(config["data"])
    train_hf(config, report, train_dataset=train_set, eval_dataset=val_set,
             model_init=lambda: build_model(config["model"], config["data"]))


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train with the config file as written; print and return the final evaluation."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="YAML config (config.yaml layout)")
    config = yaml.safe_load(open(parser.parse_args(argv).config))
    train_set, val_set = make_datasets(config["data"])
    trainer = Trainer(
        model_init=lambda: build_model(config["model"], config["data"]),
        args=TrainingArguments(**config["training_args"]),
        train_dataset=train_set, eval_dataset=val_set)
    trainer.train()
    metrics = trainer.evaluate()
    print(f"eval_loss {metrics['eval_loss']:.4f}")
    return metrics


if __name__ == "__main__":
    main()
