"""``sweeps slurm``: rendering, validation, and a real sweep on a local single-node SLURM."""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sweeps.cluster.slurm import add_commands
from sweeps.cluster.slurm_render import TEMPLATE, JobOptions, port_block, time_seconds, validate
from sweeps.errors import SpecError
from tests.conftest import skip_or_fail

ROOT = Path(__file__).resolve().parents[1]
LOCAL_SLURM = ROOT / "cluster" / "slurm" / "local-slurm.sh"
SLURM_DIR = Path(os.environ.get("SWEEPS_SLURM_DIR", "/tmp/sweeps-slurm"))
PARTITION = os.environ.get("SWEEPS_SLURM_PARTITION", "local")


def sweeps_slurm(*argv: str) -> int:
    """``sweeps slurm ARGV`` as the CLI runs it (SpecError -> exit 2)."""
    parser = argparse.ArgumentParser(prog="sweeps")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["slurm", *argv])
    try:
        return args.func(args)
    except SpecError:
        return SpecError.exit_code


@pytest.fixture(scope="module")
def slurm() -> None:
    """The local SLURM up (installed and started if need be), or the module skipped."""
    try:
        done = subprocess.run([str(LOCAL_SLURM), "start"], capture_output=True, text=True,
                              timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        skip_or_fail(f"local SLURM could not be started: {exc}")
    if done.returncode != 0:
        skip_or_fail(f"local SLURM could not be installed/started: {done.stderr.strip()}")


@pytest.fixture
def slurm_env(slurm, monkeypatch, tmp_path: Path) -> Path:
    """Client commands on the local SLURM; the Ray token written under tmp_path."""
    monkeypatch.setenv("SLURM_CONF", str(SLURM_DIR / "slurm.conf"))
    monkeypatch.setenv("SWEEPS_TOKEN_DIR", str(tmp_path / "tokens"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def small_sweep(folder: Path) -> Path:
    """linreg, cut to 6 trials x 40 steps, one at a time, one confirmation seed."""
    path = folder / "linreg.yaml"
    data = yaml.safe_load(path.read_text())
    data["budget"] = {"trials": 6, "max_steps": 40, "concurrent": 1, "scheduler": "none"}
    data["confirm"] = {"seeds": 1, "lr_probe": 2.0}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def queue() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True)
    return out.stdout.split()


def wait_for(job: str, timeout: float) -> str:
    """Wait until ``job`` leaves the queue; its final state (scontrol)."""
    deadline = time.monotonic() + timeout
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True,
                         text=True).stdout.strip():
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job])
            pytest.fail(f"job {job} still queued or running after {timeout:.0f} s")
        time.sleep(2)
    info = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True)
    state = [w for w in info.stdout.split() if w.startswith("JobState=")]
    return state[0].removeprefix("JobState=") if state else "UNKNOWN"


ARGS = ("--nodes", "1", "--cpus-per-node", "2", "--time", "00:10:00", "--partition", PARTITION)


def test_time_and_options_are_checked():
    assert time_seconds("01:02:03") == 3723
    assert time_seconds("1-00:00:00") == 86400
    for bad in ("10:00", "1:60:00", "abc", "00:00:61"):
        with pytest.raises(SpecError):
            time_seconds(bad)
    ok = JobOptions(nodes=2, cpus_per_node=4, gpus_per_node=0, time="00:30:00", partition="gpu")
    validate(ok)
    for bad_opts in (JobOptions(0, 4, 0, "00:30:00", "p"), JobOptions(1, 0, 0, "00:30:00", "p"),
                     JobOptions(1, 4, 0, "00:01:00", "p"), JobOptions(1, 4, 0, "00:30:00", "a b"),
                     JobOptions(1, 4, 0, "00:30:00", "p", port_base=80)):
        with pytest.raises(SpecError):
            validate(bad_opts)
    assert port_block(8) == (100, 127)
    assert port_block(128)[0] >= 10 + 128


