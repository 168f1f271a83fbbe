"""The regression trainer: it collapses where it should, learns where it should, and says so."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from sweeps.rules.settings import RuleSettings
from sweeps.trainers.direction import shuffled_batches
from sweeps.trainers.regression import Regressor, evaluate, make_datasets, train
from sweeps.trial.reporter import TrialReporter, TrialStopped

BASE_CONFIG = Path(__file__).resolve().parents[1] / "examples" / "configs" / "regression.yaml"
REQUIRED = ("step", "loss", "grad_norm", "lr", "pred_std", "target_std", "step_time", "clipped")


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every test here trains with one torch thread (see tests/conftest.py)."""


def config_with(**sections) -> dict:
    """The shipped base config (300 steps, ~0.6 s a run) with section overrides."""
    with open(BASE_CONFIG) as f:
        config = yaml.safe_load(f)
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    return config


def judged_run(config: dict) -> TrialReporter:
    """One run judged by the rules as in a sweep (baseline MSE 1.0); stops where a rule fires."""
    settings = RuleSettings(baseline_loss=1.0, warmup_steps=config["training"]["warmup_steps"])
    results: list[dict] = []
    reporter = TrialReporter(settings, sink=results.append)
    try:
        train(copy.deepcopy(config), reporter)
    except TrialStopped as stopped:
        assert stopped.verdict is reporter.verdict
    assert len(results) == len(reporter.history)
    return reporter


def plain_run(config: dict) -> list[dict]:
    reports: list[dict] = []
    train(copy.deepcopy(config), reports.append)
    return reports


def ratio(report: dict) -> float:
    return report["pred_std"] / report["target_std"]


def test_base_config_has_the_documented_layout():
    with open(BASE_CONFIG) as f:
        config = yaml.safe_load(f)
    assert set(config) == {"data", "model", "training"}
    for key in ("lr", "grad_clip", "weight_decay", "warmup_steps", "compile", "schedule"):
        assert key in config["training"]
    assert config["model"]["dropout"] > 0 and config["model"]["head_init_scale"] == 1.0
    assert config["training"]["optimizer"] == "adam"  # L2 decay: the collapse mechanism


def test_targets_are_standardised_and_predicting_the_mean_scores_the_baseline():
    train_set, val_set = make_datasets(8_192, 2_048, seed=0)
    assert train_set.x.shape == (8_192, 24) and train_set.y.shape == (8_192, 6)
    assert train_set.y.mean(0).abs().max() < 1e-5
    assert (train_set.y.std(0) - 1).abs().max() < 1e-4
    baseline = F.mse_loss(torch.zeros_like(val_set.y), val_set.y).item()
    assert 0.9 < baseline < 1.1  # the sweep's rules.baseline_loss: 1.0
    # The targets depend on the inputs nonlinearly: a least-squares linear fit leaves a
    # large part of the variance that the MLP does learn (see the healthy-run test).
    design = torch.cat([train_set.x, torch.ones(len(train_set), 1)], dim=1)
    coef = torch.linalg.lstsq(design, train_set.y).solution
    val_design = torch.cat([val_set.x, torch.ones(len(val_set), 1)], dim=1)
    assert F.mse_loss(val_design @ coef, val_set.y).item() > 0.5


def test_datasets_are_deterministic_in_their_seed():
    (a, va), (b, vb) = make_datasets(300, 100, seed=3), make_datasets(300, 100, seed=3)
    (c, _) = make_datasets(300, 100, seed=4)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(va.y, vb.y)
    assert not torch.equal(a.y, c.y)
    assert not torch.equal(a.x[:100], va.x)  # validation inputs are other samples


