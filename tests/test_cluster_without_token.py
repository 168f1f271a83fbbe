"""A driver started by hand (``sweeps run --address``) on a standing cluster that runs
without token authentication, on a machine where a Ray token exists: the driver must
not switch to token mode (the cluster could not call it back, and every trial's actor
was cancelled before it started)."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import edit_linreg, read_results_csv
from tests.test_node_failure import _record
from tests.test_ray_cluster import local_cluster

pytestmark = pytest.mark.slow


def test_run_address_on_a_cluster_without_token_auth_runs_its_trials(linreg_dir):
    with local_cluster("swt-", RAY_AUTH_MODE="disabled") as (state, env, py, started):
        assert "token auth:           OFF" in started
        # the stop command it prints names this cluster's own state folder
        assert f"stop:    SWEEPS_RAY_DIR={state} " in started, started
        edit_linreg(linreg_dir, name="no-token",
                    search_space={"lr": {"type": "loguniform", "low": 0.04, "high": 0.06}},
                    budget={"trials": 2, "max_steps": 30, "concurrent": 2,
                            "scheduler": "none"},
                    confirm={"seeds": 0, "lr_probe": 0})
        driver_env = {k: v for k, v in env.items() if k != "RAY_AUTH_MODE"}
        driver_env["RAY_AUTH_TOKEN"] = "a-token-this-cluster-never-asks-for"
        driver = subprocess.run(
            [py, "-m", "sweeps", "run", "linreg.yaml", "--quiet", "--no-preflight",
             "--address", _record(state)["SWEEPS_RAY_GCS"]], cwd=linreg_dir,
            env=driver_env, capture_output=True, text=True, timeout=300)
        assert driver.returncode == 0, driver.stderr[-3000:]
    trials = read_results_csv(linreg_dir / "results" / "no-token" / "trials.csv")
    assert list(trials["status"]) == ["ok", "ok"], trials[["status", "reason", "evidence"]]
