"""A driver killed mid-sweep (SIGKILL), the results folder moved, and `sweeps resume`: no
finished trial lost or re-run, and nothing written where the folder used to be."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sweeps.commands.cli import main
from tests.conftest import edit_linreg, read_results_csv

pytestmark = pytest.mark.slow


def _finished(folder: Path) -> dict[str, dict]:
    done = {}
    for path in (folder / "trials").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if "outcome" in event and event["outcome"].get("finished"):
                done[path.stem] = event["outcome"]
    return done


def _wait_for_finished(driver: subprocess.Popen, out: Path, count: int) -> None:
    """Wait until ``count`` trials of the running sweep in ``out`` have finished."""
    deadline = time.monotonic() + 240
    while len(_finished(out)) < count:
        assert driver.poll() is None, "the sweep ended before it could be stopped"
        assert time.monotonic() < deadline, "no trial finished in time"
        time.sleep(0.2)


def test_driver_killed_mid_sweep_resumes_without_losing_trials(linreg_dir, monkeypatch,
                                                                capsys):
    edit_linreg(linreg_dir, name="resumable",
                budget={"trials": 10, "max_steps": 60, "concurrent": 2, "scheduler": "none"},
                search_space={"lr": {"type": "loguniform", "low": 1e-3, "high": 0.5}},
                train={"sleep": 0.02})  # ~1.2 s per trial, so the kill lands mid-sweep
    out = linreg_dir / "results" / "resumable"
    driver = subprocess.Popen([sys.executable, "-m", "sweeps", "run", "linreg.yaml"],
                              cwd=linreg_dir, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for_finished(driver, out, 4)
        time.sleep(2.5)  # let Ray Tune save its experiment state once more
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    before = _finished(out)
    assert 4 <= len(before) < 10
    assert not (out / "trials.csv").exists()
    # the folder is moved before the resume: it must continue where it is now
    moved = linreg_dir / "elsewhere" / "resumable"
    moved.parent.mkdir()
    out.rename(moved)
    original, out = out, moved
    histories_before = {t: (out / "trials" / f"{t}.jsonl").read_text() for t in before}

    # and the project moved too: its trainer is no longer where the sweep ran
    project = linreg_dir / "project"
    project.mkdir()
    (linreg_dir / "linreg_trainer.py").rename(project / "linreg_trainer.py")
    monkeypatch.chdir(linreg_dir)
    refused = subprocess.run([sys.executable, "-m", "sweeps", "resume", str(out), "--quiet"],
                             cwd=linreg_dir, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--project PATH" in refused.stderr, refused.stderr
    capsys.readouterr()
    assert main(["resume", str(out), "--quiet", "--project", str(project)]) == 0
    assert not original.exists(), "nothing is written where the folder used to be"
    # Ray Tune gives back the progress lines the run was started with: muted by --quiet
    resumed_err = capsys.readouterr().err
    assert not re.search(r"^\[\d+/10\]", resumed_err, re.MULTILINE)

    trials = read_results_csv(out / "trials.csv")
    # a running search trial that did not come back (replaced by a new sample) is named
    gone = {p.name.split(".")[0] for p in (out / "trials").glob("*.jsonl.interrupted")
            if json.loads(p.read_text().splitlines()[0])["trial"]["role"] == "search"}
    replaced = sorted(gone - set(trials["trial_id"]))
    for trial_id in replaced:
        assert trial_id in resumed_err and "new samples took their place" in resumed_err
    if not replaced:
        assert "new samples took their place" not in resumed_err
    search = trials[trials["role"] == "search"]
    # Ray Tune saves its state every 2 s: a trial that finished after the last save is
    # kept from the journal and counts towards budget.trials; one that was running when
    # the driver died is replaced
    assert len(search) == 10 and search["trial_id"].is_unique
    assert (search["status"] != "running").all()
    # every trial finished before the kill is kept, search trials and the race's re-runs
    assert set(before) <= set(trials["trial_id"])
    for trial_id, outcome in before.items():
        row = trials.set_index("trial_id").loc[trial_id]
        assert row["status"] == outcome["status"]
        # not re-run: its journal gained nothing after the kill
        assert (out / "trials" / f"{trial_id}.jsonl").read_text() == histories_before[trial_id]
    # the Optuna study holds every search trial of trials.csv as told, none failed as
    # interrupted (one that finished after Ray Tune's last save was lost to the sampler)
    import optuna

    from sweeps.state.layout import STUDY_FILE

    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / STUDY_FILE)))
    told = {t.user_attrs.get("ray_trial_id"): t for t in
            optuna.load_study(study_name="resumable", storage=storage).get_trials()
            if "race_of" not in t.user_attrs}
    for trial_id in search["trial_id"]:
        assert told[trial_id].state.is_finished(), trial_id
        assert told[trial_id].user_attrs.get("status") != "interrupted", trial_id
    assert list((out / "stable").glob("rank-01-*.yaml"))
    assert main(["best", str(out)]) == 0
    # resumed once more, finished: nothing runs again, and MLflow holds the sweep once
    assert main(["resume", str(out), "--quiet"]) == 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name("resumable").experiment_id
    parents = client.search_runs([exp], "tags.`sweeps.kind` = 'sweep'")
    assert len(parents) == 1, "the earlier logging was replaced, not doubled"
    children = client.search_runs(
        [exp], f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'", max_results=1000)
    assert len(children) == len(read_results_csv(out / "trials.csv"))
    # moved once more after MLflow logged it: the store moved with it and is logged to
    # there, once, not re-created where the folder was
    again = out.parent / "again"
    out.rename(again)
    capsys.readouterr()
    assert main(["resume", str(again), "--quiet", "--tolerance", "0.5"]) == 0
    assert "logged to the store it carries now" in capsys.readouterr().err
    assert yaml.safe_load((again / "sweep.yaml").read_text())["confirm"]["tolerance"] == 0.5
    assert not out.exists(), "no MLflow store re-created where the folder used to be"
    client = MlflowClient(f"sqlite:///{again / 'mlflow.db'}")
    assert len(client.search_runs([exp], "tags.`sweeps.kind` = 'sweep'")) == 1
    assert f"sqlite:///{again / 'mlflow.db'}" in (again / "tracking.txt").read_text()


def test_sigterm_ends_a_command_with_143_and_a_line_not_a_traceback(linreg_dir):
    """A scheduler's or a user's kill (SIGTERM) ends as Ctrl-C does, saying so."""
    edit_linreg(linreg_dir, train={"sleep": 0.1})
    command = subprocess.Popen([sys.executable, "-m", "sweeps", "try", "linreg.yaml"],
                               cwd=linreg_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        assert command.stdout is not None
        command.stdout.readline()  # it has started
        os.kill(command.pid, signal.SIGTERM)
        _, err = command.communicate(timeout=60)
    finally:
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
    assert command.returncode == 143 and err.strip().endswith("terminated"), err[-2000:]


@pytest.mark.parametrize(("sig", "code", "said"), [(signal.SIGINT, 130, "interrupted"),
                                                    (signal.SIGTERM, 143, "terminated")])
def test_a_stopped_sweep_exits_128_plus_the_signal_and_says_how_to_resume(linreg_dir, sig,
                                                                         code, said):
    """Ctrl-C, or a kill (SIGTERM). With Ray running, SIGTERM is the command's to handle:
    ray.init replaces the handler (its core worker's crash handler aborted the driver with
    no line), and a signal landing inside Ray's wait comes out of it as a SystemExit(1)."""
    edit_linreg(linreg_dir, name="stopped",
                budget={"trials": 10, "max_steps": 60, "concurrent": 2, "scheduler": "none"},
                train={"sleep": 0.02})
    out = linreg_dir / "results" / "stopped"
    # a background job's shell hands its children SIGINT ignored: undo that, as a terminal
    driver = subprocess.Popen([sys.executable, "-m", "sweeps", "run", "linreg.yaml", "--quiet"],
                              cwd=linreg_dir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, start_new_session=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _wait_for_finished(driver, out, 2)
        os.kill(driver.pid, sig)
        _, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == code, err[-3000:]
    assert f"{said}: `sweeps resume {out}` continues where it stopped" in err
    assert "SIGTERM received" not in err and "Traceback" not in err, err[-3000:]


def test_the_resume_line_of_a_ray_jobs_driver_names_its_cluster(tmp_path, monkeypatch):
    """A sweep run as a Ray job is resumed from the user's machine, on the cluster: the
    line its log ends with carries the GCS address Ray gave the driver; an --address given
    on the command line is carried over as it was."""
    import argparse

    from sweeps.commands.cli import cmd_resume, interrupted_line

    folder = tmp_path / "my sweep"
    folder.mkdir()
    (folder / "sweep.yaml").write_text("{}")
    args = argparse.Namespace(func=cmd_resume, dir=str(folder), address=None)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert interrupted_line(args) == \
        f"interrupted: `sweeps resume '{folder}'` continues where it stopped"
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert f"`sweeps resume '{folder}' --address 10.0.0.5:6379`" in interrupted_line(args)
    args.address = "10.0.0.9:6379"
    assert "--address 10.0.0.9:6379`" in interrupted_line(args)
    monkeypatch.setenv("SWEEPS_SLURM_DRIVER", "1")  # the cluster ends with the SLURM job
    assert interrupted_line(args) == f"interrupted: `sweeps slurm --resume '{folder}'` " \
        "(the same options as this job) continues where it stopped in a new job"
    monkeypatch.delenv("SWEEPS_SLURM_DRIVER")
    odd = tmp_path / "out\x1b[31m[/INST]$x$"  # a folder's name is text, printed as text
    odd.mkdir(parents=True)
    (odd / "sweep.yaml").write_text("{}")
    line = interrupted_line(argparse.Namespace(func=cmd_resume, dir=str(odd), address=None))
    assert "\x1b" not in line and "[/INST]$x$" in line and "sweeps resume" in line
