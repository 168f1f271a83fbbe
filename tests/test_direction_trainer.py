"""The reference trainer: it learns, it reports what the rules need, and it lets them stop it."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import yaml

from sweeps.trainers import direction
from sweeps.trainers.direction import (
    angular_distance,
    feature_stats,
    make_dataset,
    normalized,
    train,
)

BASE_CONFIG = Path(__file__).resolve().parents[1] / "examples" / "configs" / "direction.yaml"
REQUIRED = ("step", "loss", "grad_norm", "lr", "nonfinite_grads", "dead_params", "clipped")


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every test here trains with one torch thread (see tests/conftest.py)."""


def small_config(**sections) -> dict:
    """The shipped base config, shrunk so a run takes a second or two, plus overrides."""
    with open(BASE_CONFIG) as f:
        config = yaml.safe_load(f)
    config["data"].update(n_events=2_000, n_val=300)
    config["model"].update(d_model=16, heads=2, dropout=0.0)
    config["training"].update(max_steps=30, eval_every=10, warmup_steps=5, batch_size=32)
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    return config


def run(config: dict) -> list[dict]:
    reports: list[dict] = []
    train(copy.deepcopy(config), reports.append)
    return reports


def test_base_config_has_the_documented_layout():
    with open(BASE_CONFIG) as f:
        config = yaml.safe_load(f)
    assert set(config) == {"data", "model", "training"}
    for key in ("lr", "grad_clip", "weight_decay", "warmup_steps", "compile", "schedule"):
        assert key in config["training"]
    assert config["model"]["dropout"] > 0
    assert config["data"]["normalize_inputs"] is True


def test_learns_at_a_good_lr_and_reports_every_step():
    config = small_config(
        data={"n_events": 6_000, "n_val": 500},
        model={"d_model": 32, "heads": 4, "dropout": 0.1},
        training={
            "lr": 3e-3,
            "max_steps": 150,
            "eval_every": 50,
            "warmup_steps": 15,
            "batch_size": 64,
        },
    )
    reports = run(config)

    assert [r["step"] for r in reports] == list(range(1, 151))
    for r in reports:
        assert all(key in r for key in REQUIRED), sorted(r)
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0 and r["lr"] > 0
        assert r["step_time"] > 0 and "compile_s" not in r
    assert [r["step"] for r in reports if "val_loss" in r] == [50, 100, 150]
    final = reports[-1]["val_loss"]
    assert final < 1.0, f"val_loss {final:.3f} not clearly below pi/2"
    assert reports[0]["loss"] > 1.3  # it started near the random baseline


def test_reported_grad_norm_is_measured_before_clipping():
    reports = run(small_config(training={"grad_clip": 0.01, "max_steps": 5}))
    assert len(reports) == 5
    for r in reports:
        assert r["grad_norm"] > 0.01  # a post-clip norm could not exceed the clip
        assert r["clipped"] == 1.0


def test_no_clipping_when_grad_clip_is_zero_or_null():
    for clip in (0, None):
        reports = run(small_config(training={"grad_clip": clip, "max_steps": 3}))
        assert [r["clipped"] for r in reports] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["pred_equals_target", "pred_opposite"])
def test_angular_loss_gradient_is_finite_at_exact_match(sign):
    target = torch.eye(3)  # dot products of exactly +-1
    pred = (sign * target).requires_grad_()
    loss = angular_distance(pred, target)
    loss.sum().backward()
    assert torch.isfinite(pred.grad).all()
    expected = 0.0 if sign > 0 else math.pi
    assert torch.allclose(loss.detach(), torch.full((3,), expected), atol=3e-3)

    # The inputs do reach the hazard: with the cosine clamped to exactly +-1 they give NaN.
    naive = (sign * target).requires_grad_()
    angular_distance(naive, target, eps=0.0).sum().backward()
    assert not torch.isfinite(naive.grad).all()


def test_angular_loss_is_pi_over_2_for_random_predictions():
    g = torch.Generator().manual_seed(0)
    pred, target = torch.randn(20_000, 3, generator=g), torch.randn(20_000, 3, generator=g)
    target = target / target.norm(dim=1, keepdim=True)
    assert abs(angular_distance(pred, target).mean().item() - math.pi / 2) < 0.02


