"""``sweeps submit`` / ``sweeps jobs`` against a real multi-process Ray cluster.

The cluster is cluster/ray/start-local-cluster.sh on this machine (a head and a worker
node, 1 CPU each, token authentication on, dashboard on 127.0.0.1), started once for the
module and stopped after it. Its Python needs ray[default] (the Jobs API): this test's
own interpreter, or SWEEPS_RAY_PYTHON; without one the cluster tests are skipped.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path, PurePosixPath

import pandas as pd
import pytest
import yaml

from sweeps.cluster import jobs, package
from sweeps.commands.cli import main
from sweeps.errors import SpecError
from tests.conftest import SWEEPFILES, skip_or_fail

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "cluster" / "ray"
UNSTABLE_LR = 20.0
HEALTHY_LR = 0.05


def _cluster_python() -> str | None:
    for py in (os.environ.get("SWEEPS_RAY_PYTHON"), sys.executable):
        if py and subprocess.run([py, "-c", "import ray.dashboard.optional_deps, sweeps"],
                                 capture_output=True).returncode == 0:
            return py
    return None


def _free_ports(n: int) -> int:
    """The first of ``n`` consecutive ports that are free on every interface."""
    for _ in range(200):
        first = random.randrange(20000, 29000)
        socks = []
        try:
            for port in range(first, first + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("", port))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports")


def cluster_env(state: Path, py: str) -> dict[str, str]:
    """Environment for the local-cluster scripts: a head and one worker node of 1 CPU each."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(SWEEPS_RAY_DIR=str(state), SWEEPS_RAY_PYTHON=py, SWEEPS_RAY_STOP_GRACE="3",
               SWEEPS_RAY_CLEAN="1", SWEEPS_RAY_PORT=str(_free_ports(1)),
               SWEEPS_RAY_DASHBOARD_PORT=str(_free_ports(1)),
               SWEEPS_RAY_AGENT_PORT=str(_free_ports(2)), SWEEPS_RAY_WORKERS="1",
               SWEEPS_RAY_CPUS="1")
    return env


@contextlib.contextmanager
def local_cluster(prefix: str, **env_vars: str):
    """A fresh two-node cluster for one test: ``(state folder, its environment, its
    Python)``, stopped and removed after it; skipped (or failed in CI) without a Python
    that has ray[default]."""
    py = _cluster_python()
    if py is None:
        skip_or_fail("no Python with ray[default] for the cluster")
    state = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # Ray's socket paths are short
    env = {**cluster_env(state, py), **env_vars}
    start = subprocess.run([str(SCRIPTS / "start-local-cluster.sh")], env=env, text=True,
                           capture_output=True, timeout=240)
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        yield state, env, py, start.stdout
    finally:
        subprocess.run([str(SCRIPTS / "stop-local-cluster.sh")], env=env, timeout=120)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster_state():
    """A fresh local two-node cluster: (its Jobs API URL, its state folder)."""
    py = _cluster_python()
    if py is None:
        skip_or_fail("no Python with ray[default] (the Jobs API) for the cluster: install "
                    "ray[default] or set SWEEPS_RAY_PYTHON")
    state = Path(tempfile.mkdtemp(prefix="swr-", dir="/tmp"))  # Ray's socket paths are short
    env = cluster_env(state, py)
    start = subprocess.run([str(SCRIPTS / "start-local-cluster.sh")], env=env, text=True,
                           capture_output=True, timeout=240)
    if start.returncode != 0:
        subprocess.run([str(SCRIPTS / "stop-local-cluster.sh")], env=env, timeout=120)
        pytest.fail(f"start-local-cluster.sh failed:\n{start.stdout}\n{start.stderr}")
    again = subprocess.run([str(SCRIPTS / "start-local-cluster.sh")], env=env, text=True,
                           capture_output=True, timeout=60)
    assert again.returncode == 0 and "already running" in again.stdout, "idempotent"
    try:
        yield f"http://127.0.0.1:{env['SWEEPS_RAY_DASHBOARD_PORT']}", state
    finally:
        stop = subprocess.run([str(SCRIPTS / "stop-local-cluster.sh")], env=env, text=True,
                              capture_output=True, timeout=120)
        assert stop.returncode == 0, stop.stderr
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(cluster_state):
    """The Jobs API URL of the local cluster."""
    return cluster_state[0]


