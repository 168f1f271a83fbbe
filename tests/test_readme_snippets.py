"""The Monitor snippet of docs/trainers.md, run as written, is right for every grad_clip
the shipped spaces sample (0 = no clipping, and a real threshold), for a regressor and a
classifier; and the mistake it warns of (clip_grad_norm_ at 0) is reported, not silent."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch

from sweeps import Monitor

TRAINERS = Path(__file__).resolve().parent.parent / "docs" / "trainers.md"


def _snippet() -> str:
    text = TRAINERS.read_text()
    section = text[text.index("### Adding `sweeps.Monitor` to an existing training loop"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _run(kind: str, grad_clip: float, lr: float = 0.05, steps: int = 50) -> list[dict]:
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    if kind == "regressor":
        y = x @ torch.randn(8, 1)
        model, loss_fn = torch.nn.Linear(8, 1), torch.nn.functional.mse_loss
    else:
        y = (x[:, 0] > 0).long()
        model, loss_fn = torch.nn.Linear(8, 2), torch.nn.functional.cross_entropy
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    reports: list[dict] = []
    namespace = {
        "model": model, "optimizer": optimizer, "loss_fn": loss_fn,
        "loader": [(x[i:i + 32], y[i:i + 32]) for i in range(0, 256, 32)] * 10,
        "scheduler": torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0),
        "evaluate": lambda m: float(loss_fn(m(x), y).detach()),
        "cfg": {"training": {"compile": "none", "grad_clip": grad_clip},
                "sweep": {"max_steps": steps}},
        "report": reports.append,
    }
    exec(compile(_snippet(), str(TRAINERS), "exec"), namespace)  # noqa: S102 - our own docs
    return reports


@pytest.mark.parametrize("kind", ["regressor", "classifier"])
@pytest.mark.parametrize("grad_clip", [0, 1.0])
def test_the_readme_snippet_trains_at_every_clip_the_spaces_sample(kind, grad_clip):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no zeroed-gradient warning
        reports = _run(kind, grad_clip)
    assert [r["step"] for r in reports] == list(range(1, 51)), "it stops at max_steps"
    assert all(r["grad_norm"] > 0 and r["lr"] == 0.05 for r in reports)
    assert not any("zeroed_grads" in r for r in reports)
    assert reports[-1]["loss"] < 0.8 * reports[0]["loss"], "it learns"
    assert ("clipped" in reports[0]) == bool(grad_clip)
    assert ("pred_std" in reports[0]) == (kind == "regressor")
    assert "val_loss" in reports[49] and "val_loss" not in reports[48]


def test_a_clip_to_zero_is_reported_not_taken_for_a_flat_run():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Monitor(model, opt, grad_clip=0)
    seen = []
    with pytest.warns(RuntimeWarning, match="clip_grad_norm_"):
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(torch.randn(16, 4)), torch.ones(16, 1))
            loss.backward()
            seen.append(monitor.measure(loss))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0)  # the mistake
            opt.step()
    assert "zeroed_grads" not in seen[0] and seen[1]["zeroed_grads"] == 1.0
    assert "clipped" not in seen[0], "0 is no clipping, not a clip on every step"


def test_a_loop_without_an_optimizer_passes_its_lr():
    model = torch.nn.Linear(4, 1)
    monitor = Monitor(model)
    loss = model(torch.ones(2, 4)).sum()
    loss.backward()
    assert monitor.measure(loss, lr=0.3)["lr"] == 0.3
    assert "lr" not in monitor.measure(loss)
    with pytest.raises(ValueError, match="grad_clip"):
        Monitor(model, grad_clip=-1)
