"""One owner per results folder: a second command on a folder in use exits 2 at once, a
folder in use or not made by sweeps is never renamed, a dead owner's lock blocks nobody."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeps.commands.run import archive_previous
from sweeps.state.folder_lock import (
    LOCK_FILE,
    MARKER_FILE,
    OWNER_FILE,
    FolderInUse,
    ForeignFolder,
    check_ours,
    claim,
    holds,
)
from tests.conftest import edit_linreg, read_results_csv

ROOT = Path(__file__).resolve().parent.parent

HOLDER = """
import sys, time
from sweeps.state.folder_lock import claim
with claim(sys.argv[1], sys.argv[2]):
    print("held", flush=True)
    time.sleep(600)
"""

TAKER = """
import sys
from sweeps.state.folder_lock import claim, FolderInUse
try:
    with claim(sys.argv[1], "run"):
        print("taken")
except FolderInUse as exc:
    print("busy", exc.problem)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _hold(folder: Path, command: str = "run") -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), command],
                            stdout=subprocess.PIPE, text=True, env=_env())
    assert proc.stdout.readline().strip() == "held"
    return proc


def _take(folder: Path) -> str:
    return subprocess.run([sys.executable, "-c", TAKER, str(folder)], capture_output=True,
                          text=True, env=_env(), timeout=60, check=True).stdout.strip()


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in sorted(folder.rglob("*"))}


def test_a_second_owner_is_refused_naming_the_first_and_a_dead_owner_blocks_nobody(tmp_path):
    folder = tmp_path / "results" / "demo"
    holder = _hold(folder, "stability")
    try:
        with pytest.raises(FolderInUse) as info, claim(folder, "run"):
            pass
        assert info.value.exit_code == 2
        problem = info.value.problem
        assert f"PID {holder.pid}" in problem and socket.gethostname() in problem
        assert "`sweeps stability`" in problem
        assert "wait for it" in info.value.fix and "--output" in info.value.fix
        owner = json.loads((folder / OWNER_FILE).read_text())
        assert owner["pid"] == holder.pid and owner["command"] == "stability"
        assert (folder / MARKER_FILE).is_file()
    finally:
        holder.send_signal(signal.SIGKILL)  # what an OOM kill or `kill -9` does
        holder.wait()
    start = time.monotonic()
    with claim(folder, "run"):  # the kernel dropped the dead owner's lock: no wait
        assert holds(folder)
        assert json.loads((folder / OWNER_FILE).read_text())["pid"] == os.getpid()
    assert time.monotonic() - start < 1.0
    assert not holds(folder)
    assert (folder / LOCK_FILE).exists(), "the lock file stays (never unlinked)"


def test_the_lock_is_released_on_ctrl_c_and_exceptions(tmp_path):
    folder = tmp_path / "demo"
    with pytest.raises(KeyboardInterrupt), claim(folder, "run"):
        assert _take(folder).startswith("busy")
        raise KeyboardInterrupt
    assert _take(folder) == "taken"
    with pytest.raises(RuntimeError), claim(folder, "resume"), claim(folder, "run"):
        raise RuntimeError("boom")  # re-entrant in one process, released once outside
    assert not holds(folder)
    assert _take(folder) == "taken"


def test_results_in_use_are_never_moved_aside(tmp_path):
    folder = tmp_path / "demo"
    (folder / "trials").mkdir(parents=True)
    (folder / MARKER_FILE).write_text("x")
    holder = _hold(folder)
    try:
        with pytest.raises(FolderInUse):
            archive_previous(folder)
    finally:
        holder.kill()
        holder.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]
    moved = archive_previous(folder)  # once free, the old results go aside whole
    assert moved is not None and moved.name.startswith("demo.")
    assert (moved / "trials").is_dir() and (moved / MARKER_FILE).is_file()
    assert (folder / MARKER_FILE).is_file() and not (folder / "trials").exists()
    assert _take(folder) == "taken" and _take(moved) == "taken", "both locks released"


