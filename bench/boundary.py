"""The boundary probe (``sweeps stability --probe``) on a quadratic with a known boundary.

For each λ_max the quadratic of ``bench/quadratic.py`` (full-batch GD, diverges iff
lr > 2/λ_max) is probed from its base LR: the reported interval, whether it holds
2/λ_max (``low <= 2/λ_max < high``), its width (high/low) and the steps spent vs a log
grid of the same resolution (ratio 1.25) over the bracketed range on the same seeds. One trial at a
time in this process, as the command runs them; well under 2 minutes on one core.

    .venv/bin/python bench/boundary.py [--steps 300] [--seeds 2] [--lams 0.5,2,10,100]
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from common import SCRATCH, save, table

BENCH = Path(__file__).resolve().parent


def quadratic_sweep(lam: float, lr: float, steps: int):
    """A sweep of the quadratic with λ_max = ``lam``, base LR ``lr``, lr in 1e-6..1e3."""
    from sweeps.commands.stability import stability_sweep
    from sweeps.spec.loader import load_sweep_dict

    data = {
        "name": f"quadratic-{lam:g}",
        "trainer": "quadratic:train",
        "base_config": {"quad": {"lr": lr, "lam": lam, "dim": 8, "spread": 100.0}},
        "search_space": {"lr": {"type": "loguniform", "low": 1e-6, "high": 1e3}},
        "write_back": {"lr": "quad.lr"},
        "objectives": [{"metric": "loss", "mode": "min"}],
        "budget": {"trials": 1, "max_steps": steps, "concurrent": 1, "scheduler": "none"},
        "resources": {"cpu": 1, "gpu": 0},
        "output": str(SCRATCH / "boundary"),
    }
    return stability_sweep(load_sweep_dict(data, base_dir=BENCH, workdir=BENCH))


def contains(low: float | None, high: float | None, edge: float) -> bool:
    """``low <= edge < high`` (lr = 2/λ_max itself holds: |1 - lr·λ| = 1 neither grows nor
    shrinks), to a relative 1e-9 for a probe point that lands on the edge."""
    return low is not None and high is not None and low <= edge * (1 + 1e-9) and edge < high


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lams", default="0.5,2,10,100", help="λ_max values, comma-separated")
    ap.add_argument("--base-lr", type=float, default=0.01, help="the base config's LR")
    ap.add_argument("--steps", type=int, default=300, help="steps per probe run")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--out", default="boundary")
    args = ap.parse_args()
    from sweeps.commands.stability import run_probe

    shutil.rmtree(SCRATCH / "boundary", ignore_errors=True)  # this script's own scratch
    rows = []
    start = time.perf_counter()
    for lam in (float(v) for v in args.lams.split(",")):
        sweep = quadratic_sweep(lam, args.base_lr, args.steps)
        b = run_probe(sweep, "lr", (1e-6, 1e3), seeds=args.seeds).as_dict()
        edge, low, high = 2 / lam, b["boundary_low"], b["boundary_high"]
        rows.append({"lam_max": lam, "2/lam": edge, "low": low, "high": high,
                     "contains": contains(low, high, edge),
                     "high/low": b["width"], "probes": len(b["probes"]),
                     "steps": b["steps"], "grid_steps": b["grid_steps"],
                     "steps/grid": b["ratio"]})
    print(table(rows))
    print(f"{args.seeds} seed(s), {args.steps} steps per run, base lr {args.base_lr:g}, "
          f"{time.perf_counter() - start:.1f} s")
    save(args.out, {"steps": args.steps, "seeds": args.seeds, "base_lr": args.base_lr,
                    "rows": rows})


if __name__ == "__main__":
    main()
