"""Shared test helpers."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

SWEEPFILES = Path(__file__).parent / "sweepfiles"


@pytest.fixture
def linreg_dir(tmp_path: Path) -> Path:
    """A copy of the linreg sweep, trainer and config in a fresh folder."""
    for f in SWEEPFILES.iterdir():
        if f.is_file():
            (tmp_path / f.name).write_text(f.read_text())
    return tmp_path


def write_sweep(folder: Path, data: dict, name: str = "sweep.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def ray_session():
    """One Ray instance for a whole test module (2 CPUs), shut down cleanly after it."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
