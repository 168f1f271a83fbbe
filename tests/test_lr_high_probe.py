"""``search_space.lr.high: probe``: ``sweeps run`` probes the LR stability boundary on the
linreg trainer (diverges a little above lr 0.67) before the search, searches below it,
records it in the results folder, and a moved folder resumes with it without probing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import copy_sweepfiles, edit_linreg, read_results_csv, run_cli_in

pytestmark = pytest.mark.slow

LOW = 1e-3
PROBED = {"lr": {"type": "loguniform", "low": LOW, "high": "probe"}}


def _sweep(folder: Path):
    from sweeps.spec.loader import load_sweep

    return load_sweep("linreg.yaml", workdir=folder)


@pytest.fixture(scope="module")
def probed_run(tmp_path_factory, ray_session):
    """A sweep whose lr range ends where the probe says, one initial point beyond it."""
    import contextlib
    import io

    folder = copy_sweepfiles(tmp_path_factory.mktemp("lrprobe"))
    edit_linreg(folder, search_space=PROBED, initial_points=[{"lr": 0.05}, {"lr": 5.0}],
                budget={"trials": 6, "max_steps": 60, "concurrent": 2, "scheduler": "none"})
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert run_cli_in(folder, "run", "linreg.yaml", "--quiet") == 0
    return folder, folder / "results" / "linreg", out.getvalue(), err.getvalue()


def test_the_search_stays_below_the_probed_boundary(probed_run):
    folder, out, stdout, stderr = probed_run
    spec = yaml.safe_load((out / "sweep.yaml").read_text())
    lr = spec["search_space"]["lr"]
    record = lr["probed"]
    assert lr["low"] == LOW and isinstance(lr["high"], float)
    assert lr["high"] == record["boundary_low"] <= record["boundary_high"]
    assert record["boundary_high"] / record["boundary_low"] <= 1.25 + 1e-9
    assert 0.4 < lr["high"] < 1.6  # the linreg edge (docs/stability.md: 0.67 .. 0.8)
    assert record["ceiling"] == pytest.approx(LOW * 1e6) and record["seeds"] == 3
    report = out / record["report"]
    assert report == out / "lr_probe" / "boundary.md" and report.is_file()
    assert f"{lr['high']:.4g}" in report.read_text()
    trials = read_results_csv(out / "trials.csv")
    search = trials[trials["role"] == "search"]
    assert len(search) == 6
    assert (search["lr"] >= LOW).all() and (search["lr"] <= lr["high"] * (1 + 1e-9)).all()
    assert not (search["lr"] == 5.0).any()  # the initial point past the edge was left out
    assert "initial_points.1: lr 5.0 is above the probed high" in stderr
    line = f"lr range 0.001 .. {lr['high']:.4g} from the boundary probe"
    assert line in stdout and line in stderr and "boundary probe: searching" in stderr
    html = (out / "report.html").read_text()
    assert line in html and 'href="lr_probe/boundary.md"' in html


def test_report_json_names_the_probed_range(probed_run, capsys):
    _, out, _, _ = probed_run
    assert run_cli_in(out.parent, "report", str(out), "--format", "json") == 0
    info = json.loads(capsys.readouterr().out)["lr_probe"]
    assert info["low"] == LOW and info["high"] == info["boundary_low"]
    assert info["boundary_high"] > info["high"] and info["report"] == "lr_probe/boundary.md"


def test_a_moved_folder_resumes_with_the_probed_range_without_probing(probed_run, tmp_path,
                                                                      capsys):
    from sweeps.state import saved_sweep

    folder, out, _, _ = probed_run
    moved = tmp_path / "moved" / "linreg"
    shutil.copytree(out, moved, symlinks=True)
    probed_high = saved_sweep.read(moved).space["lr"].high
    report = (moved / "lr_probe" / "boundary.md").read_text()
    stamp = (moved / "lr_probe" / "boundary.md").stat().st_mtime_ns
    capsys.readouterr()
    assert run_cli_in(folder, "resume", str(moved), "--quiet", "--trust-state") == 0
    captured = capsys.readouterr()
    assert "boundary probe:" not in captured.err and "probe lr=" not in captured.err
    assert (moved / "lr_probe" / "boundary.md").stat().st_mtime_ns == stamp
    assert (moved / "lr_probe" / "boundary.md").read_text() == report
    again = saved_sweep.read(moved)
    assert again.space["lr"].high == probed_high and not again.lr_high_to_probe
    assert f"{probed_high:.4g} from the boundary probe" in captured.out
    search = read_results_csv(moved / "trials.csv").query("role == 'search'")
    assert (search["lr"] <= probed_high * (1 + 1e-9)).all()


def test_nothing_failing_up_to_the_ceiling_ends_the_range_there(linreg_dir):
    from sweeps.commands.lr_range import probe_lr_high

    low = 1e-7  # ceiling 0.1: linreg holds everywhere below it
    edit_linreg(linreg_dir, search_space={"lr": {**PROBED["lr"], "low": low}},
                budget={"max_steps": 40})
    lines: list[str] = []
    sweep = probe_lr_high(_sweep(linreg_dir), echo=lines.append)
    knob = sweep.space["lr"]
    assert knob.high == pytest.approx(0.1) and knob.probed.boundary_high is None
    assert not sweep.lr_high_to_probe
    assert any("nothing failed up to lr 0.1" in line for line in lines)
    assert sweep.resolved()["search_space"]["lr"]["high"] == pytest.approx(0.1)


def test_nothing_holding_exits_2_naming_the_key(linreg_dir, capsys):
    edit_linreg(linreg_dir, search_space={"lr": {**PROBED["lr"], "low": 3.0}},
                budget={"max_steps": 40})
    assert run_cli_in(linreg_dir, "run", "linreg.yaml", "--quiet", "--no-preflight") == 2
    err = capsys.readouterr().err
    assert "error: search_space.lr.high: the boundary probe found no lr" in err
    assert "lower search_space.lr.low" in err
    out = linreg_dir / "results" / "linreg"
    assert (out / "lr_probe" / "boundary.md").is_file()
    assert not (out / "sweep.yaml").exists() and not (out / "trials").exists()


def test_before_the_probe_readers_of_the_space_see_the_ceiling(linreg_dir, capsys):
    from sweeps.commands.stability import probe_range
    from sweeps.spec.loader import load_sweep_dict

    edit_linreg(linreg_dir, search_space=PROBED)
    sweep = _sweep(linreg_dir)
    assert sweep.lr_high_to_probe and sweep.space["lr"].high == pytest.approx(LOW * 1e6)
    assert probe_range(sweep, "lr", None) == (LOW, pytest.approx(LOW * 1e6))
    # the self-contained copy (sweep.yaml, a cluster's job) still asks for the probe
    data = sweep.resolved()
    assert data["search_space"]["lr"] == {"type": "loguniform", "low": LOW, "high": "probe"}
    again = load_sweep_dict(data, base_dir=linreg_dir, workdir=linreg_dir)
    assert again.lr_high_to_probe and again.space == sweep.space
    assert run_cli_in(linreg_dir, "validate", "linreg.yaml") == 0
    assert "search_space.lr.high: probe" in capsys.readouterr().out
    assert run_cli_in(linreg_dir, "try", "linreg.yaml", "--steps", "5") == 0
