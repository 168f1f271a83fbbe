"""GPU trials, tested where this machine can test them: Ray with declared GPUs (no CUDA)
packs two trials per GPU with ``resources.gpu: 0.5``, each trial sees only its GPU and is
handed its device; an out-of-memory error is ``oom``; no GPU column without CUDA. The
tests marked ``cuda`` run only on a machine with CUDA."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from sweeps.spec.loader import load_sweep
from sweeps.trial.run import run_trainer
from tests.conftest import copy_sweepfiles, edit_linreg, read_results_csv, run_cli_in

TRIALS = 4

#: A trainer that writes what it was given (CUDA_VISIBLE_DEVICES, Ray's GPU ids, the
#: device in its config), waits until all trials of the sweep are running at once, then
#: trains the linreg model.
PROBE_TRAINER = '''
import json, os, time
from pathlib import Path
import ray
import linreg_trainer

def train(config, report):
    run = config["sweep"]
    folder = Path(config["train"]["probe_dir"])
    folder.mkdir(exist_ok=True)
    seen = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "ray_gpu_ids": [str(i) for i in ray.get_gpu_ids()],
            "device": run["device"], "gpu_ids": [str(i) for i in run["gpu_ids"]]}
    (folder / (run["trial_id"] + ".json")).write_text(json.dumps(seen))
    deadline = time.monotonic() + 120  # a scheduler that cannot pack them all never gets there
    while len(list(folder.glob("*.json"))) < ALL and time.monotonic() < deadline:
        time.sleep(0.2)
    seen["running_together"] = len(list(folder.glob("*.json")))
    (folder / (run["trial_id"] + ".json")).write_text(json.dumps(seen))
    linreg_trainer.train(config, report)
'''.replace("ALL", str(TRIALS))


@pytest.fixture(scope="module")
def packed_sweep(tmp_path_factory):
    """A sweep of 4 trials with ``resources: {cpu: 0.25, gpu: 0.5}`` on a Ray that declares
    2 GPUs: its results folder and the probe files of its trials."""
    import ray

    folder = copy_sweepfiles(tmp_path_factory.mktemp("gpu"))
    (folder / "gpu_probe_trainer.py").write_text(PROBE_TRAINER)
    probes = folder / "probes"
    edit_linreg(folder, train={"probe_dir": str(probes), "steps": 20},
                trainer="gpu_probe_trainer:train",
                search_space={"lr": {"type": "loguniform", "low": 1e-2, "high": 0.1}},
                budget={"trials": TRIALS, "max_steps": 20, "concurrent": TRIALS,
                        "scheduler": "none"},
                confirm={"seeds": 0, "lr_probe": 0, "base": False},
                resources={"cpu": 0.25, "gpu": 0.5})
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert run_cli_in(folder, "run", "linreg.yaml", "--quiet", "--no-preflight") == 0
    finally:
        ray.shutdown()
    seen = [json.loads(p.read_text()) for p in sorted(probes.glob("*.json"))]
    return folder / "results" / "linreg", seen


@pytest.mark.slow
def test_half_a_gpu_packs_two_trials_per_gpu_each_seeing_only_its_own(packed_sweep):
    _, seen = packed_sweep
    assert len(seen) == TRIALS
    assert all(s["running_together"] == TRIALS for s in seen), \
        f"4 trials at 0.5 GPU fit on 2 GPUs at once: {seen}"
    for s in seen:
        assert len(s["ray_gpu_ids"]) == 1, s
        assert s["cuda_visible_devices"] == s["ray_gpu_ids"][0], "only its own GPU is visible"
        assert s["gpu_ids"] == s["ray_gpu_ids"], "the trainer is handed Ray's assignment"
        assert s["device"] == "cpu", "no CUDA on this machine"
    shared = Counter(s["ray_gpu_ids"][0] for s in seen)
    assert sorted(shared.values()) == [2, 2], f"two trials per GPU: {shared}"


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only case")
def test_trials_csv_has_no_gpu_memory_column_without_cuda(packed_sweep):
    folder, _ = packed_sweep
    trials = read_results_csv(folder / "trials.csv")
    assert len(trials) == TRIALS and (trials["status"] == "ok").all()
    assert "gpu_peak_mb" not in trials.columns


def _oom_trainer(config, report):
    report({"step": 1, "loss": 1.0, "val_loss": 1.0})
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_cuda_out_of_memory_is_oom_with_the_error_line(linreg_dir, monkeypatch):
    """A torch.cuda.OutOfMemoryError out of a trainer ends the trial as ``oom``; with CUDA
    the error line also gives the trial's peak GPU memory."""
    import sys

    monkeypatch.syspath_prepend(str(linreg_dir))
    monkeypatch.setitem(sys.modules, "oom_trainer", type(sys)("oom_trainer"))
    sys.modules["oom_trainer"].train = _oom_trainer
    edit_linreg(linreg_dir, trainer="oom_trainer:train", output=str(linreg_dir / "out"))
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir)
    results: list[dict] = []
    reporter = run_trainer(sweep, {"lr": 0.05}, "t0", results.append)
    final = results[-1]
    assert final["sweeps/status"] == "crash" and final["sweeps/reason"] == "oom"
    error = reporter.verdict.evidence["error"]
    assert error.startswith("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert ("peak GPU memory" in error) == torch.cuda.is_available()
    assert ("sweeps/gpu_peak_mb" in final) == torch.cuda.is_available()


def _cuda_trainer(config, report):
    device = torch.device(config["sweep"]["device"])
    block = torch.ones(64, 2**20 // 4, device=device)  # 64 MiB
    report({"step": 1, "loss": float(block.sum()) * 0, "val_loss": 1.0})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_peak_gpu_memory_is_reported_per_trial(linreg_dir, monkeypatch):
    """On a CUDA machine: the trainer is handed cuda:0 and each trial reports its own peak
    (the counter is reset at the trial's start)."""
    import sys

    monkeypatch.syspath_prepend(str(linreg_dir))
    monkeypatch.setitem(sys.modules, "cuda_trainer", type(sys)("cuda_trainer"))
    sys.modules["cuda_trainer"].train = _cuda_trainer
    edit_linreg(linreg_dir, trainer="cuda_trainer:train", output=str(linreg_dir / "out"),
                resources={"cpu": 1, "gpu": 0.5})
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir)
    torch.ones(256, 2**20 // 4, device="cuda")  # 256 MiB before the trial: not its peak
    results: list[dict] = []
    run_trainer(sweep, {"lr": 0.05}, "t0", results.append)
    assert results[-1]["sweeps/status"] == "ok"
    assert 64 <= results[-1]["sweeps/gpu_peak_mb"] < 256 + 64


