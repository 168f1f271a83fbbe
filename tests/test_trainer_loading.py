"""Two sweeps in one process whose trainers share a module name each get their own, and a
trainer (or its framework) that swallows the stop and returns still ends unstable."""

from __future__ import annotations

from pathlib import Path

from sweeps.spec.trainer_loader import load_trainer
from sweeps.trial.run import run_trainer
from tests.conftest import copy_sweepfiles, edit_linreg


def _module(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "train.py").write_text(body)
    return folder


def test_two_train_modules_in_one_process_each_load_their_own(tmp_path: Path) -> None:
    a = _module(tmp_path / "a", "def train(config, report):\n    return 'a'\n")
    b = _module(tmp_path / "b", "def train(config, report):\n    return 'b'\n")
    assert load_trainer("train:train", [str(a)])({}, print) == "a"
    assert load_trainer("train:train", [str(b)])({}, print) == "b"
    assert load_trainer("train:train", [str(a)])({}, print) == "a"


def test_a_trainer_that_swallows_the_stop_still_ends_unstable(tmp_path: Path) -> None:
    from sweeps.spec.loader import load_sweep

    folder = copy_sweepfiles(tmp_path)
    (folder / "quiet_trainer.py").write_text(
        "import math\n"
        "def train(config, report):\n"
        "    for step in range(1, 20):\n"
        "        try:\n"
        "            report({'step': step, 'loss': math.nan if step == 5 else 1.0,\n"
        "                    'val_loss': 1.0})\n"
        "        except BaseException:  # a framework that turns the stop into a quiet end\n"
        "            return\n")
    edit_linreg(folder, trainer="quiet_trainer:train")
    sweep = load_sweep(folder / "linreg.yaml", workdir=folder)
    results: list[dict] = []
    reporter = run_trainer(sweep, {"lr": 0.1}, "t1", results.append)
    assert reporter.verdict.reason == "non_finite" and reporter.verdict.step == 5
    assert results[-1]["sweeps/status"] == "unstable"
    assert not any(r.get("sweeps/status") == "ok" for r in results)