@pytest.mark.slow
def test_dry_run_renders_ports_and_token_and_submits_nothing(linreg_dir, slurm_env, capsys):
    sweep = small_sweep(linreg_dir)
    before = queue()
    assert sweeps_slurm(str(sweep), *ARGS, "--output-dir", "out", "--port-base", "23000",
                        "--dry-run") == 0
    script = capsys.readouterr().out
    assert queue() == before
    assert not (slurm_env / "out").exists()
    for line in ("#SBATCH --signal=B:USR1@120", f"#SBATCH --partition={PARTITION}",
                 "PORT_BASE=${SWEEPS_PORT_BASE:-23000}", '--min-worker-port="$MIN_WORKER_PORT"',
                 "--dashboard-host=127.0.0.1", "umask 077",
                 "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$TOKEN_FILE",
                 'DRIVER=("$PY" -m sweeps run "$SWEEP_FILE" --address "$HEAD_ADDR" '
                 '--output "$RESULTS")',
                 "RESUME=''"):
        assert line in script, line
    assert f"SWEEP_FILE={sweep}" in script
    assert "@@" not in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert sweeps_slurm(str(sweep), *ARGS, "--no-auth", "--dry-run") == 0
    assert "AUTH=disabled" in capsys.readouterr().out


@pytest.mark.slow
def test_bad_input_exits_2_and_submits_nothing(linreg_dir, slurm_env):
    good = small_sweep(linreg_dir)
    data = yaml.safe_load(good.read_text())
    data["write_back"] = {"learning_rat": "train.lr"}
    bad = linreg_dir / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    before = queue()
    assert sweeps_slurm(str(bad), *ARGS, "--output-dir", "out") == 2
    assert sweeps_slurm(str(good), *ARGS[:-1], "no-such-partition", "--output-dir", "out") == 2
    assert sweeps_slurm(str(good), "--cpus-per-node", "2", "--time", "10:00",
                        "--partition", PARTITION, "--output-dir", "out") == 2
    assert queue() == before
    assert not (slurm_env / "out").exists()


@pytest.mark.slow
def test_sweep_runs_as_a_slurm_job(linreg_dir, slurm_env, capsys):
    sweep = small_sweep(linreg_dir)
    out = slurm_env / "results"
    assert sweeps_slurm(str(sweep), *ARGS, "--output-dir", str(out)) == 0
    printed = capsys.readouterr().out
    job = printed.split("submitted batch job ", 1)[1].split()[0]
    assert f"squeue -j {job}" in printed and "ssh -L 8265:127.0.0.1:" in printed
    scripts = list((out / "linreg.slurm").glob("sweep-*.sbatch"))
    assert len(scripts) == 1
    state = wait_for(job, timeout=240)
    log = (out / "linreg.slurm" / f"slurm-{job}.out").read_text()
    assert state == "COMPLETED", log[-3000:]
    results = out / "linreg"
    trials = pd.read_csv(results / "trials.csv")
    assert (trials["role"] == "search").sum() == 6, trials
    assert list((results / "stable").glob("rank-01-*.yaml"))
    assert "Ray cluster up: 1 node(s)" in log
    assert "clean shutdown: Ray stopped on 1/1 node(s), token removed, exit 0" in log
    assert "(0 process(es) left)" in log
    assert not list((slurm_env / "tokens").glob("ray-token-*"))
    assert not list(Path("/tmp").glob(f"sweeps-ray-{job}-*"))


@pytest.mark.slow
def test_a_cancelled_sweep_job_is_continued_by_another_job(linreg_dir, slurm_env, capsys):
    """scancel in the middle of the search; ``sweeps slurm --resume DIR`` submits a job
    that resumes the sweep on a new Ray cluster: every trial ran once, none was lost."""
    sweep = small_sweep(linreg_dir)
    data = yaml.safe_load(sweep.read_text())
    data["budget"]["trials"] = 8
    sweep.write_text(yaml.safe_dump(data, sort_keys=False))
    config = linreg_dir / "linreg_config.yaml"
    config.write_text(config.read_text().replace("train:", "train:\n  sleep: 0.1", 1))
    out = slurm_env / "results"
    assert sweeps_slurm(str(sweep), *ARGS, "--output-dir", str(out)) == 0
    job = capsys.readouterr().out.split("submitted batch job ", 1)[1].split()[0]
    trials = out / "linreg" / "trials"
    deadline = time.monotonic() + 240
    while len(list(trials.glob("*.jsonl"))) < 3 and time.monotonic() < deadline:
        time.sleep(1)
    subprocess.run(["scancel", job], check=True)
    assert wait_for(job, timeout=120) == "CANCELLED"
    log = (out / "linreg.slurm" / f"slurm-{job}.out").read_text()
    assert f"sweeps slurm --resume {out / 'linreg'}" in log, log[-3000:]
    assert not (out / "linreg" / "trials.csv").exists(), "stopped before its end"
    assert sweeps_slurm("--resume", str(out / "linreg"), *ARGS) == 0
    printed = capsys.readouterr().out
    again = printed.split("submitted batch job ", 1)[1].split()[0]
    state = wait_for(again, timeout=300)
    log = (out / "linreg.slurm" / f"slurm-{again}.out").read_text()
    assert state == "COMPLETED", log[-3000:]
    assert "-m sweeps resume" in log
    table = pd.read_csv(out / "linreg" / "trials.csv")
    search = table[table["role"] == "search"]
    assert len(search) == 8 and search["trial_id"].is_unique, table
    assert list((out / "linreg" / "stable").glob("rank-01-*.yaml"))