def test_healthy_setting_learns_and_no_rule_fires():
    reporter = judged_run(config_with())  # the base config: Adam, lr 3e-3, weight_decay 1e-4
    reports = reporter.history

    assert reporter.verdict is None
    assert [r["step"] for r in reports] == list(range(1, 301))
    for r in reports:
        assert all(key in r for key in REQUIRED), sorted(r)
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0 and r["lr"] > 0
    assert [r["step"] for r in reports if "val_loss" in r] == [50, 100, 150, 200, 250, 300]
    final = reports[-1]
    assert final["val_loss"] < 0.5, f"val_loss {final['val_loss']:.3f} not clearly below 1.0"
    assert reports[0]["loss"] > 1.0  # it started at or above the predict-the-mean loss
    assert min(ratio(r) for r in reports[-20:]) > 0.5
    assert final["val_pred_std"] > 0.5  # eval-mode predictions on held-out data vary too


def test_heavy_l2_weight_decay_collapses_the_predictions():
    config = config_with(training={"lr": 1e-2, "weight_decay": 0.3})
    reporter = judged_run(config)

    assert reporter.verdict is not None and reporter.verdict.reason == "collapse"
    assert 20 <= reporter.verdict.step < 150
    assert reporter.verdict.evidence["ratio"] < 0.1
    reports = reporter.history
    assert ratio(reports[0]) > 0.3  # not collapsed at init: training collapsed it
    assert [r["step"] for r in reports] == list(range(1, reporter.verdict.step + 1))
    assert abs(sum(r["loss"] for r in reports[-10:]) / 10 - 1.0) < 0.1  # flat at the mean


def test_the_collapse_is_sustained_not_a_transient():
    reports = plain_run(config_with(training={"lr": 1e-2, "weight_decay": 0.3}))
    assert len(reports) == 300
    assert max(ratio(r) for r in reports[100:]) < 0.05
    assert reports[-1]["val_loss"] > 0.95 and reports[-1]["val_pred_std"] < 0.05


def test_decoupled_decay_at_the_same_setting_does_not_collapse():
    config = config_with(training={"lr": 1e-2, "weight_decay": 0.3, "optimizer": "adamw"})
    reporter = judged_run(config)
    assert reporter.verdict is None
    assert reporter.history[-1]["val_loss"] < 0.5


def test_tiny_head_init_with_a_too_low_lr_collapses():
    config = config_with(model={"head_init_scale": 1e-3}, training={"lr": 1e-5})
    reporter = judged_run(config)
    # the prediction spread creeps up from its tiny start (so collapse, which spares a
    # growing spread, waits), while the loss sits at the mean with no progress: stuck
    assert reporter.verdict is not None
    assert reporter.verdict.reason in ("collapse", "flat_at_baseline")
    assert ratio(reporter.history[-1]) < 0.01

    reports = plain_run(config)  # and it stays there: loss flat at the mean, val no better
    assert max(ratio(r) for r in reports) < 0.05
    assert reports[-1]["val_loss"] > 0.95


def test_reported_stds_are_those_of_the_batch_predictions_and_targets():
    config = config_with(model={"dropout": 0.0}, training={"lr": 1e-3})
    reports = plain_run({**config, "sweep": {"trial_id": "t", "seed": 5, "max_steps": 3}})

    # Rebuild step 1 from the same seed: the model's initial weights and the first batch.
    train_set, _ = make_datasets(8_192, 2_048, seed=0)
    torch.manual_seed(5)
    net = Regressor(24, 6, hidden=128, layers=3, dropout=0.0)
    index = next(shuffled_batches(len(train_set), 128, torch.Generator().manual_seed(5)))
    with torch.no_grad():
        pred = net(train_set.x[index])
    # per-output std over the batch, averaged over outputs (sweeps.trial.monitor.spread)
    assert reports[0]["pred_std"] == pytest.approx(pred.std(dim=0).mean().item(), rel=1e-5)
    assert reports[0]["target_std"] == pytest.approx(
        train_set.y[index].std(dim=0).mean().item(), rel=1e-5)
    assert reports[0]["loss"] == pytest.approx(F.mse_loss(pred, train_set.y[index]).item(), 1e-5)

    long = plain_run(config)
    target_stds = [r["target_std"] for r in long]
    assert all(0.8 < s < 1.2 for s in target_stds)
    assert sum(target_stds) / len(target_stds) == pytest.approx(1.0, abs=0.02)


