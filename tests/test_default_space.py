"""The default search space is found from a sweep file in any folder, and by name."""

from __future__ import annotations

import pytest
import yaml

from sweeps.errors import SpecError
from sweeps.spec.loader import load_sweep

SIX = ["compile", "dropout", "grad_clip", "lr", "warmup", "weight_decay"]


def _write(folder, **extra):
    (folder / "sweep.yaml").write_text(yaml.safe_dump({
        "name": "mine", "trainer": "train:train",
        "write_back": {k: f"t.{k}" for k in SIX}, **extra}))
    return folder / "sweep.yaml"


def test_a_sweep_file_without_search_space_gets_the_shipped_default(tmp_path):
    # no search_spaces/ in the working directory or beside the sweep file
    sweep = load_sweep(_write(tmp_path), workdir=tmp_path, import_trainer=False)
    assert sorted(sweep.space) == SIX


def test_extends_can_name_the_shipped_space(tmp_path):
    path = _write(tmp_path, search_space={"extends": "sweeps:default", "compile": "none",
                                          "lr": {"type": "loguniform", "low": 1e-4,
                                                 "high": 1e-2}})
    sweep = load_sweep(path, workdir=tmp_path, import_trainer=False)
    assert sorted(sweep.space) == SIX and sweep.space["lr"].high == 1e-2
    assert sweep.space["compile"].is_fixed()


def test_a_space_file_of_your_own_wins_and_an_unknown_name_is_an_error(tmp_path):
    (tmp_path / "search_spaces").mkdir()
    (tmp_path / "search_spaces" / "default.yaml").write_text(
        "lr: {type: loguniform, low: 1.0e-3, high: 1.0e-1}\n")
    sweep = load_sweep(_write(tmp_path, write_back={"lr": "t.lr"}), workdir=tmp_path,
                       import_trainer=False)
    assert list(sweep.space) == ["lr"]
    with pytest.raises(SpecError, match="search_space.extends"):
        load_sweep(_write(tmp_path, search_space={"extends": "sweeps:nope"}),
                   workdir=tmp_path, import_trainer=False)
    # a misspelt shipped name is no relative path to check: the name it meant is offered
    with pytest.raises(SpecError) as caught:
        load_sweep(_write(tmp_path, search_space={"extends": "sweeps:defualt"}),
                   workdir=tmp_path, import_trainer=False)
    assert "names no space shipped with sweeps (sweeps:default)" in caught.value.problem
    assert caught.value.fix.startswith("did you mean 'sweeps:default'?")


def test_compile_fixed_at_none_needs_no_write_back(tmp_path):
    """A Hydra user extending the default space with ``compile: none`` and a trainer that
    never compiles was refused for want of write_back.compile until writing null."""
    path = _write(tmp_path, search_space={"extends": "sweeps:default", "compile": "none"})
    data = yaml.safe_load(path.read_text())
    data["write_back"].pop("compile", None)
    path.write_text(yaml.safe_dump(data))
    sweep = load_sweep(path, workdir=tmp_path, import_trainer=False)
    assert "compile" not in sweep.space and sorted(sweep.space) == sorted(set(SIX) - {"compile"})
