"""The boundary probe (``sweeps stability --probe``) on a known boundary and against grids.

For each λ_max the quadratic of ``bench/quadratic.py`` (full-batch GD, diverges iff
lr > 2/λ_max) is probed twice: seeded by its ``loss_closure`` (the sharpness estimate's
``predicted`` boundary, 2/λ_max here, starts the bracket) and from its base LR as without
the closure (``--no-sharpness``). Per λ_max: the prediction, the seeded probe's interval,
whether it holds 2/λ_max (``low <= 2/λ_max < high``), its width (high/low), and the steps
of both probes against a log grid of the same resolution (ratio 1.25) over the unseeded
probe's bracketed range on the same seeds. One trial at a time in this process, as the
command runs them; well under 2 minutes on one core.

    .venv/bin/python bench/boundary.py [--steps 300] [--seeds 2] [--lams 0.5,2,10,100]

``--trainer direction-mlp|direction|regression|charlm|all`` runs the real trainers (``all``:
the quadratic too), each as ``bench/efficiency.py``'s case (same base config, space and
rules; ``bench/charlm.py`` for charlm) with ``--steps`` per run and lr in ``RANGE``:

- **the grid's boundary**: full-length runs (no early hold) on a log grid of ratio 1.25 on
  ``--seeds`` seeds from the lower of the two probes' (below) low/4 up to the higher high×4
  (extended, one point at a time, until its lowest point holds and some point fails); it
  is the interval from the largest grid LR where every seed held, below the first LR where
  a seed failed, to that first failing LR (a run a slow verdict such as
  ``flat_at_baseline`` stopped holds, as in the probe);
- **the probe**: ``run_probe(sweep, "lr", RANGE, seeds=2)`` as the command runs it, seeded
  by the trainer's ``loss_closure`` (``predicted``), and again without it (``no_seed``);
- ``contains``: the probe's interval and the grid's overlap, ``probe low <= grid high`` and
  ``grid low <= probe high``: the edge the grid locates (somewhere in (grid low, grid
  high]) can lie inside the probe's interval;
- the probe's steps against the ``grid_steps`` of its ``Boundary`` (a grid of the same
  resolution over the bracketed range on the same seeds) and against what this bench's
  own grid cost (``bench_grid``);
- **an LR range test alone** (``bench/lr_range_test.py``: 100 steps, LR rising
  exponentially over ``RANGE`` on fresh batches through the same ``loss_closure``): its
  answer (where the smoothed loss first exceeds 4× its minimum), whether it lies inside
  the grid's interval, and how far off (``lrt_off``: answer/grid high above it,
  answer/grid low below it, 1 inside); ``min×10`` is the other reading (10 × the LR of the
  smallest smoothed loss).

    .venv/bin/python bench/boundary.py --trainer all     # ~7 min on 2 loaded cores
"""

from __future__ import annotations

import argparse
import copy
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from common import SCRATCH, save, table

BENCH = Path(__file__).resolve().parent
#: The real trainers, in the order ``all`` runs them.
REAL = ("direction-mlp", "direction", "regression", "charlm")
TRAINERS = ("quadratic", *REAL)
#: The lr range the probe searches and the LR range test sweeps, on every real trainer.
RANGE = (1e-4, 10.0)
#: Grid points added beyond the window, at most, to find a held and a failed point.
EXTEND = 12


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


def overlaps(p_low: float | None, p_high: float | None, g_low: float | None,
             g_high: float | None) -> bool:
    """``contains`` of a real trainer: the probe's interval [p_low, p_high] and the grid's
    [g_low, g_high] overlap (``p_low <= g_high and g_low <= p_high``); False when either
    has an end missing."""
    if None in (p_low, p_high, g_low, g_high):
        return False
    return p_low <= g_high and g_low <= p_high  # type: ignore[operator]