def test_dataset_has_raw_scales_and_normalises_to_unit_scale():
    events = make_dataset(3_000, seed=1)
    assert events.features.shape == (3_000, 40, 6) and events.mask.shape == (3_000, 40)
    counts = events.mask.sum(1)
    assert counts.min() >= 8 and counts.max() <= 40
    assert torch.allclose(events.target.norm(dim=1), torch.ones(3_000), atol=1e-5)
    assert (events.features[~events.mask] == 0).all()

    pulses = events.features[events.mask]
    time, charge, aux, xyz = pulses[:, 0], pulses[:, 1], pulses[:, 2], pulses[:, 3:]
    assert 4.9e3 <= time.min() and time.max() <= 8.0e4 and 8e3 < time.median() < 1.5e4
    assert time.max() > 5e4  # late noise pulses reach far into the window
    assert 0.02 <= charge.min() and charge.max() > 500 and charge.median() < 20
    assert set(aux.unique().tolist()) == {0.0, 1.0}
    assert 300 < xyz.abs().max() <= 500

    stats = feature_stats(events)
    scaled = normalized(events, stats).features[events.mask]
    assert scaled.mean(0).abs().max() < 1e-3
    assert (scaled.std(0) - 1).abs().max() < 1e-3
    held_out = normalized(make_dataset(1_000, seed=2), stats)
    assert held_out.features[held_out.mask].mean(0).abs().max() < 0.2  # train stats fit


def test_dataset_is_deterministic_in_its_seed():
    a, b, c = make_dataset(200, seed=3), make_dataset(200, seed=3), make_dataset(200, seed=4)
    assert torch.equal(a.features, b.features) and torch.equal(a.target, b.target)
    assert not torch.equal(a.target, c.target)


def test_shuffle_is_one_permutation_per_epoch():
    batches = direction.shuffled_batches(10, 3, torch.Generator().manual_seed(0))
    epoch = torch.cat([next(batches) for _ in range(3)])  # 3 full batches; the last 1 dropped
    assert len(epoch) == 9 and len(set(epoch.tolist())) == 9
    assert not torch.equal(epoch, torch.arange(9))


def _lrs(schedule: str) -> list[float]:
    config = small_config(training={"schedule": schedule, "max_steps": 40, "eval_every": 40})
    return [r["lr"] for r in run(config)]


def test_cosine_restarts_bug_jumps_back_up_after_decaying():
    lrs = _lrs("cosine_restarts_bug")
    jumps = [i for i in range(1, len(lrs)) if lrs[i] > 2 * lrs[i - 1]]
    assert jumps, lrs
    assert min(lrs[: jumps[0]]) < 0.5 * max(lrs)  # it had decayed before the jump


def test_warmup_cosine_rises_then_only_decays():
    lrs = _lrs("warmup_cosine")
    peak = lrs.index(max(lrs))
    assert peak == 4  # the last of the 5 warmup steps
    assert all(a < b for a, b in zip(lrs[:peak], lrs[1 : peak + 1], strict=True))
    assert all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1 :], strict=False))
    assert lrs[0] > 0 and lrs[-1] == pytest.approx(0.1 * max(lrs), rel=0.2)


def test_constant_schedule_is_flat_after_warmup():
    lrs = _lrs("constant")
    assert len(set(lrs[4:])) == 1 and lrs[0] < lrs[4]


class StopTrial(BaseException):
    """What a runner might raise out of report to end a trial."""


def test_exception_from_report_stops_training_at_that_step():
    seen: list[int] = []

    def report(metrics: dict) -> None:
        seen.append(metrics["step"])
        if metrics["step"] == 5:
            raise StopTrial

    with pytest.raises(StopTrial):
        train(small_config(), report)
    assert seen == [1, 2, 3, 4, 5]


def test_non_finite_loss_is_reported_not_skipped(monkeypatch):
    real = direction.make_dataset

    def poisoned(n_events, seed, **kwargs):
        events = real(n_events, seed, **kwargs)
        events.features[:, 0, 0] = float("inf")
        return events

    monkeypatch.setattr(direction, "make_dataset", poisoned)
    reports = run(small_config(training={"max_steps": 4}))
    assert [r["step"] for r in reports] == [1, 2, 3, 4]
    assert not math.isfinite(reports[0]["loss"])


