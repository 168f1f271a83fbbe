"""The Monitor reads the grad norm before clipping and zero_grad, and the real LR."""

from __future__ import annotations

import math

import pytest
import torch

from sweeps import Monitor


def _step(model, opt, monitor, clip=None, x_scale=1.0):
    x = torch.randn(32, 4) * x_scale
    loss = torch.nn.functional.mse_loss(model(x), torch.ones(32, 1))
    opt.zero_grad()
    loss.backward()
    metrics = monitor.measure(loss)
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return metrics


def test_grad_norm_is_pre_clip_and_non_zero():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = Monitor(model, opt, grad_clip=0.01)
    x = torch.randn(32, 4) * 10
    loss = torch.nn.functional.mse_loss(model(x), torch.full((32, 1), 5.0))
    loss.backward()
    expected = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in model.parameters()])).item()
    metrics = monitor.measure(loss)
    clipped_total = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01).item()
    after = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in model.parameters()])).item()
    assert metrics["grad_norm"] == pytest.approx(expected, rel=1e-5)
    assert metrics["grad_norm"] > 0.01 * 10, "the reported norm must be the pre-clip value"
    assert clipped_total == pytest.approx(expected, rel=1e-5)
    assert after == pytest.approx(0.01, rel=1e-3)
    assert metrics["clipped"] == 1.0
    assert metrics["loss"] == pytest.approx(loss.item())


def test_grad_norm_after_zero_grad_would_be_zero_but_monitor_is_not():
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Monitor(model, opt)
    metrics = _step(model, opt, monitor)
    assert metrics["grad_norm"] > 0
    opt.zero_grad(set_to_none=False)
    assert monitor.grad_stats()[0] == 0.0  # the bug users hit: measuring after zero_grad


def test_lr_is_the_optimizer_value_under_a_scheduler():
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)
    monitor = Monitor(model, opt)
    lrs = []
    for _ in range(3):
        lrs.append(_step(model, opt, monitor)["lr"])
        sched.step()
    assert lrs == [1.0, 0.5, 0.25]


def test_non_finite_grads_are_counted_and_dead_params_found():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    frozen_out = torch.nn.Linear(2, 1)  # a parameter that never receives a gradient
    params = [*model.parameters(), *frozen_out.parameters()]
    monitor = Monitor(params)
    loss = model(torch.tensor([[float("inf"), 1.0]])).sum()
    loss.backward()
    metrics = monitor.measure(loss, pred=torch.zeros(4), target=torch.arange(4.0))
    assert not math.isfinite(metrics["grad_norm"])
    assert metrics["nonfinite_grads"] > 0
    assert metrics["dead_params"] == 2
    assert metrics["pred_std"] == 0.0 and metrics["target_std"] > 1
    assert "lr" not in metrics


def test_parameters_the_optimizer_holds_frozen_are_counted():
    """A backbone frozen by accident (``requires_grad_(False)``, still in the optimizer):
    ``dead_params`` counts trainable parameters only, so it read 0 on every report."""
    backbone, head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    model = torch.nn.Sequential(backbone, torch.nn.ReLU(), head)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    backbone.requires_grad_(False)
    monitor = Monitor(model, opt)
    model(torch.ones(2, 4)).sum().backward()
    metrics = monitor.measure()
    assert metrics["frozen_params"] == 2 and metrics["dead_params"] == 0
    meant = Monitor(model, torch.optim.SGD(head.parameters(), lr=0.1))  # frozen on purpose
    assert "frozen_params" not in meant.measure()
    assert "frozen_params" not in Monitor(model).measure(), "no optimizer: nothing to tell"


def test_class_labels_get_no_collapse_spread():
    model = torch.nn.Linear(4, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Monitor(model, opt)
    x, labels = torch.randn(32, 4), torch.randint(0, 10, (32,))
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, labels)
    loss.backward()
    metrics = monitor.measure(loss, pred=logits, target=labels)
    assert "pred_std" not in metrics and "target_std" not in metrics
    assert metrics["grad_norm"] > 0
    regression = monitor.measure(loss, pred=logits, target=torch.randn(32, 10))
    assert regression["target_std"] > 0 and "pred_std" in regression


def test_a_monitor_per_step_leaves_no_hooks_behind():
    """One step pre-hook per live Monitor: a loop that builds a Monitor every step (as an
    integration might) does not pile hooks onto the optimizer."""
    import gc

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(50):
        Monitor(model, opt)
    gc.collect()
    assert len(opt._optimizer_step_pre_hooks) <= 1


def test_clip_before_measure_is_reported_and_the_right_order_is_not():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = Monitor(model, opt, grad_clip=0.01)

    def step(clip_first: bool) -> dict:
        loss = torch.nn.functional.mse_loss(model(torch.randn(32, 4) * 10),
                                            torch.full((32, 1), 5.0))
        opt.zero_grad()
        loss.backward()
        if clip_first:
            monitor.clip()
        metrics = monitor.measure(loss)
        if not clip_first:
            monitor.clip()
        opt.step()
        return metrics

    right = [step(clip_first=False) for _ in range(3)]
    assert all("clipped_before_measure" not in m for m in right)
    wrong = step(clip_first=True)
    assert wrong["clipped_before_measure"] == 1.0
    assert wrong["grad_norm"] == pytest.approx(0.01, rel=1e-3), "the clipped norm it measured"
    assert "clipped_before_measure" not in step(clip_first=False)


def test_a_step_the_grad_scaler_skips_is_no_clip_before_measure():
    """``GradScaler.step`` skips ``optimizer.step()`` when the unscaled gradients hold inf:
    the clip of that step ran, no step followed, and the next measure is still in order."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)  # overflows at first
    monitor = Monitor(model, opt, grad_clip=1.0)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    flags, skipped = [], []
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        metrics = monitor.measure(loss)
        flags.append(metrics.get("clipped_before_measure", 0.0))
        skipped.append(not math.isfinite(metrics["grad_norm"]))
        monitor.clip()
        scaler.step(opt)
        scaler.update()
    assert skipped[0], "the first step overflowed and was skipped"
    assert flags == [0.0, 0.0, 0.0]
