"""A note when ASHA cut higher-LR configs, close behind the best, before their LR decayed."""

from __future__ import annotations

import math
from pathlib import Path

from sweeps.record.book import TrialRecord
from sweeps.results.asha_decay import cut_before_decay
from tests.unit.conftest import book_of, load_linreg


def _trial(trial_id: str, lr: float, status: str, steps: int, val: float) -> TrialRecord:
    """A warmup-cosine run to 200 steps (cut at ``steps``), its val_loss ``val`` at the end
    of what it ran, reported every 50 steps."""
    history = []
    for s in range(1, steps + 1):
        report = {"step": s, "loss": 1.0, "lr": lr * 0.5 * (1 + math.cos(math.pi * s / 200))}
        if s % 50 == 0:
            report["val_loss"] = val * (1.5 if s < steps else 1.0)
        history.append(report)
    return TrialRecord(trial_id, {"lr": lr}, 0, history=history, status=status,
                       finished=True)


def test_asha_cutting_higher_lrs_close_behind_under_a_decay_is_noted(tmp_path: Path) -> None:
    """A Lightning pendulum model: ASHA cut the high-LR cosine configs at steps 50 and
    100, which ended best when run to their end."""
    sweep = load_linreg(tmp_path, budget={"trials": 8, "max_steps": 200, "scheduler": "asha"})
    best = _trial("best", 0.004, "ok", 200, 0.0135)
    close = _trial("close", 0.03, "pruned", 100, 0.021)  # best read 0.02 at step 100
    far = _trial("far", 0.05, "pruned", 100, 0.5)
    lower = _trial("lower", 0.001, "pruned", 100, 0.021)
    note = cut_before_decay(book_of(sweep, best, close, far, lower))
    assert note is not None and note.startswith(
        "ASHA cut 1 trial(s) (close) sampled at a higher lr than the best search trial's by "
        "its search run (best, lr 0.004)")
    assert "where their LR was still at 50%-50% of its peak" in note
    assert "decayed to 0% of its peak" in note and "budget.scheduler: none" in note
    assert cut_before_decay(book_of(sweep, best, far, lower)) is None
    flat = TrialRecord("flat", {"lr": 0.004}, 0, status="ok", finished=True,
                       history=[dict(r, lr=0.004) for r in best.history])
    assert cut_before_decay(book_of(sweep, flat, close)) is None  # no decay: no bias
    fifo = load_linreg(tmp_path / "fifo", budget={"trials": 8, "scheduler": "none"})
    assert cut_before_decay(book_of(fifo, best, close)) is None


def test_an_lr_is_compared_only_within_one_optimizer(tmp_path: Path) -> None:
    """A Hydra user searched optim: [adamw, sgd]; the note called SGD trials at lr 0.03
    "a higher lr" than the best AdamW trial's 0.009."""
    sweep = load_linreg(tmp_path, budget={"trials": 8, "max_steps": 200, "scheduler": "asha"},
                        search_space={"lr": {"type": "loguniform", "low": 1e-4, "high": 1.0},
                                      "optim": {"type": "categorical",
                                                "choices": ["adamw", "sgd"]}},
                        write_back={"lr": "train.lr", "optim": "train.fail"})
    best = _trial("best", 0.004, "ok", 200, 0.0135)
    close = _trial("close", 0.03, "pruned", 100, 0.021)
    best.values["optim"], close.values["optim"] = "adamw", "sgd"
    assert cut_before_decay(book_of(sweep, best, close)) is None
    close.values["optim"] = "adamw"
    assert cut_before_decay(book_of(sweep, best, close)) is not None
