"""Faults that must not sink a sweep: a hung trial, a worker killed mid-trial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from sweeps.commands.cli import main
from tests.conftest import edit_linreg, read_results_csv

pytestmark = pytest.mark.slow


def _configure(folder: Path, name: str, train: dict, budget: dict, space=None) -> None:
    edit_linreg(folder, name=name, budget=budget, confirm={"seeds": 0, "lr_probe": 0},
                train=train, **({"search_space": {"lr": space}} if space else {}))


def test_a_trial_that_stops_reporting_is_stopped_as_hung(linreg_dir, ray_session, monkeypatch):
    _configure(linreg_dir, "hangs", {"hang_at": 15},
               {"trials": 2, "max_steps": 30, "concurrent": 2, "scheduler": "none",
                "hang_timeout": 10})
    monkeypatch.chdir(linreg_dir)
    start = time.monotonic()
    # every trial hung: the sweep ends (exit 1: nothing but crashes) instead of waiting
    assert main(["run", "linreg.yaml", "--quiet", "--no-preflight"]) == 1
    assert time.monotonic() - start < 120, "the hung trials must not hold the sweep for long"
    trials = pd.read_csv(linreg_dir / "results" / "hangs" / "trials.csv")
    assert list(trials["status"]) == ["crash", "crash"]
    assert list(trials["reason"]) == ["hung", "hung"]
    assert list(trials["stop_step"]) == [14, 14]
    evidence = json.loads(trials["evidence"][0])
    assert evidence["timeout_s"] == 10 and evidence["silent_s"] >= 10


def test_a_trainer_hung_in_its_import_on_the_workers_does_not_stall_the_sweep(
        linreg_dir, ray_session, monkeypatch):
    """The driver imports the trainer; every worker's import hangs. Ray Tune kept a hung
    trial's actor for the next trial (and stopped an uncached one gracefully, 600 s), so
    with both slots held the third trial never started: the sweep stalled for good."""
    marker = linreg_dir / "imported.once"
    (linreg_dir / "hangs_on_import.py").write_text(
        "import os, time\n"
        f"try:\n    os.close(os.open({str(marker)!r}, os.O_CREAT | os.O_EXCL))\n"
        "except FileExistsError:\n    time.sleep(100000)\n"
        "from linreg_trainer import train\n")
    _configure(linreg_dir, "import-hangs", {},
               {"trials": 3, "max_steps": 30, "concurrent": 2, "scheduler": "none",
                "hang_timeout": 6})
    edit_linreg(linreg_dir, trainer="hangs_on_import:train")
    monkeypatch.chdir(linreg_dir)
    start = time.monotonic()
    assert main(["run", "linreg.yaml", "--quiet", "--no-preflight"]) == 1
    assert time.monotonic() - start < 150
    trials = pd.read_csv(linreg_dir / "results" / "import-hangs" / "trials.csv")
    assert list(trials["reason"]) == ["hung"] * 3


def _steps(journal: Path) -> list[tuple[str, int]]:
    events = []
    for line in journal.read_text().splitlines():
        event = json.loads(line)
        if "metrics" in event:
            events.append(("metrics", int(event["metrics"]["step"])))
        elif "retry" in event:
            events.append(("retry", 0))
    return events


def test_worker_killed_mid_trial_is_retried_from_its_checkpoint(linreg_dir, tmp_path):
    pid_dir = tmp_path / "pids"
    _configure(linreg_dir, "retried", {"sleep": 0.05, "checkpoint_every": 10,
                                       "pid_dir": str(pid_dir)},
               {"trials": 1, "max_steps": 80, "concurrent": 1, "scheduler": "none"},
               space={"type": "loguniform", "low": 0.04, "high": 0.06})
    out = linreg_dir / "results" / "retried"
    driver = subprocess.Popen([sys.executable, "-m", "sweeps", "run", "linreg.yaml", "--quiet",
                               "--no-preflight"], cwd=linreg_dir, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        journal = None
        while True:
            assert driver.poll() is None, driver.stderr.read()
            assert time.monotonic() < deadline
            journals = list((out / "trials").glob("*.jsonl")) if (out / "trials").exists() \
                else []
            if journals and _steps(journals[0]) and _steps(journals[0])[-1][1] >= 25:
                journal = journals[0]
                break
            time.sleep(0.1)
        trial_id = journal.stem
        killed_at = _steps(journal)[-1][1]
        os.kill(int((pid_dir / f"{trial_id}.pid").read_text()), signal.SIGKILL)
        _, err = driver.communicate(timeout=240)
        assert driver.returncode == 0, err
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    trials = read_results_csv(out / "trials.csv")
    row = trials.set_index("trial_id").loc[trial_id]
    assert row["status"] == "ok" and row["retries"] == 1 and row["steps"] == 80
    events = _steps(journal)
    retry = events.index(("retry", 0))
    resumed = events[retry + 1][1]
    assert resumed % 10 == 1 and resumed > 1, "restarted from a checkpoint, not from scratch"
    assert killed_at - resumed < 10 + 3, "at most one checkpoint interval of work lost"
    history = pd.read_csv(out / "trials" / f"{trial_id}.csv")
    assert list(history["step"]) == list(range(1, 81)), "one clean history after the retry"
    # checkpoint files on their way to Ray live outside what Ray Tune copies into the
    # results folder when it saves the experiment state (a copy racing their removal
    # logged FileNotFoundError tracebacks)
    assert not list((out / "ray").rglob("sweeps-ckpt-*")) and "FileNotFoundError" not in err