def _project(folder: Path) -> Path:
    """The linreg sweep in a subfolder exp/ of a project folder, with a small budget."""
    exp = folder / "exp"
    exp.mkdir(parents=True)
    for f in SWEEPFILES.iterdir():
        if f.is_file() and f.name.startswith("linreg"):
            shutil.copy(f, exp / f.name)
    data = yaml.safe_load((exp / "linreg.yaml").read_text())
    data["budget"] = {"trials": 6, "max_steps": 40, "concurrent": 2, "scheduler": "none"}
    data["confirm"] = {"seeds": 1, "lr_probe": 0}
    data["initial_points"] = [{"lr": UNSTABLE_LR}, {"lr": HEALTHY_LR}]
    (exp / "linreg.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder


@pytest.fixture(scope="module")
def submitted(cluster, tmp_path_factory):
    """``sweeps submit --wait`` of the small linreg sweep: (job id, results folder, exit)."""
    project = _project(tmp_path_factory.mktemp("project"))
    storage = tmp_path_factory.mktemp("storage")
    out = tmp_path_factory.mktemp("out") / "submit.log"
    with open(out, "w") as fh:
        stdout, sys.stdout = sys.stdout, fh
        try:
            code = main(["submit", str(project / "exp" / "linreg.yaml"), "--address",
                                cluster, "--project-dir", str(project), "--storage",
                                str(storage), "--wait", "--no-preflight"])
        finally:
            sys.stdout = stdout
    log = out.read_text()
    return log.splitlines()[0].strip(), storage / "linreg", code, log


@pytest.mark.slow
def test_submit_wait_runs_the_sweep_and_succeeds(cluster, submitted):
    job_id, results, code, log = submitted
    assert code == 0, log[-3000:]
    assert job_id.startswith("sweeps-linreg-")
    assert "Pareto front" in log, "the job's log was streamed"
    assert jobs.status_of(jobs.connect(cluster), job_id) == "SUCCEEDED"
    trials = pd.read_csv(results / "trials.csv")
    trials["reason"] = trials["reason"].fillna("")
    search = trials[trials["role"] == "search"]
    assert len(search) == 6
    assert set(search["status"]) <= {"ok", "unstable", "crash", "pruned"}
    bad = search[(search["lr"] - UNSTABLE_LR).abs() < 1e-9].iloc[0]
    assert bad["status"] == "unstable"
    assert bad["reason"] in ("non_finite", "grad_blowup", "divergence")
    good = search[(search["lr"] - HEALTHY_LR).abs() < 1e-12].iloc[0]
    assert good["status"] == "ok" and good["reason"] == ""
    handed = sorted((results / "stable").glob("rank-01-*.yaml"))
    assert handed
    # the header names the file the user submitted, not the job's temporary copy of it
    header = handed[0].read_text().split("\n", 1)[0]
    assert header.endswith("/exp/linreg.yaml)") and "_ray_pkg_" not in header, header


@pytest.mark.slow
def test_trials_ran_on_the_worker_node_too(cluster_state, submitted):
    """Two trials at a time on two 1-CPU nodes: the worker node ran trials."""
    logs = (cluster_state[1] / "worker1").glob("session_*/logs/python-core-worker-*.log")
    assert any("actor_repr_name: ray_trainable" in f.read_text(errors="replace") for f in logs)


@pytest.mark.slow
def test_jobs_status_logs_and_list(cluster, submitted, capsys):
    job_id = submitted[0]
    capsys.readouterr()
    assert main(["jobs", "status", job_id, "--address", cluster]) == 0
    out = capsys.readouterr().out
    assert f"{job_id}: SUCCEEDED" in out and "sweep: linreg" in out
    assert re.search(r"results:[^:]*/linreg(message|command):", "".join(out.split())), \
        "the sweep's own results folder, as submit said, not the root"
    assert main(["jobs", "logs", job_id, "--address", cluster]) == 0
    assert "python -m sweeps run exp/linreg.yaml" in capsys.readouterr().out
    assert main(["jobs", "list", "--address", cluster]) == 0
    assert job_id[:12] in capsys.readouterr().out
    assert main(["jobs", "status", "no-such-job", "--address", cluster]) == 2
    err = " ".join(capsys.readouterr().err.split())  # the fix reaches this cluster
    assert f"list the jobs with `sweeps jobs list --address {cluster}`" in err


@pytest.mark.slow
def test_a_stopped_job_says_how_to_resume_it_on_this_cluster(cluster, tmp_path, capsys):
    """`sweeps jobs stop`, then `sweeps jobs status`: the resume line carries the cluster's
    GCS address as the job's driver printed it, not a placeholder."""
    project = _project(tmp_path)
    sweep = project / "exp" / "linreg.yaml"
    data = yaml.safe_load(sweep.read_text())
    data["budget"] = {"trials": 40, "max_steps": 400, "concurrent": 2, "scheduler": "none"}
    sweep.write_text(yaml.safe_dump(data, sort_keys=False))
    storage = tmp_path / "storage"
    assert main(["submit", str(sweep), "--address", cluster, "--project-dir", str(project),
                 "--storage", str(storage), "--no-preflight"]) == 0
    job_id = capsys.readouterr().out.splitlines()[0].strip()
    client = jobs.connect(cluster)
    deadline = time.monotonic() + 240
    while "[1/40]" not in client.get_job_logs(job_id):  # a trial ended: the sweep runs
        assert time.monotonic() < deadline, client.get_job_logs(job_id)[-3000:]
        time.sleep(2)
    assert main(["jobs", "stop", job_id, "--address", cluster]) == 0
    while jobs.status_of(client, job_id) not in jobs.TERMINAL:
        assert time.monotonic() < deadline
        time.sleep(1)
    capsys.readouterr()
    assert main(["jobs", "status", job_id, "--address", cluster]) == 0
    out = " ".join(capsys.readouterr().out.split())
    logged = re.findall(r"sweeps resume \S+ --address (\S+?)`", client.get_job_logs(job_id))
    assert logged, client.get_job_logs(job_id)[-3000:]
    assert f"continue: sweeps resume {storage}/linreg --address {logged[-1]}" in out, out
    assert "HOST:PORT" not in out and not logged[-1].startswith("http")


@pytest.mark.slow
def test_bad_sweep_file_exits_2_and_submits_nothing(cluster, tmp_path, capsys):
    project = _project(tmp_path)
    bad = project / "exp" / "linreg.yaml"
    data = yaml.safe_load(bad.read_text())
    data["write_back"] = {"learning_rat": "train.lr"}
    bad.write_text(yaml.safe_dump(data))
    client = jobs.connect(cluster)
    before = len(client.list_jobs())
    assert main(["submit", str(bad), "--address", cluster,
                        "--project-dir", str(project)]) == 2
    assert "write_back" in capsys.readouterr().err
    assert len(client.list_jobs()) == before


# --- what is sent, checked without a cluster ---------------------------------------------

def test_entrypoint_and_runtime_env(linreg_dir):
    sub = package.build(f"{linreg_dir.name}/linreg.yaml", workdir=linreg_dir.parent,
                        project_dir=None, storage="/shared/results", preflight=False, pip=["rich"],
                        env_pairs=["OMP_NUM_THREADS=1"])
    rel = f"{linreg_dir.name}/linreg.yaml"
    assert sub.entrypoint == f"python -m sweeps run {rel} --output /shared/results --no-preflight"
    renv = sub.runtime_env
    assert renv["working_dir"] == str(linreg_dir.parent.resolve())
    assert {".git/", ".venv/", "/results/"} <= set(renv["excludes"])
    assert renv["pip"] == ["rich"]
    assert renv["env_vars"] == {"OMP_NUM_THREADS": "1", "PYTHONPATH": linreg_dir.name,
                                "SWEEPS_SUBMITTED_FROM": str(linreg_dir / "linreg.yaml")}
    assert sub.metadata["sweeps.sweep"] == "linreg"


def test_sweep_file_outside_the_project_is_refused(linreg_dir, tmp_path_factory):
    other = tmp_path_factory.mktemp("elsewhere")
    with pytest.raises(SpecError) as err:
        package.build(str(linreg_dir / "linreg.yaml"), workdir=other, project_dir=None,
                      storage=None, preflight=True)
    assert err.value.key == "FILE" and "--project-dir" in err.value.fix


def test_bad_env_and_address_are_spec_errors(monkeypatch):
    with pytest.raises(SpecError):
        package.parse_env(["NOEQUALS"])
    with pytest.raises(SpecError):
        jobs.jobs_address("ray://head:10001")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # a GCS address is not the Jobs API
    assert jobs.jobs_address(None) == jobs.DEFAULT_ADDRESS
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265/")
    assert jobs.jobs_address(None) == "http://head:8265"
    assert jobs.jobs_address("127.0.0.1:8266") == "http://127.0.0.1:8266"


def test_excludes_cover_a_relative_output_folder():
    ex = package.excludes_for("out/sweeps", "/abs/storage")
    assert "/out/sweeps/" in ex and not any("abs" in e for e in ex)
    assert package.entrypoint(PurePosixPath("a b/s.yaml"), None, True) == \
        "python -m sweeps run 'a b/s.yaml'"
