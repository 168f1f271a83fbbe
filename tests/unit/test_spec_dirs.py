"""Loading a sweep depends on the folders it is given, not on the process: no working
directory is read or changed, and ``sys.path`` is as it was after a trainer import."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest
import ray._private.runtime_env.packaging  # noqa: F401 - its first import edits sys.path
import yaml

from sweeps.cluster import package
from sweeps.cluster.slurm import plan
from sweeps.cluster.slurm_render import JobOptions
from sweeps.errors import SpecError
from sweeps.spec.loader import load_sweep
from sweeps.spec.trainer_loader import load_trainer
from tests.conftest import SWEEPFILES, copy_sweepfiles


@pytest.fixture
def untouched():
    """The test must leave the working directory and ``sys.path`` as they were."""
    cwd, path = os.getcwd(), list(sys.path)
    yield
    assert os.getcwd() == cwd, "the working directory changed"
    assert sys.path == path, "sys.path changed"


def _write_sweep(folder: Path, module: str) -> Path:
    """A one-knob sweep file ``s.yaml`` in ``folder`` whose trainer is ``module:train``."""
    path = folder / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "s", "trainer": f"{module}:train", "base_config": {"t": {"lr": 0.1}},
        "search_space": {"lr": {"type": "loguniform", "low": 1e-4, "high": 1.0}},
        "write_back": {"lr": "t.lr"}}))
    return path


def test_one_sweep_file_from_two_workdirs(linreg_dir, tmp_path_factory, untouched):
    first, second = tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b")
    a = load_sweep(linreg_dir / "linreg.yaml", workdir=first)
    b = load_sweep(linreg_dir / "linreg.yaml", workdir=second)
    here = str(linreg_dir.resolve())
    assert a.trainer_paths == [here, str(first.resolve())]
    assert b.trainer_paths == [here, str(second.resolve())]
    assert a.base_config == b.base_config and a.space == b.space
    assert a.output_dir == first.resolve() / "results" / "linreg"
    assert b.output_dir == second.resolve() / "results" / "linreg"
    assert (a.workdir, b.workdir) == (first.resolve(), second.resolve())


def test_a_relative_sweep_path_starts_at_the_workdir(linreg_dir, untouched):
    sweep = load_sweep("linreg.yaml", workdir=linreg_dir, import_trainer=False)
    assert sweep.source == (linreg_dir / "linreg.yaml").resolve()
    with pytest.raises(SpecError, match="no sweep file at linreg.yaml"):
        load_sweep("linreg.yaml", workdir=linreg_dir / "results", import_trainer=False)


def test_relative_files_are_read_beside_the_sweep_file_then_from_the_workdir(
        tmp_path, untouched):
    project, work = tmp_path / "p", tmp_path / "w"
    project.mkdir()
    work.mkdir()
    copy_sweepfiles(project)
    config = yaml.safe_load((project / "linreg_config.yaml").read_text())
    config["train"]["lr"] = 0.123
    (work / "linreg_config.yaml").write_text(yaml.safe_dump(config))
    (project / "linreg_config.yaml").unlink()
    sweep = load_sweep(project / "linreg.yaml", workdir=work, import_trainer=False)
    assert sweep.base_config["train"]["lr"] == 0.123, "not beside the sweep: the workdir's"
    (project / "linreg_config.yaml").write_text((SWEEPFILES / "linreg_config.yaml").read_text())
    sweep = load_sweep(project / "linreg.yaml", workdir=work, import_trainer=False)
    assert sweep.base_config["train"]["lr"] != 0.123, "beside the sweep file wins"


def test_importing_the_trainer_leaves_sys_path_as_it_was(tmp_path, untouched):
    name = f"dirs_trainer_{os.getpid()}_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(
        "import sys\nSEEN = list(sys.path)\n\n\ndef train(config, report):\n    pass\n")
    _write_sweep(tmp_path, name)
    load_sweep(tmp_path / "s.yaml", workdir=tmp_path)
    assert str(tmp_path.resolve()) in sys.modules[name].SEEN, "on sys.path for the import"
    assert str(tmp_path.resolve()) not in sys.path
    with pytest.raises(SpecError, match="does not import"):
        load_trainer("no_such_module_here:train", [str(tmp_path)])


def _project(root: Path) -> Path:
    """A project folder: the test sweeps under exp/, a secret and old results beside."""
    (root / "exp").mkdir(parents=True)
    copy_sweepfiles(root / "exp")
    (root / ".env").write_text("TOKEN=x\n")
    (root / "results").mkdir()
    (root / "results" / "old.txt").write_text("old\n")
    return root


def test_a_submission_is_built_without_changing_directory(tmp_path, untouched):
    project = _project(tmp_path / "proj")
    sub = package.build("proj/exp/linreg.yaml", workdir=tmp_path, project_dir="proj",
                        storage=None, preflight=True)
    assert sub.project_dir == project.resolve() and sub.sweep_path == "exp/linreg.yaml"
    shipped = {p.as_posix() for p in package.shipped_files(project,
                                                           sub.runtime_env["excludes"])}
    assert shipped == {f"exp/{f.name}" for f in SWEEPFILES.iterdir() if f.is_file()}


def test_a_slurm_job_runs_in_the_workdir_it_is_given(linreg_dir, tmp_path_factory,
                                                     untouched):
    work = tmp_path_factory.mktemp("work")
    args = argparse.Namespace(file=str(linreg_dir / "linreg.yaml"), output_dir=None,
                              template=None, dry_run=True)
    opts = JobOptions(nodes=1, cpus_per_node=None, gpus_per_node=0, time=None,
                      partition=None, auth=False)
    job = plan(args, opts, work)
    assert f"--chdir={work}" in job.script
    assert job.results == work.resolve() / "results" / "linreg"
    assert job.sweep_file == (linreg_dir / "linreg.yaml").resolve()


def test_preflight_hooks_import_beside_the_trainer_and_leave_sys_path(tmp_path, untouched):
    from sweeps.preflight.runner import run_preflight

    name = f"dirs_hooked_{os.getpid()}_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}_data.py").write_text(
        "import torch\n\n\ndef batch():\n    return {'x': torch.zeros(8, 2)}\n")
    (tmp_path / f"{name}.py").write_text(
        f"def sample_batch(config):\n    from {name}_data import batch  # at call time\n"
        "    return batch()\n\n\ndef train(config, report):\n    pass\n")
    _write_sweep(tmp_path, name)
    _, findings = run_preflight(load_sweep(tmp_path / "s.yaml", workdir=tmp_path))
    assert [f.message for f in findings if f.check in ("hooks", "inputs")] == [
        "every input feature is on a sane scale"]