def test_sweep_section_sets_seed_and_max_steps():
    config = small_config(training={"max_steps": 50})
    first = run({**config, "sweep": {"trial_id": "t1", "seed": 7, "max_steps": 6}})
    again = run({**config, "sweep": {"trial_id": "t2", "seed": 7, "max_steps": 6}})
    other = run({**config, "sweep": {"trial_id": "t3", "seed": 8, "max_steps": 6}})
    assert [r["step"] for r in first] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in first] == [r["loss"] for r in again]
    assert [r["loss"] for r in first] != [r["loss"] for r in other]
    assert "val_loss" in first[-1]  # evaluated at the last step


def test_report_every_still_reports_eval_and_last_steps():
    config = small_config(training={"max_steps": 25, "eval_every": 20, "report_every": 10})
    reports = run(config)
    assert [r["step"] for r in reports] == [10, 20, 25]
    assert [("val_loss" in r) for r in reports] == [False, True, True]


def test_unknown_schedule_or_compile_mode_is_rejected():
    with pytest.raises(ValueError, match="training.schedule"):
        run(small_config(training={"schedule": "linear"}))
    with pytest.raises(ValueError, match="training.compile"):
        run(small_config(training={"compile": "fast"}))


# --------------------------------------------------------------------------- unstable options


def _layer_norms(model: torch.nn.Module) -> int:
    return sum(isinstance(m, torch.nn.LayerNorm) for m in model.modules())


def test_norm_option_places_the_layer_norms():
    counts = {
        n: _layer_norms(direction.DirectionModel(layers=(1, 1), norm=n)) for n in direction.NORMS
    }
    assert counts == {"pre": 6, "post": 4, "none": 0}  # pre adds a final norm per level
    features = torch.randn(2, 5, 6)
    mask, sensor = torch.ones(2, 5, dtype=torch.bool), torch.arange(5).repeat(2, 1)
    for norm in direction.NORMS:
        out = direction.DirectionModel(norm=norm)(features, mask, sensor)
        assert out.shape == (2, 3) and torch.isfinite(out).all()


def test_every_norm_and_optimizer_trains_finitely_on_normalised_inputs():
    for norm in direction.NORMS:
        reports = run(small_config(model={"norm": norm}, training={"max_steps": 5}))
        assert all(math.isfinite(r["loss"]) for r in reports), norm
    reports = run(small_config(training={"optimizer": "sgd", "lr": 0.05, "max_steps": 5}))
    assert all(math.isfinite(r["loss"]) for r in reports)


def test_sgd_has_momentum():
    sgd = direction.make_optimizer(
        [torch.nn.Parameter(torch.ones(1))], "sgd", lr=0.1, weight_decay=0
    )
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["momentum"] == 0.9


def test_unknown_norm_or_optimizer_is_rejected():
    with pytest.raises(ValueError, match="model.norm"):
        run(small_config(model={"norm": "batch"}))
    with pytest.raises(ValueError, match="training.optimizer"):
        run(small_config(training={"optimizer": "adam"}))


def mlp_config(**training) -> dict:
    """The MLP with the vMF loss (model.kind: mlp, training.loss: vmf)."""
    return small_config(
        data={"n_events": 5_000, "n_val": 500},
        model={"kind": "mlp", "hidden": 128, "layers": 2, "dropout": 0.0},
        training={"loss": "vmf", "max_steps": 300, "eval_every": 100, "warmup_steps": 20,
                  "batch_size": 64, "grad_clip": 0, **training},
    )


def test_mlp_with_vmf_loss_learns_on_normalised_inputs():
    reports = run(mlp_config(lr=1e-2, optimizer="adamw"))
    final = reports[-1]["val_loss"]  # the mean angle, whatever the training loss
    assert final < 0.5, f"val_loss {final:.3f} not clearly below pi/2"
    assert reports[0]["loss"] == pytest.approx(math.log(4 * math.pi), abs=0.3)  # random vMF


def test_mlp_with_vmf_loss_goes_non_finite_at_a_high_sgd_lr():
    reports = run(mlp_config(lr=1.0, optimizer="sgd"))
    assert any(not math.isfinite(r["loss"]) for r in reports)
    healthy = run(mlp_config(lr=1e-2, optimizer="sgd"))
    assert all(math.isfinite(r["loss"]) for r in healthy)


def test_vmf_loss_needs_the_mlp():
    with pytest.raises(ValueError, match="training.loss: vmf needs model.kind: mlp"):
        run(small_config(training={"loss": "vmf"}))