def test_resume_takes_a_results_folder_not_a_sweep_file(linreg_dir, monkeypatch):
    monkeypatch.chdir(linreg_dir)
    assert sweeps_slurm("--resume", "results/none", *ARGS, "--dry-run") == 2
    assert sweeps_slurm(str(small_sweep(linreg_dir)), "--resume", "results/linreg", *ARGS,
                        "--dry-run") == 2
    assert sweeps_slurm(*ARGS, "--dry-run") == 2


def test_partition_time_and_cpus_can_be_left_to_the_site(linreg_dir, monkeypatch, capsys):
    """No --partition, --time or --cpus-per-node: their #SBATCH lines are left out (the
    site's defaults apply), the CPUs come from the sweep, and the dry run says so."""
    monkeypatch.setenv("SWEEPS_TOKEN_DIR", str(linreg_dir / "tokens"))
    monkeypatch.chdir(linreg_dir)
    sweep = small_sweep(linreg_dir)  # one trial at a time, 1 CPU each
    assert sweeps_slurm(str(sweep), "--nodes", "1", "--dry-run") == 0
    out, err = capsys.readouterr()
    assert "#SBATCH --time" not in out and "#SBATCH --partition" not in out
    assert "#SBATCH --cpus-per-task=1" in out and "@@" not in out
    assert "--time not given" in err and "--partition not given" in err
    assert "--cpus-per-node not given: 1" in err
    assert subprocess.run(["bash", "-n"], input=out, text=True).returncode == 0


@pytest.mark.parametrize("planted", [None, "open", "symlink"])
def test_each_node_keeps_ray_in_a_folder_of_the_users_alone(tmp_path, planted):
    """The job's Ray folder is made 0700 on each node; one that someone made first (open to
    others, or a symlink) is refused before Ray starts."""
    script = TEMPLATE.read_text()
    body = script[script.index("private_dir() {"):script.index("stop_node_ray() {")]
    folder = tmp_path / "sweeps-ray-123"
    if planted == "open":
        folder.mkdir(mode=0o777)
        folder.chmod(0o777)
    elif planted == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        folder.symlink_to(tmp_path / "elsewhere")
    run = subprocess.run(["bash", "-c", f"{body}\nprivate_dir"], capture_output=True, text=True,
                         env={**os.environ, "RAY_PRIVATE": str(folder)})
    if planted is None:
        assert run.returncode == 0, run.stderr
        assert folder.stat().st_mode & 0o777 == 0o700
    else:
        assert run.returncode == 1 and "is not a folder of" in run.stderr


def test_a_gpu_job_keeps_a_step_budget_without_a_trial_cap(linreg_dir):
    """The sweep shipped with --gpus-per-node is the one `sweeps run` saves: a step
    budget with no `trials` is not capped at the model's default trial count."""
    from sweeps.cluster.slurm import gpu_override
    from sweeps.spec.loader import load_sweep, load_sweep_dict

    data = yaml.safe_load((linreg_dir / "linreg.yaml").read_text())
    del data["budget"]["trials"]
    data["budget"]["total_steps"] = 5000
    (linreg_dir / "linreg.yaml").write_text(yaml.safe_dump(data))
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir, import_trainer=False)
    assert sweep.spec.budget.trial_cap is None
    shipped = yaml.safe_load(gpu_override(sweep))
    assert "trials" not in shipped["budget"] and shipped["resources"]["gpu"] == 1
    again = load_sweep_dict(shipped, base_dir=linreg_dir, workdir=linreg_dir,
                            import_trainer=False)
    assert again.spec.budget.trial_cap is None
    assert again.spec.budget.total_steps == 5000
