"""The package built as a wheel carries its data: installed (not editable) into a fresh venv,
``sweeps validate`` finds the default search space and ``sweeps slurm`` its template from a
folder outside the repository."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = ("sweeps/search_spaces/default.yaml", "sweeps/cluster/sweep.sbatch")
SIX = ["compile", "dropout", "grad_clip", "lr", "warmup", "weight_decay"]



def _run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the sources (the build leaves no files in the tree)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("whl")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "sweeps", src / "sweeps", ignore=shutil.ignore_patterns("__pycache__"))
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", out, src, cwd=src)
    (found,) = out.glob("sweeps-*.whl")
    return found


def test_the_wheel_holds_the_default_space_and_the_slurm_template(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(DATA) <= names
    with zipfile.ZipFile(wheel) as z:
        assert "@@NODES@@" in z.read("sweeps/cluster/sweep.sbatch").decode()


def _installed(wheel: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A fresh venv holding the wheel (not editable), and an environment without this
    checkout on PYTHONPATH."""
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    py = venv / "bin" / "python"
    site = Path(_run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                     cwd=tmp_path).strip())
    # the dependencies (torch, ray, optuna…) from this environment, after the venv's own
    # packages: its .pth files (this checkout's editable install) are not read
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no checkout on the path
    _run(sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", wheel,
         cwd=tmp_path, env=env)
    return venv, env


def test_installed_wheel_validates_and_renders_slurm_outside_the_repo(wheel, tmp_path):
    venv, env = _installed(wheel, tmp_path)
    py = venv / "bin" / "python"
    work = tmp_path / "work"
    work.mkdir()
    (work / "my_train.py").write_text("def train(config, report):\n    report({'loss': 1.0})\n")
    (work / "sweep.yaml").write_text(yaml.safe_dump({
        "name": "outside", "trainer": "my_train:train",
        "write_back": {k: f"t.{k}" for k in SIX}}))

    where = _run(py, "-c", "import sweeps.cluster.slurm_render as r; print(r.TEMPLATE)",
                 cwd=work, env=env)
    assert Path(where.strip()).is_relative_to(venv) and Path(where.strip()).is_file()
    out = _run(venv / "bin" / "sweeps", "validate", "sweep.yaml", cwd=work, env=env)
    assert "valid" in out and all(f"{k} (" in out for k in SIX)
    out = _run(venv / "bin" / "sweeps", "slurm", work / "sweep.yaml", "--nodes", "1",
               "--dry-run", cwd=work, env=env)
    assert "#SBATCH --nodes=1" in out and "@@" not in out and "dry run: nothing written" in out
    assert not (work / "results").exists()
    # the reference trainers come inside the package, not as a generic top-level name
    found = _run(py, "-c", "import importlib.util as u; print(u.find_spec('trainers') is None, "
                 "u.find_spec('sweeps.trainers.direction').origin)", cwd=work, env=env).split()
    assert found[0] == "True" and Path(found[1]).is_relative_to(venv)


TINY_TRAINER = """\
def train(config, report):
    lr, loss = config["t"]["lr"], 1.0
    for step in range(1, config["sweep"]["max_steps"] + 1):
        loss *= 1 - min(lr, 0.5) * 0.1
        report({"step": step, "loss": loss, "val_loss": loss, "grad_norm": 1.0,
                "lr": lr})
"""


@pytest.mark.slow
def test_installed_wheel_runs_a_sweep_extending_the_default_space(wheel, tmp_path):
    """Installed as a wheel, outside the repository: a tiny sweep whose space extends the
    shipped default runs on Ray, and its trials and YAMLs come out under the folder."""
    venv, env = _installed(wheel, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny_train.py").write_text(TINY_TRAINER)
    (work / "base.yaml").write_text(yaml.safe_dump({"t": {k: 0 for k in SIX}}))
    (work / "sweep.yaml").write_text(yaml.safe_dump({
        "name": "tiny", "trainer": "tiny_train:train", "base_config": "base.yaml",
        "search_space": {"extends": "sweeps:default", "compile": "none"},
        "write_back": {k: f"t.{k}" for k in SIX},
        "objectives": [{"metric": "val_loss", "mode": "min"}],
        "budget": {"trials": 3, "max_steps": 20, "concurrent": 2},
        "confirm": {"seeds": 0, "keep": 1}, "resources": {"cpu": 1}}))
    out = _run(venv / "bin" / "sweeps", "run", "sweep.yaml", "--no-preflight", cwd=work,
               env=env)
    folder = work / "results" / "tiny"
    with open(folder / "trials.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["status"] for r in rows if r["role"] == "search"] == ["ok"] * 3, out
    assert list((folder / "stable").glob("rank-01-*.yaml")), out