def real_sweep(trainer: str, steps: int):
    """``trainer`` as ``bench/efficiency.py``'s case (``charlm``: ``bench/charlm.py``'s
    defaults, the same rule and space layout), writing into this script's scratch."""
    from sweeps.commands.stability import stability_sweep
    from sweeps.spec.loader import load_sweep_dict

    if trainer == "charlm":
        import charlm

        base = copy.deepcopy(charlm.DEFAULTS)
        base["training"]["eval_every"] = max(10, steps // 4)
        sweep = load_sweep_dict({
            "name": "boundary-charlm", "trainer": "charlm:train", "base_config": base,
            "search_space": {
                "lr": {"type": "loguniform", "low": RANGE[0], "high": RANGE[1]},
                "weight_decay": {"type": "loguniform", "low": 1e-5, "high": 1.0},
                "grad_clip": {"type": "loguniform", "low": 0.1, "high": 10.0},
                "dropout": {"type": "uniform", "low": 0.0, "high": 0.3},
                "warmup": {"type": "int", "low": 0, "high": 100, "step": 10}},
            "write_back": {"lr": "training.lr", "grad_clip": "training.grad_clip",
                           "dropout": "model.dropout",
                           "weight_decay": "training.weight_decay",
                           "warmup": "training.warmup_steps"},
            "objectives": [{"metric": "val_loss", "mode": "min"},
                           {"metric": "instability", "mode": "min"}],
            "rules": {"baseline_loss": charlm.baseline_loss(base), "flat_patience": 60},
            "budget": {"max_steps": steps}, "resources": {"cpu": 1, "gpu": 0},
        }, base_dir=BENCH, workdir=BENCH)
    else:
        from efficiency import builtin_sweep

        sweep = builtin_sweep(trainer, steps)
    sweep = replace(sweep, output_dir=SCRATCH / "boundary" / trainer)
    return stability_sweep(sweep)


def grid_boundary(sweep, base: dict[str, Any], seeds: list[int], low: float,
                  high: float, ratio: float = 1.25) -> dict[str, Any]:
    """Full-length runs on every seed at ``low``·ratio^k up to ``high`` (extended down
    until the lowest point holds, up until a point fails, EXTEND points at most each way):
    the grid's boundary (largest LR that held on every seed below the first LR where a
    seed failed; that LR), every point and the steps spent."""
    from sweeps.commands.stability import _probe_run
    from sweeps.protocol import SEED_KEY
    from sweeps.results.boundary import grid_points

    runs: dict[float, list] = {}

    def point(value: float) -> bool:
        if value not in runs:
            runs[value] = [_probe_run(sweep, {**base, "lr": value, SEED_KEY: seed},
                                      hold=False) for seed in seeds]
        return all(r.held for r in runs[value])

    values = [low * ratio ** k for k in range(grid_points(low, high, ratio))]
    held = [point(v) for v in values]
    for _ in range(EXTEND):  # the lowest point must hold
        if held[0]:
            break
        values.insert(0, values[0] / ratio)
        held.insert(0, point(values[0]))
    for _ in range(EXTEND):  # some point must fail
        if not all(held):
            break
        values.append(values[-1] * ratio)
        held.append(point(values[-1]))
    first = next((i for i, h in enumerate(held) if not h), None)
    g_low = values[first - 1] if first else (values[-1] if first is None else None)
    g_high = values[first] if first is not None else None
    rows = [{"lr": v, "held": [r.held for r in runs[v]],
             "reason": [r.reason for r in runs[v]], "stop_step": [r.stop_step for r in runs[v]],
             "steps": sum(r.steps for r in runs[v])} for v in values]
    return {"low": g_low, "high": g_high, "points": rows,
            "steps": sum(r["steps"] for r in rows),
            "nonmonotone": first is not None and any(held[first + 1:])}


def range_test(sweep, base: dict[str, Any], seed: int) -> dict[str, Any]:
    """The LR range test over RANGE through the trainer's ``loss_closure`` at the base
    config (the config a probe run with ``seed`` gets), with the base config's grad clip."""
    import importlib

    import torch
    from lr_range_test import lr_range_test

    from sweeps.protocol import SEED_KEY
    from sweeps.trial.run import trial_values

    module = importlib.import_module(sweep.spec.trainer.partition(":")[0])
    config = sweep.trial_config(trial_values(sweep, {**base, SEED_KEY: seed}),
                                trial_id="lr-range-test", seed=seed)
    config["sweep"].update(checkpoint=None, device="cpu")
    clip = config.get("training", {}).get("grad_clip")
    with torch.random.fork_rng(devices=[]):
        params, closure, optimizer = module.loss_closure(config)
        return lr_range_test(params, closure, optimizer, *RANGE,
                             grad_clip=float(clip) if clip else None).as_dict()


def real_row(trainer: str, steps: int, seeds: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One real trainer: the probe with and without its prediction, the grid's boundary
    and the LR range test; (the table row, the raw figures)."""
    from sweeps.commands.stability import run_probe
    from sweeps.trial.tryout import try_values

    start = time.perf_counter()
    sweep = real_sweep(trainer, steps)
    b = run_probe(sweep, "lr", RANGE, seeds=seeds).as_dict()
    t_probe = time.perf_counter() - start
    plain = run_probe(sweep, "lr", RANGE, seeds=seeds, predict=False).as_dict()
    base = try_values(sweep, {})
    seed_list = [sweep.spec.seed + i for i in range(seeds)]
    lows = [x for x in (b["boundary_low"], plain["boundary_low"]) if x]
    highs = [x for x in (b["boundary_high"], plain["boundary_high"]) if x]
    lo = min(lows) / 4 if lows else min(highs) / 16
    hi = max(highs) * 4 if highs else max(lows) * 16
    t0 = time.perf_counter()
    grid = grid_boundary(sweep, base, seed_list, lo, hi)
    t_grid = time.perf_counter() - t0
    lrt = range_test(sweep, base, seed_list[0])
    from lr_range_test import off

    g_low, g_high = grid["low"], grid["high"]
    lrt_off = off(lrt["answer"], g_low, g_high)
    row = {"trainer": trainer, "grid_low": g_low, "grid_high": g_high,
           "predicted": b["predicted"], "low": b["boundary_low"], "high": b["boundary_high"],
           "contains": overlaps(b["boundary_low"], b["boundary_high"], g_low, g_high),
           "high/low": b["width"], "steps": b["steps"], "grid_steps": b["grid_steps"],
           "steps/grid": b["ratio"], "bench_grid": grid["steps"],
           "steps/bench_grid": b["steps"] / grid["steps"] if grid["steps"] else None,
           "no_seed_low": plain["boundary_low"], "no_seed_high": plain["boundary_high"],
           "contains_no_seed": overlaps(plain["boundary_low"], plain["boundary_high"],
                                        g_low, g_high),
           "steps_no_seed": plain["steps"], "no_seed/grid": plain["ratio"],
           "lrt": lrt["answer"], "lrt_in_grid": lrt_off == 1.0, "lrt_off": lrt_off,
           "lrt_min×10": lrt["min_x10"], "min×10_off": off(lrt["min_x10"], g_low, g_high),
           "lrt_steps": lrt["steps"]}
    raw = {"probe": b, "probe_no_seed": plain, "grid": grid, "lr_range_test": lrt,
           "seconds": {"probe": t_probe, "grid": t_grid,
                       "total": time.perf_counter() - start}}
    print(table([row]), flush=True)
    return row, raw


def quadratic_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The quadratic's rows: per λ_max, the seeded and the unseeded probe vs 2/λ_max."""
    from sweeps.commands.stability import run_probe

    rows = []
    for lam in (float(v) for v in args.lams.split(",")):
        sweep = quadratic_sweep(lam, args.base_lr, args.steps)
        b = run_probe(sweep, "lr", (1e-6, 1e3), seeds=args.seeds).as_dict()
        plain = run_probe(sweep, "lr", (1e-6, 1e3), seeds=args.seeds, predict=False).as_dict()
        edge, low, high = 2 / lam, b["boundary_low"], b["boundary_high"]
        grid = plain["grid_steps"]
        rows.append({"lam_max": lam, "2/lam": edge, "predicted": b["predicted"],
                     "low": low, "high": high, "contains": contains(low, high, edge),
                     "high/low": b["width"], "probes": len(b["probes"]),
                     "steps": b["steps"], "steps_no_seed": plain["steps"],
                     "contains_no_seed": contains(plain["boundary_low"],
                                                  plain["boundary_high"], edge),
                     "grid_steps": grid, "steps/grid": b["steps"] / grid,
                     "no_seed/grid": plain["steps"] / grid})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trainer", choices=(*TRAINERS, "all"), default="quadratic",
                    help="the quadratic (default), a real trainer, or all of them")
    ap.add_argument("--lams", default="0.5,2,10,100", help="λ_max values, comma-separated")
    ap.add_argument("--base-lr", type=float, default=0.01, help="the quadratic's base LR")
    ap.add_argument("--steps", type=int, default=300, help="steps per probe run")
    ap.add_argument("--direction-steps", type=int, default=None,
                    help="steps per run on the direction transformer (default: --steps)")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--out", default="boundary")
    args = ap.parse_args()

    shutil.rmtree(SCRATCH / "boundary", ignore_errors=True)  # this script's own scratch
    names = TRAINERS if args.trainer == "all" else (args.trainer,)
    payload: dict[str, Any] = {"steps": args.steps, "seeds": args.seeds,
                               "base_lr": args.base_lr}
    start = time.perf_counter()
    if "quadratic" in names:
        rows = quadratic_rows(args)
        print(table(rows))
        print(f"{args.seeds} seed(s), {args.steps} steps per run, base lr {args.base_lr:g}, "
              f"{time.perf_counter() - start:.1f} s", flush=True)
        payload["rows"] = rows
    real, raw = [], {}
    for name in (n for n in names if n in REAL):
        steps = (args.direction_steps or args.steps) if name == "direction" else args.steps
        row, raw[name] = real_row(name, steps, args.seeds)
        real.append({**row, "steps_per_run": steps})
    if real:
        print(table(real))
        print(f"{args.seeds} seed(s), lr range {RANGE[0]:g}..{RANGE[1]:g}, "
              f"{time.perf_counter() - start:.0f} s")
        payload.update(real_rows=real, real_raw=raw, range=list(RANGE))
    save(args.out, payload)


if __name__ == "__main__":
    main()