def test_head_init_scale_and_tanh_shape_the_initial_predictions():
    x = torch.randn(512, 24, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    default = Regressor(24, 6, dropout=0.0)(x).detach()
    torch.manual_seed(0)
    tiny = Regressor(24, 6, dropout=0.0, head_init_scale=1e-3)(x).detach()
    torch.manual_seed(0)
    squashed = Regressor(24, 6, dropout=0.0, output_activation="tanh")(x).detach()
    assert 0.3 < default.std().item() < 1.0  # about half the target std at step 0
    assert tiny.std().item() == pytest.approx(1e-3 * default.std().item(), rel=1e-3)
    assert torch.allclose(squashed, torch.tanh(default))
    assert squashed.abs().max().item() <= 1.0 < default.abs().max().item()


def test_validation_runs_without_dropout_and_restores_training_mode():
    _, val_set = make_datasets(200, 500, seed=0)
    torch.manual_seed(0)
    net = Regressor(24, 6, dropout=0.5)
    first, again = evaluate(net, val_set), evaluate(net, val_set)
    assert first == again and net.training
    with torch.no_grad():
        net.eval()
        pred = net(val_set.x)
    assert first == pytest.approx((F.mse_loss(pred, val_set.y).item(), pred.std().item()))


def test_sweep_section_sets_seed_and_max_steps():
    config = config_with(training={"max_steps": 50})
    first = plain_run({**config, "sweep": {"trial_id": "t1", "seed": 7, "max_steps": 6}})
    again = plain_run({**config, "sweep": {"trial_id": "t2", "seed": 7, "max_steps": 6}})
    other = plain_run({**config, "sweep": {"trial_id": "t3", "seed": 8, "max_steps": 6}})
    assert [r["step"] for r in first] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in first] == [r["loss"] for r in again]
    assert [r["loss"] for r in first] != [r["loss"] for r in other]
    assert "val_loss" in first[-1]  # evaluated at the last step


def test_reported_grad_norm_is_measured_before_clipping():
    reports = plain_run(config_with(training={"grad_clip": 1e-3, "max_steps": 5}))
    assert len(reports) == 5
    assert all(r["grad_norm"] > 1e-3 and r["clipped"] == 1.0 for r in reports)


def test_cosine_restarts_bug_schedule_is_caught_as_an_lr_anomaly():
    config = config_with(training={"schedule": "cosine_restarts_bug", "warmup_steps": 0})
    reporter = judged_run(config)
    assert reporter.verdict is not None and reporter.verdict.reason == "lr_anomaly"
    assert reporter.verdict.evidence["kind"] == "warm_restart"
    assert reporter.verdict.step == 76  # T_0 = 300 // 4 steps, then the jump back up


@pytest.mark.parametrize("schedule", ["warmup_cosine", "constant"])
def test_proper_schedules_pass_the_lr_rule(schedule):
    reporter = judged_run(config_with(training={"schedule": schedule, "max_steps": 120}))
    assert reporter.verdict is None
    lrs = [r["lr"] for r in reporter.history]
    assert lrs[0] < lrs[19] == pytest.approx(3e-3)  # warmup over the first 20 steps
    assert (lrs[-1] == pytest.approx(3e-3)) == (schedule == "constant")


def test_unknown_options_are_rejected_with_their_key():
    for section, key, value in [
        ("model", "output_activation", "sigmoid"),
        ("training", "optimizer", "lion"),
        ("training", "schedule", "linear"),
        ("training", "compile", "fast"),
    ]:
        config = config_with(training={"max_steps": 2})
        config[section][key] = value
        with pytest.raises(ValueError, match=f"{section}.{key}"):
            plain_run(config)
