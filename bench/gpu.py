"""Trials per GPU-hour: packing 1 / 2 / 4 trials on one GPU, compile none / default /
reduce-overhead, on the reference trainer (``trainers/direction.py``).

Each cell runs ``--trials-per-slot`` x packing trials of the reference trainer through
sweeps' own Ray Tune path (``sweeps.tune.experiments.run_configs``: reused workers, a clean compiler
state per trial, one compile cache per cell) on a Ray that has one GPU, with
``resources.gpu = 1 / packing`` and as many trials at once as fit. Trials per GPU-hour
is trials x 3600 / wall seconds of the cell (cold compiles included: a sweep pays them);
``step_time`` is the median steady-state step of the cell's trials, ``peak MiB`` the
largest peak GPU memory of one trial.

Runs on any machine with CUDA; without CUDA it prints why and exits 0 ("skipped: no
CUDA"): the figures are GPU figures or none.

    python bench/gpu.py                               # all 9 cells, ~1 h on one GPU
    python bench/gpu.py --packing 1,4 --compile none,default --steps 100
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, SCRATCH, machine, median, save, table  # noqa: E402

SKIPPED = "skipped: no CUDA"


def sweep_dict(mode: str, packing: int, cpus: float, events: int, steps: int,
               output: Path) -> dict:
    """The reference trainer's base config, ``compile`` fixed to ``mode`` and ``lr`` free (each
    trial gets its own seed), ``resources.gpu = 1 / packing``."""
    import yaml

    base = yaml.safe_load((ROOT / "examples" / "configs" / "direction.yaml").read_text())
    base["data"]["n_events"] = events
    return {
        "name": f"gpu-{mode}-x{packing}", "trainer": "sweeps.trainers.direction:train",
        "base_config": base,
        "search_space": {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2},
                         "compile": mode},
        "write_back": {"lr": "training.lr", "compile": "training.compile"},
        "rules": {"baseline_loss": 1.5708},
        "budget": {"trials": 1, "max_steps": steps, "concurrent": packing,
                   "scheduler": "none"},
        "resources": {"cpu": cpus, "gpu": 1.0 / packing},
        "output": str(output), "seed": 0,
    }


def run_cell(mode: str, packing: int, args: argparse.Namespace) -> dict:
    """One cell: its trials on Ray, timed; trials per GPU-hour and per-trial figures."""
    from sweeps.protocol import SEED_KEY
    from sweeps.record.book import books_of, open_book
    from sweeps.spec.loader import load_sweep_dict
    from sweeps.tune.experiments import run_configs

    cpus = max(0.25, args.cpus / packing)
    output = Path(tempfile.mkdtemp(prefix="gpu-bench-", dir=SCRATCH))  # a cold cache per cell
    sweep = load_sweep_dict(sweep_dict(mode, packing, cpus, args.events, args.steps, output),
                            base_dir=ROOT, workdir=Path.cwd())
    trials = args.trials_per_slot * packing
    configs = [{"lr": 2e-3, SEED_KEY: i} for i in range(trials)]
    with books_of(sweep):
        book = open_book(sweep, "bench")
        start = time.perf_counter()
        run_configs(sweep, book, configs, "bench", progress=False)
        wall = time.perf_counter() - start
        recs = list(book.trials.values())
    from sweeps.record import objectives

    ok = [r for r in recs if r.status == "ok"]
    steps = [objectives.steady_step_time(r.history) for r in ok]
    compile_s = [objectives.compile_seconds(r.history) for r in ok]
    peaks = [r.gpu_peak_mb for r in recs if r.gpu_peak_mb is not None]
    return {"compile": mode, "packing": packing, "trials": len(recs), "ok": len(ok),
            "wall_s": wall, "trials / GPU-h": len(ok) * 3600 / wall if wall else None,
            "step_time": median(steps), "compile_s": median(compile_s),
            "peak MiB": max(peaks) if peaks else None,
            "reasons": sorted({r.reason for r in recs if r.reason})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packing", default="1,2,4", help="trials per GPU")
    ap.add_argument("--compile", default="none,default,reduce-overhead")
    ap.add_argument("--trials-per-slot", type=int, default=2,
                    help="trials per packing slot (the first of a slot pays the cold compile)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--events", type=int, default=30000)
    ap.add_argument("--cpus", type=float, default=float(os.cpu_count() or 1),
                    help="CPUs shared by the trials on the GPU")
    ap.add_argument("--out", default="gpu")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(f"{SKIPPED}: torch.cuda.is_available() is False on this machine (torch "
              f"{torch.__version__}); run bench/gpu.py on a machine with a CUDA GPU to "
              "measure trials per GPU-hour")
        return
    from sweeps.tune.session import ray_running

    SCRATCH.mkdir(parents=True, exist_ok=True)
    rows = []
    # one GPU (the first visible one) for every cell, so trials per GPU-hour compare
    with ray_running(num_cpus=max(1, int(args.cpus)), num_gpus=1):
        for mode in [m for m in args.compile.split(",") if m]:
            for packing in [int(p) for p in args.packing.split(",") if p]:
                rows.append(run_cell(mode, packing, args))
                print(f"{mode} x{packing}: {rows[-1]['trials / GPU-h']:.3g} trials/GPU-h",
                      flush=True)
        gpu_name = torch.cuda.get_device_name(0)
    base = {r["compile"]: r["trials / GPU-h"] for r in rows if r["packing"] == 1}
    eager = next((r["trials / GPU-h"] for r in rows
                  if r["compile"] == "none" and r["packing"] == 1), None)
    for r in rows:
        own = base.get(r["compile"])
        r["÷ packing 1"] = r["trials / GPU-h"] / own if own else None
        r["÷ none, packing 1"] = r["trials / GPU-h"] / eager if eager else None
    print(f"\nReference trainer (trainers/direction.py), {args.events} events, {args.steps} "
          f"steps, {args.trials_per_slot} trial(s) per slot, one {gpu_name}\n")
    print(table([{k: v for k, v in r.items() if k != "reasons"} for r in rows]))
    failed = [f"{r['compile']} x{r['packing']}: {r['reasons']}" for r in rows
              if r["ok"] < r["trials"]]
    if failed:
        print("\ntrials that did not end ok: " + "; ".join(failed))
    path = save(args.out, {"args": vars(args), "gpu": gpu_name, "rows": rows})
    print(f"\nraw figures: {path}; machine load {machine()['loadavg']}")


if __name__ == "__main__":
    main()
