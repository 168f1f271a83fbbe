"""The benchmark scripts on a sweep file of their user's, not one of the repository's cases.

``bench/detection.py`` and ``bench/efficiency.py --sweep FILE`` are how a user checks
the claims on their own trainer; here they run on the linreg test sweep (a trainer
they were never written for), in a subprocess as a user runs them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import copy_sweepfiles, edit_linreg

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _run(script: str, args: list[str], folder: Path, out: str) -> tuple[str, dict]:
    env = {**os.environ, "BENCH_RESULTS": str(folder / "bench-results"),
           "BENCH_SCRATCH": str(folder / "scratch")}
    proc = subprocess.run([sys.executable, str(BENCH / script), *args, "--out", out],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads((folder / "bench-results" / f"{out}.json").read_text())


def test_detection_runs_the_initial_points_of_any_sweep(tmp_path):
    folder = copy_sweepfiles(tmp_path)
    edit_linreg(folder, initial_points=[{"lr": 20.0}, {"lr": 1.0e-5}, {"lr": 0.05}])
    stdout, data = _run("detection.py", ["--sweep", "linreg.yaml", "--seeds", "1"], folder,
                        "detection-linreg")
    rows = {r["case"]: r for r in data["rows"]}
    assert set(rows) == {"lr=20", "lr=1e-05", "lr=0.05"}
    blowup, flat, healthy = rows["lr=20"], rows["lr=1e-05"], rows["lr=0.05"]
    assert blowup["sweeps status"].startswith("unstable") and blowup["sweeps steps after"] == 0
    assert blowup["plain Tune steps after"] > 0, "ASHA cannot stop a NaN trial"
    assert flat["sweeps status"] == "unstable (flat_at_baseline)"
    assert flat["sweeps steps after"] == 0
    assert healthy["detectable (rule)"] == "never" and healthy["false stop (sweeps)"] == "no"
    assert "steps run after the failure was detectable: sweeps 0" in stdout


def test_efficiency_gives_every_method_the_same_step_budget(tmp_path):
    folder = copy_sweepfiles(tmp_path)
    budget, steps = 240, 30
    stdout, data = _run("efficiency.py", [
        "--sweep", "linreg.yaml", "--steps", str(steps), "--budget", str(budget),
        "--seeds", "1", "--methods", "sweeps,tune+optuna+asha,optuna tpe+median"],
        folder, "efficiency-linreg")
    raw = data["raw"]["linreg"]
    assert set(raw["per_method"]) == {"sweeps", "tune+optuna+asha", "optuna tpe+median"}
    for method, stats in raw["per_method"].items():
        assert budget <= stats["total"][0] < budget + steps, method
    judged = raw["trials_judged"]["sweeps"][0]
    unstable = [t for t in judged if not t["stable"]]
    assert unstable, "lr up to 30 must give unstable trials"
    assert all(t["steps"] < steps for t in unstable), "sweeps stops them early"
    assert "| linreg" in stdout


def test_compile_bench_measures_cold_and_warm_trials(tmp_path):
    stdout, data = _run("compile.py", [
        "--trainer", "regression", "--events", "256", "--steps", "3", "--modes", "default",
        "--repeats", "1", "--limit-trials", "0"], tmp_path, "compile-tiny")
    raw = data["raw"]["default"]
    assert raw["cold"][0]["evidence"]["cache_misses"] > 0
    for scenario in ("warm, same worker", "warm, new worker"):
        warm = raw[scenario][0]["evidence"]
        assert warm["graphs"] == 1 and warm["cache_hits"] > 0 and warm["cache_misses"] == 0
    assert raw["other dropout, same worker"][0]["evidence"]["cache_misses"] > 0
    assert "default, warm, same worker: warm = " in stdout


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the machine without CUDA")
def test_gpu_bench_says_it_skips_without_cuda(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH / "gpu.py"), "--out", "gpu-none"],
                          cwd=tmp_path, env={**os.environ, "BENCH_RESULTS": str(tmp_path)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("skipped: no CUDA")
    assert not (tmp_path / "gpu-none.json").exists(), "no figures without a GPU"


def test_audit_bench_audits_every_stopped_trial_of_a_real_sweep(tmp_path):
    stdout, data = _run("audit_bench.py", ["--seeds", "1", "--trials", "8", "--steps", "80"],
                        tmp_path, "audit-mlp")
    rows = data["rows"]
    assert len(rows) == 8
    stopped = [r for r in rows if r["status"] != "ok"]
    assert stopped, "the failure set's configs (SGD at LR 1, raw inputs) must be stopped"
    assert all(r["outcome"] in ("recovered", "poor", "failed") for r in rows)
    nan_point = next(r for r in rows if r["values"]["lr"] == 1.0 and
                     r["values"]["optimizer"] == "sgd" and not r["values"]["normalize_inputs"])
    assert nan_point["status"] == "unstable" and nan_point["outcome"] == "failed"
    for rec in data["per_verdict"]:
        part = [r for r in rows if r["verdict"] == rec["verdict"]]
        assert rec["stopped"] == len(part)
        assert rec["recovered"] == sum(r["outcome"] == "recovered" for r in part)
    assert "verdicts on trials within 10% of the best stable trial" in stdout
