"""The trainer API as the README shows it: `sweeps.Report`, `sweeps.TrialInfo` and
`sweeps.TrialStopped` from the top level; the README's trainer, run as written (with its
four helpers filled in) by the real trial runner, at grad_clip 0 and 1 and at a diverging LR."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

import sweeps
from sweeps.spec.loader import load_sweep_dict
from sweeps.trial.run import run_trainer

README = Path(__file__).resolve().parent.parent / "README.md"

HELPERS = '''

def build_model(cfg):
    return torch.nn.Sequential(torch.nn.Linear(8, cfg["width"]), torch.nn.Tanh(),
                               torch.nn.Linear(cfg["width"], 1))


_X = torch.randn(512, 8, generator=torch.Generator().manual_seed(1))
_Y = _X @ torch.randn(8, 1, generator=torch.Generator().manual_seed(2))
_Y = _Y / _Y.std()


def batches(config, device):
    while True:
        for i in range(0, 512, 64):
            yield _X[i:i + 64].to(device), _Y[i:i + 64].to(device)


loss_fn = torch.nn.functional.mse_loss


def evaluate(model):
    with torch.no_grad():
        return float(loss_fn(model(_X), _Y))


SEEN = []
_train = train


def train(config, report):
    SEEN.append(dict(config["sweep"]))
    _train(config, report)
'''


def _readme_trainer() -> str:
    text = README.read_text()
    section = text[text.index("## A trainer"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def sweep(tmp_path):
    (tmp_path / "readme_train.py").write_text(_readme_trainer() + HELPERS)
    return load_sweep_dict({
        "name": "readme", "trainer": "readme_train:train",
        "base_config": {"model": {"width": 16}, "training": {"lr": 0.01, "grad_clip": 0}},
        "search_space": {"lr": {"type": "loguniform", "low": 1e-4, "high": 10.0},
                         "grad_clip": {"type": "categorical", "choices": [0, 1.0]}},
        "write_back": {"lr": "training.lr", "grad_clip": "training.grad_clip"},
        "rules": {"baseline_loss": 1.0}, "budget": {"max_steps": 60}},
        base_dir=tmp_path, workdir=tmp_path)


def test_the_public_names_are_the_ones_the_runner_uses():
    from sweeps.reporter import TrialStopped as old_path
    from sweeps.trial.reporter import TrialStopped

    assert sweeps.TrialStopped is TrialStopped is old_path
    assert issubclass(sweeps.TrialStopped, BaseException)
    assert not issubclass(sweeps.TrialStopped, Exception), "a trainer's except Exception"
    assert isinstance(sweeps.Report, type) and getattr(sweeps.Report, "_is_protocol", False)
    assert set(typing.get_type_hints(sweeps.TrialInfo)) == {
        "trial_id", "seed", "max_steps", "device", "gpu_ids", "checkpoint"}


@pytest.mark.parametrize("grad_clip", [0, 1.0])
def test_the_readme_trainer_runs_as_written(sweep, grad_clip):
    import readme_train

    results: list[dict] = []
    reporter = run_trainer(sweep, {"lr": 0.01, "grad_clip": grad_clip}, "t1", results.append)
    assert reporter.verdict is None and results[-1]["sweeps/status"] == "ok"
    steps = [r["step"] for r in reporter.history]
    assert steps == list(range(1, 61)) and "val_loss" in reporter.history[-1]
    assert ("clipped" in reporter.history[0]) == bool(grad_clip)
    assert set(readme_train.SEEN[-1]) == set(typing.get_type_hints(sweeps.TrialInfo)), \
        "config['sweep'] holds exactly what TrialInfo says"


def test_a_diverging_lr_stops_the_readme_trainer_on_its_step(sweep):
    results: list[dict] = []
    reporter = run_trainer(sweep, {"lr": 10.0, "grad_clip": 0}, "t2", results.append)
    assert reporter.verdict is not None and results[-1]["sweeps/status"] == "unstable"
    assert reporter.history[-1]["step"] == reporter.verdict.step < 60


def test_an_audit_rerun_goes_through_the_same_runner(sweep):
    """`sweeps audit` re-runs a trial with the one trial runner: its trainer gets the same
    config["sweep"] (the device included, which the audit's own copy never set), and the
    rules only watch: a diverging run goes on to the end with its first verdict kept."""
    import readme_train

    from sweeps.results.audit import Rerun, rerun

    done = rerun(sweep, Rerun("t3", "non_finite", 5, {"lr": 10.0, "grad_clip": 0}, 0), 40)
    assert set(readme_train.SEEN[-1]) == set(typing.get_type_hints(sweeps.TrialInfo))
    assert readme_train.SEEN[-1]["device"] == "cpu" and readme_train.SEEN[-1]["max_steps"] == 40
    assert done.verdict_reason is not None and done.verdict_step < 40
    assert done.history[-1]["step"] == 40, "the rules only watched"
