"""The pieces ``bench/boundary.py`` runs on real trainers: the character-level language
model of ``bench/charlm.py`` learns, every trainer's ``loss_closure`` gives the loss
``train`` starts from (a finite scalar the sharpness estimate can use), and the LR range
test of ``bench/lr_range_test.py`` reads off a divergence."""

from __future__ import annotations

import copy
import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch
import yaml

from sweeps.results.sharpness import from_hook
from sweeps.trainers import direction, regression

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """One torch thread, as the other trainer tests (see tests/conftest.py)."""


def bench_module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


charlm = bench_module("charlm")
lrt = bench_module("lr_range_test")


def charlm_config(steps: int = 60, **training) -> dict:
    return {"data": {"n_train": 512, "n_val": 64},
            "training": {"max_steps": steps, "eval_every": 20, "warmup_steps": 5, **training},
            "sweep": {"seed": 0, "max_steps": steps}}


def base(name: str, steps: int = 20, **sections) -> dict:
    config = yaml.safe_load((ROOT / "examples" / "configs" / f"{name}.yaml").read_text())
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    config["training"].update(max_steps=steps, eval_every=steps)
    config["sweep"] = {"seed": 3, "max_steps": steps}
    return config


def test_charlm_learns_and_reports_what_the_rules_need():
    reports: list[dict] = []
    charlm.train(charlm_config(), reports.append)
    assert len(reports) == 60
    for key in ("step", "loss", "grad_norm", "lr", "clipped"):
        assert all(key in r for r in reports), key
    vals = [r["val_loss"] for r in reports if "val_loss" in r]
    assert len(vals) == 3
    baseline = charlm.baseline_loss()
    assert baseline == pytest.approx(math.log(32))
    assert reports[0]["loss"] > baseline - 0.3  # it starts near the uniform guess
    assert vals[-1] < baseline - 0.5, vals  # and learns the source's bigram
    assert reports[2]["lr"] < reports[10]["lr"]  # warmup


def test_charlm_is_deterministic_in_the_trial_seed():
    runs = []
    for seed in (0, 0, 1):
        reports: list[dict] = []
        config = charlm_config(steps=5)
        config["sweep"]["seed"] = seed
        charlm.train(config, reports.append)
        runs.append([r["loss"] for r in reports])
    assert runs[0] == runs[1] and runs[0] != runs[2]


CLOSURES = {
    "charlm": (charlm, lambda: charlm_config(steps=20, **{}) | {"model": {"dropout": 0.0}}),
    "regression": (regression, lambda: base("regression", model={"dropout": 0.0})),
    "direction-mlp": (direction, lambda: base("direction_mlp", data={"n_events": 600,
                                                                       "n_val": 100},
                                              model={"dropout": 0.0})),
    "direction": (direction, lambda: base("direction", data={"n_events": 600, "n_val": 100},
                                          model={"dropout": 0.0, "d_model": 16, "heads": 2})),
}


@pytest.mark.parametrize("name", list(CLOSURES))
def test_loss_closure_is_the_loss_train_starts_from(name):
    module, make = CLOSURES[name]
    config = make()
    params, closure, optimizer = module.loss_closure(copy.deepcopy(config))
    first = closure()
    assert first.dim() == 0 and math.isfinite(first.item()) and first.requires_grad
    assert closure().item() == first.item()  # one fixed batch
    assert closure(1).item() != first.item()  # a fresh one for the LR range test
    assert closure(0).item() == first.item()
    assert isinstance(optimizer, torch.optim.Optimizer)
    reports: list[dict] = []
    module.train(copy.deepcopy(config), reports.append)  # without dropout: the same loss
    assert reports[0]["loss"] == pytest.approx(first.item(), rel=1e-5)
    est = from_hook(module.loss_closure(copy.deepcopy(config)))
    assert 0 < est.predicted < math.inf and est.optimizer in ("Adam", "AdamW")


def test_lr_range_test_reads_off_the_divergence_of_charlm():
    params, closure, optimizer = charlm.loss_closure(charlm_config())
    out = lrt.lr_range_test(params, closure, optimizer, 1e-4, 100.0, steps=60, grad_clip=1.0)
    assert out.fresh_batches
    assert out.answer is not None and 1e-2 < out.answer <= 100.0
    assert out.steps < 60 and out.lrs[-1] == out.answer  # it stops at the divergence
    assert out.smoothed[-1] > lrt.DIVERGE * min(out.smoothed)
    assert out.min_x10 == pytest.approx(10 * out.lrs[out.smoothed.index(min(out.smoothed))])
    assert lrt.off(2.0, 1.0, 1.5) == pytest.approx(2.0 / 1.5)
    assert lrt.off(0.5, 1.0, 1.5) == 0.5 and lrt.off(1.2, 1.0, 1.5) == 1.0
