"""Write-back: chosen knob values merged into the user's own base config."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from sweeps.results.export import config_for, render, write_config
from sweeps.spec.loader import Sweep


def test_config_for_sets_write_back_paths_only(linreg_sweep: Sweep) -> None:
    config = config_for(linreg_sweep, {"lr": 0.003})
    assert config["train"]["lr"] == 0.003
    assert config["notes"] == {"owner": "someone", "tags": ["a", "b"]}
    assert "sweep" not in config and "lr" not in config
    assert linreg_sweep.base_config["train"]["lr"] == 0.1


def test_render_header_then_the_user_layout(linreg_sweep: Sweep) -> None:
    text = render(linreg_sweep, {"lr": 0.0123456789},
                  {"trial": "abc", "val_loss": 0.123456789, "seeds": {"mean": 0.5, "n": 3}})
    head, *rest = text.splitlines()
    assert re.fullmatch(r"# Written by sweeps \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ for sweep "
                        r"'linreg' \(.*linreg\.yaml\)", head)
    assert rest[:3] == ["# trial: abc", "# val_loss: 0.123457", "# seeds: mean=0.5, n=3"]
    data = yaml.safe_load(text)
    assert list(data) == ["experiment", "train", "notes"]
    assert data["train"]["lr"] == 0.0123456789  # the value itself is written in full


def test_write_config_writes_atomically_and_reads_back(linreg_sweep: Sweep,
                                                       tmp_path: Path) -> None:
    path = tmp_path / "out" / "best.yaml"
    assert write_config(path, linreg_sweep, {"lr": 0.5}, {}) == path
    assert yaml.safe_load(path.read_text())["train"]["lr"] == 0.5
    assert sorted(p.name for p in path.parent.iterdir()) == ["best.overrides", "best.yaml"], \
        "no temporary file left behind"
    assert path.with_suffix(".overrides").read_text() == "train.lr=0.5\n"
