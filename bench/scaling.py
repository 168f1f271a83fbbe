"""Scaling figures for docs/scaling.md: driver memory per trial, TPE ask time, result volume.

    python bench/scaling.py --quick          # 200 tiny trials, TPE at 100/1000
    python bench/scaling.py                  # 1000 tiny trials, TPE at 100/1000/5000

Prints a markdown table per part and writes bench/results/scaling.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import optuna
import yaml

HERE = Path(__file__).resolve().parent
TRAINER = '''
def train(config, report):
    for step in range(1, 31):
        report({"step": step, "loss": 1.0 / step, "grad_norm": 1.0,
                "lr": config["t"]["lr"], "val_loss": 1.0 / step})
'''


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def driver_memory(trials: int) -> dict:
    """Run ``trials`` tiny trials (30 reports each); driver RSS and result volume."""
    from sweeps.commands.run import run_sweep
    from sweeps.spec.loader import load_sweep

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "tiny_trainer.py").write_text(TRAINER)
        (folder / "tiny.yaml").write_text(yaml.safe_dump({
            "name": "tiny", "trainer": "tiny_trainer:train", "base_config": {"t": {"lr": 0.1}},
            "search_space": {"lr": {"type": "loguniform", "low": 1e-4, "high": 1.0}},
            "write_back": {"lr": "t.lr"},
            "budget": {"trials": trials, "max_steps": 30, "concurrent": 2, "scheduler": "none"},
            "confirm": {"seeds": 0, "lr_probe": 0}, "output": str(folder / "results")}))
        cwd = os.getcwd()
        os.chdir(folder)
        try:
            sweep = load_sweep(folder / "tiny.yaml", workdir=folder)
            before = rss_mb()
            start = time.perf_counter()
            outcome = run_sweep(sweep, progress=False, check=False)
            wall = time.perf_counter() - start
            after = rss_mb()
        finally:
            os.chdir(cwd)
        out = sweep.output_dir
        journal = sum(p.stat().st_size for p in (out / "trials").glob("*.jsonl"))
        ray_dir = sum(p.stat().st_size for p in (out / "ray").rglob("*") if p.is_file())
        return {"trials": trials, "reports_per_trial": 30, "wall_s": wall,
                "driver_rss_before_mb": before, "driver_rss_after_mb": after,
                "driver_mb_per_trial": (after - before) / trials,
                "journal_bytes_per_report": journal / (trials * 30),
                "ray_dir_bytes_per_trial": ray_dir / trials,
                "ok": int((outcome.trials["status"] == "ok").sum())}


def tpe_ask_time(finished: int, asks: int = 20) -> dict:
    """Median time of one TPE ask (6 knobs, 2 objectives, constraints) after ``finished``."""
    from sweeps.tune.searcher import CONSTRAINT

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = {
        "lr": optuna.distributions.FloatDistribution(1e-5, 1e-1, log=True),
        "grad_clip": optuna.distributions.FloatDistribution(0.1, 10, log=True),
        "dropout": optuna.distributions.FloatDistribution(0.0, 0.3),
        "weight_decay": optuna.distributions.FloatDistribution(1e-6, 1e-1, log=True),
        "warmup": optuna.distributions.IntDistribution(0, 100, step=10),
        "compile": optuna.distributions.CategoricalDistribution(["none", "default"]),
    }
    sampler = optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=10)
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    rng = optuna.samplers.RandomSampler(seed=1)
    filler = optuna.create_study(directions=["minimize", "minimize"], sampler=rng)
    trials = []
    for i in range(finished):
        t = filler.ask(space)
        lr = t.params["lr"]
        unstable = lr > 3e-2
        q = abs(lr - 1e-3) * 100 + t.params["dropout"]
        trials.append(optuna.trial.create_trial(
            params=t.params, distributions=space, values=[q, 10.0 if unstable else i % 7 / 7],
            system_attrs={f"constraints:{CONSTRAINT}": 1.0 if unstable else 0.0}))
    study.add_trials(trials)
    times = []
    for _ in range(asks):
        start = time.perf_counter()
        trial = study.ask(space)
        times.append(time.perf_counter() - start)
        study.tell(trial, [1.0, 1.0])
    return {"finished_trials": finished, "ask_median_ms": statistics.median(times) * 1e3,
            "ask_max_ms": max(times) * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trials", type=int, default=None)
    args = parser.parse_args(argv)
    trials = args.trials or (200 if args.quick else 1000)
    sizes = [100, 1000] if args.quick else [100, 1000, 5000]
    from tabulate import tabulate

    mem = driver_memory(trials)
    print("## Driver memory and result volume\n")
    print(tabulate([mem], headers="keys", tablefmt="github", floatfmt=".3g"))
    asks = [tpe_ask_time(n) for n in sizes]
    print("\n## TPE ask time (6 knobs, 2 objectives, stability constraint)\n")
    print(tabulate(asks, headers="keys", tablefmt="github", floatfmt=".3g"))
    out = HERE / "results" / "scaling.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"memory": mem, "tpe": asks, "argv": sys.argv[1:]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
