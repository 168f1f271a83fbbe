"""A full disk is one line (the folder, the free space, `sweeps resume DIR`), not a chain of
tracebacks, and nothing is lost: resume finishes the sweep once there is room. A real
small file system (tmpfs), grown in place afterwards."""

from __future__ import annotations

import contextlib
import io
import subprocess

import pytest

from tests.conftest import copy_sweepfiles, edit_linreg, read_results_csv, run_cli_in

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "results"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_one_line_and_resume_finishes(tmp_path, small_disk, ray_session):
    folder = copy_sweepfiles(tmp_path)
    edit_linreg(folder, budget={"trials": 3, "max_steps": 30, "concurrent": 2,
                                "scheduler": "none"}, confirm={"seeds": 0, "lr_probe": 0})
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = run_cli_in(folder, "run", "linreg.yaml", "--quiet", "--no-preflight")
    out = small_disk / "linreg"
    assert code == 1
    lines = [ln for ln in err.getvalue().splitlines() if ln.startswith("error:")]
    assert lines == [lines[-1]] and lines[0].startswith("error: disk full: could not write")
    assert "Traceback" not in err.getvalue()
    assert "MiB free on" in lines[0] and f"`sweeps resume {out}`" in lines[0]
    subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)
    assert run_cli_in(folder, "resume", str(out), "--quiet") == 0
    trials = read_results_csv(out / "trials.csv")
    assert (trials["role"] == "search").sum() == 3
