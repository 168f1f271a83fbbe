"""A worker node of a real two-node Ray cluster killed mid-sweep: trials retried elsewhere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import edit_linreg, read_results_csv
from tests.test_ray_cluster import local_cluster

pytestmark = pytest.mark.slow


def _record(state: Path) -> dict[str, str]:
    out = {}
    for line in (state / "cluster.env").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip().strip("'\"")
    return out


def _session_pids(sid: int) -> list[int]:
    ps = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout
    return [int(p) for p, s in (line.split() for line in ps.splitlines()) if int(s) == sid]


def _last_steps(folder: Path) -> dict[str, int]:
    steps = {}
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if "metrics" in event:
                steps[path.stem] = int(event["metrics"]["step"])
    return steps


def test_killing_a_worker_node_retries_its_trial_from_the_checkpoint(linreg_dir):
    out = linreg_dir / "results" / "node-lost"
    with local_cluster("swn-") as (state, env, py, _):
        record = _record(state)
        edit_linreg(linreg_dir, name="node-lost",
                    search_space={"lr": {"type": "loguniform", "low": 0.04, "high": 0.06}},
                    budget={"trials": 2, "max_steps": 80, "concurrent": 2,
                            "scheduler": "none"},
                    confirm={"seeds": 0, "lr_probe": 0},
                    train={"sleep": 0.1, "checkpoint_every": 10})
        driver = subprocess.Popen(
            [py, "-m", "sweeps", "run", "linreg.yaml", "--quiet", "--no-preflight",
             "--address", record["SWEEPS_RAY_GCS"]], cwd=linreg_dir, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        try:
            deadline = time.monotonic() + 240
            while True:  # both trials (one per node) well past their first checkpoint
                assert driver.poll() is None, driver.stderr.read()[-3000:]
                assert time.monotonic() < deadline, "the trials did not start in time"
                steps = _last_steps(out / "trials") if (out / "trials").exists() else {}
                if len(steps) == 2 and min(steps.values()) >= 25:
                    break
                time.sleep(0.2)
            for sid in record["SWEEPS_RAY_WORKER_SIDS"].split():
                for pid in _session_pids(int(sid)):
                    os.kill(pid, signal.SIGKILL)  # the whole worker node dies at once
            assert driver.wait(timeout=300) == 0, driver.stderr.read()[-3000:]
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
    trials = read_results_csv(out / "trials.csv")
    assert list(trials["status"]) == ["ok", "ok"], "the sweep completed"
    assert trials["retries"].sum() == 1, "the trial on the lost node was retried once"
    retried = trials[trials["retries"] == 1].iloc[0]["trial_id"]
    history = pd.read_csv(out / "trials" / f"{retried}.csv")
    assert list(history["step"]) == list(range(1, 81))
    events = [json.loads(line) for line in
              (out / "trials" / f"{retried}.jsonl").read_text().splitlines()]
    at_retry = next(i for i, e in enumerate(events) if "retry" in e)
    before = [e["metrics"]["step"] for e in events[:at_retry] if "metrics" in e]
    after = [e["metrics"]["step"] for e in events[at_retry:] if "metrics" in e]
    assert after[0] > 1 and after[0] % 10 == 1, "resumed from a checkpoint"
    assert before[-1] - after[0] < 10 + 5, "at most one checkpoint interval lost"
    assert list((out / "stable").glob("rank-01-*.yaml"))