def test_a_folder_sweeps_did_not_make_is_never_renamed_or_written(linreg_dir, monkeypatch,
                                                                  capsys):
    from sweeps.commands.cli import main

    monkeypatch.chdir(linreg_dir)
    mine = linreg_dir / "results" / "linreg"
    (mine / "trials").mkdir(parents=True)  # looked like results to the old archive check
    (mine / "trials" / "notes.txt").write_text("my own notes")
    (mine / "thesis.tex").write_text("\\documentclass{article}")
    before = _tree(mine)
    for argv in (["run", "linreg.yaml"], ["preflight", "linreg.yaml"],
                 ["stability", "linreg.yaml", "--param", "lr", "--values", "0.1"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "is not a sweeps results folder" in err and str(mine) in err
        assert MARKER_FILE in err and "fix:" in err
    assert _tree(mine) == before, "nothing renamed, created or written"
    assert sorted(p.name for p in (linreg_dir / "results").iterdir()) == ["linreg"]
    with pytest.raises(ForeignFolder):
        archive_previous(mine)
    assert _tree(mine) == before
    # a results folder of an earlier sweeps version (sweep_state.json, no marker) is ours
    legacy = linreg_dir / "legacy"
    (legacy / "trials").mkdir(parents=True)
    (legacy / "sweep_state.json").write_text("{}")
    moved = archive_previous(legacy)
    assert moved is not None and (moved / "sweep_state.json").is_file()
    assert (legacy / MARKER_FILE).is_file()


def test_a_symlinked_state_file_is_refused_by_run(linreg_dir, monkeypatch, capsys):
    from sweeps.commands.cli import main

    monkeypatch.chdir(linreg_dir)
    out = linreg_dir / "results" / "linreg"
    out.mkdir(parents=True)
    (out / MARKER_FILE).write_text("x")
    elsewhere = linreg_dir / "elsewhere.journal"
    elsewhere.write_text("precious\n")
    (out / "optuna.journal").symlink_to(elsewhere)
    assert main(["run", "linreg.yaml", "--no-preflight"]) == 2
    err = capsys.readouterr().err
    assert "optuna.journal" in err and "symlink" in err
    assert elsewhere.read_text() == "precious\n"
    assert not (out / "sweep.yaml").exists()


def _started_trials(out: Path) -> set[str]:
    folder = out / "trials"
    return {p.stem for p in folder.glob("*.jsonl")} if folder.is_dir() else set()


@pytest.mark.slow
def test_two_runs_of_one_sweep_the_second_exits_2_and_the_first_completes(linreg_dir):
    edit_linreg(linreg_dir, name="shared",
                budget={"trials": 4, "max_steps": 40, "concurrent": 2, "scheduler": "none"},
                search_space={"lr": {"type": "loguniform", "low": 1e-2, "high": 0.5}},
                confirm={"seeds": 0, "lr_probe": 0},
                train={"sleep": 0.15})  # ~6 s per trial: the first is mid-sweep for a while
    out = linreg_dir / "results" / "shared"
    cmd = [sys.executable, "-m", "sweeps", "run", "linreg.yaml", "--quiet", "--no-preflight"]
    log = linreg_dir / "first.log"
    with open(log, "w") as fh:
        first = subprocess.Popen(cmd, cwd=linreg_dir, stdout=subprocess.DEVNULL, stderr=fh,
                                 env=_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not _started_trials(out):  # the first holds the folder and runs trials
            assert first.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the first run started no trial"
            time.sleep(0.2)
        start = time.monotonic()
        second = subprocess.run(cmd, cwd=linreg_dir, capture_output=True, text=True,
                                env=_env(), timeout=120)
        took = time.monotonic() - start
        resume = subprocess.run([sys.executable, "-m", "sweeps", "resume", str(out)],
                                cwd=linreg_dir, capture_output=True, text=True, env=_env(),
                                timeout=120)
        assert first.poll() is None, "the first run must still be running for this test"
        assert second.returncode == 2, second.stderr
        assert f"in use by `sweeps run` (PID {first.pid} on host {socket.gethostname()}" \
            in second.stderr
        assert "wait for it" in second.stderr and "--output" in second.stderr
        assert took < 60, "refused at once, before Ray starts"
        assert resume.returncode == 2 and f"PID {first.pid}" in resume.stderr
        assert first.wait(timeout=300) == 0, log.read_text()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert sorted(p.name for p in (linreg_dir / "results").iterdir()) == ["shared"], \
        "nothing renamed"
    trials = read_results_csv(out / "trials.csv")
    assert len(trials[trials["role"] == "search"]) == 4
    assert set(trials["trial_id"]) == _started_trials(out), "every trial in trials.csv"
    assert (trials["status"] == "ok").all()
    assert (out / "report.html").is_file()
    assert json.loads((out / OWNER_FILE).read_text())["pid"] == first.pid
    assert _take(out) == "taken", "released when the first run ended"


def test_a_folder_holding_only_what_sweeps_left_is_named_for_what_it_is(tmp_path):
    """No marker, but only a compile cache in it: the message says sweeps left that, and
    how to mark the folder, instead of calling it someone else's."""
    folder = tmp_path / "linreg"
    (folder / "inductor_cache").mkdir(parents=True)
    with pytest.raises(ForeignFolder) as caught:
        check_ours(folder, "run")
    text = str(caught.value)
    assert "holds only what sweeps itself left there" in text
    assert "inductor_cache" in text and f"touch {folder / MARKER_FILE}" in text
    (folder / "thesis.tex").write_text("mine")
    with pytest.raises(ForeignFolder, match="holds other files"):
        check_ours(folder, "run")
