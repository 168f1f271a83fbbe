"""Shared test helpers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pandas as pd
import pytest
import yaml

SWEEPFILES = Path(__file__).parent / "sweepfiles"


def skip_or_fail(reason: str) -> NoReturn:
    """Skip a test whose system dependency (SLURM, Chromium, a Ray with its dashboard) is
    missing; in CI (``CI`` set), where .ci/run installs them, fail instead, so a broken
    install cannot pass as a green run that tested nothing."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: .ci/run should have provided it)")
    pytest.skip(reason)


def copy_sweepfiles(folder: Path) -> Path:
    """Copy the test sweeps, their trainers and configs into ``folder``."""
    for f in SWEEPFILES.iterdir():
        if f.is_file():
            (folder / f.name).write_text(f.read_text())
    return folder


def edit_linreg(folder: Path, train: dict | None = None, **sweep: object) -> None:
    """Change the copied linreg sweep: top-level keys of linreg.yaml (a mapping is merged into
    the one there), and keys of the ``train`` section of linreg_config.yaml."""
    path = folder / "linreg.yaml"
    data = yaml.safe_load(path.read_text())
    for key, value in sweep.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data))
    if train:
        cfg_path = folder / "linreg_config.yaml"
        cfg = yaml.safe_load(cfg_path.read_text())
        cfg["train"].update(train)
        cfg_path.write_text(yaml.safe_dump(cfg))


def run_cli_in(folder: Path, *argv: str) -> int:
    """``sweeps ARGV`` with ``folder`` as the working directory (for module-scope fixtures,
    where monkeypatch.chdir is not available)."""
    import os

    from sweeps.commands.cli import main

    cwd = os.getcwd()
    os.chdir(folder)
    try:
        return main(list(argv))
    finally:
        os.chdir(cwd)


def read_results_csv(path: Path) -> pd.DataFrame:
    """trials.csv / pareto.csv with trial ids as text (a Ray id such as 18693084 is all
    digits, and pandas would read it as a number)."""
    return pd.read_csv(path, dtype={"trial_id": str})


@pytest.fixture
def linreg_dir(tmp_path: Path) -> Path:
    """A copy of the linreg sweep, trainer and config in a fresh folder."""
    return copy_sweepfiles(tmp_path)


def write_sweep(folder: Path, data: dict, name: str = "sweep.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def ray_session():
    """One embedded Ray for a whole test module (2 CPUs), started as ``sweeps run`` starts
    it (a private folder, loopback, its own token), shut down and removed after it."""
    from sweeps.tune.session import ray_running

    with ray_running(num_cpus=2) as session:
        yield session


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test (trainers compared step by step run alike), then
    back to what it was."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Reports(list):
    """A ``report``: the metrics it received, in order, and the checkpoints beside them."""

    def __init__(self) -> None:
        super().__init__()
        self.checkpoints: list[tuple[int, dict]] = []  # (step, state)

    def __call__(self, metrics: dict, checkpoint: dict | None = None) -> None:
        self.append(metrics)
        if checkpoint is not None:
            self.checkpoints.append((metrics["step"], checkpoint))
