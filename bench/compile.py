"""Cold vs warm compiles: what a trial of a compile mode pays at its first step.

Trials of a reference trainer (``trainers/direction.py``, the quickstart's transformer, by
default; ``--trainer regression``: a tiny MLP) run
through sweeps' own worker path (``prepare_process`` + ``run_trainer``: a clean compiler
state per trial, one inductor cache per sweep), each scenario in fresh processes:

- ``cold``: a new worker, an empty cache: what the first trial of a mode in a sweep pays;
- ``warm, same worker``: the next trial on that worker, same graph-shaping knobs, another
  seed (a confirmation seed, the LR probe, a trial that differs only in LR, clip, weight
  decay or warmup);
- ``warm, new worker``: the same trial in another process that finds the cache filled;
- ``other dropout, same worker``: a trial whose dropout differs: dropout is a constant of
  the compiled graph, so this is a new graph (a cache miss) and saves only the worker's
  one-time warm-up;
- ``no reset, 9 trials`` (``--limit-trials``): what a reused worker did before each trial
  started from a clean state: trials with distinct dropouts pile up dynamo's compiled
  entries until ``recompile_limit`` (8) and later trials run eagerly with no word.

``compile_s`` is the trainer's first step (forward, backward, optimizer step; compilation
happens there); ``graphs`` / ``cache`` are sweeps' compile evidence of the trial.

    python bench/compile.py --quick           # default mode only, 1 repeat (~4 min)
    python bench/compile.py --modes default,max-autotune --repeats 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, SCRATCH, machine, median, save, table  # noqa: E402

TARGET = 0.25  # warm compile_s at most this share of cold


#: Reference trainers: module, base config, the key of its training-set size.
TRAINERS = {
    "direction": ("sweeps.trainers.direction:train", "direction.yaml", "n_events"),
    "regression": ("sweeps.trainers.regression:train", "regression.yaml", "n_train"),
}


def sweep_dict(trainer: str, mode: str, cache_root: str, events: int, steps: int) -> dict:
    """A reference trainer's base config with ``events`` training samples, ``mode`` fixed
    and dropout searched; the inductor cache is ``cache_root/compile-bench/inductor_cache``.
    The regression trainer runs a tiny MLP (hidden 32, 2 layers): the smoke test's size."""
    import yaml

    target, config, size_key = TRAINERS[trainer]
    base = yaml.safe_load((ROOT / "examples" / "configs" / config).read_text())
    base["data"][size_key] = events
    if trainer == "regression":
        base["data"]["n_val"] = 128
        base["model"].update(hidden=32, layers=2)
    return {
        "name": "compile-bench", "trainer": target, "base_config": base,
        "search_space": {"dropout": {"type": "uniform", "low": 0.0, "high": 0.3},
                         "compile": mode},
        "write_back": {"dropout": "model.dropout", "compile": "training.compile"},
        "rules": {"baseline_loss": 1.5708 if trainer == "direction" else 1.0},
        "budget": {"trials": 1, "max_steps": steps},
        "output": cache_root, "seed": 0,
    }


def child(args: argparse.Namespace) -> None:
    """Run ``--trials`` (dropout:seed pairs) one after another in this process; print JSON."""
    sys.path.insert(0, str(ROOT))
    from sweeps.protocol import SEED_KEY
    from sweeps.spec.loader import load_sweep_dict
    from sweeps.trial.run import prepare_process, run_trainer

    sweep = load_sweep_dict(sweep_dict(args.trainer, args.mode, args.cache, args.events,
                                       args.steps), base_dir=ROOT, workdir=Path.cwd())
    if args.no_reset:
        import sweeps.trial.run as trainable

        trainable.reset_compiler = lambda: None
    prepare_process(sweep, args.threads)
    out = []
    for pair in args.trials.split(","):
        dropout, seed = pair.split(":")
        results: list[dict] = []
        start = time.perf_counter()
        run_trainer(sweep, {"dropout": float(dropout), SEED_KEY: int(seed)}, "bench",
                    results.append)
        wall = time.perf_counter() - start
        evidence = next((json.loads(r["sweeps/compile"]) for r in reversed(results)
                         if "sweeps/compile" in r), {})
        first = results[0] if results else {}
        out.append({"dropout": float(dropout), "seed": int(seed), "wall_s": wall,
                    "compile_s": first.get("compile_s", first.get("step_time")),
                    "status": results[-1].get("sweeps/status") if results else None,
                    "evidence": evidence})
    print("RESULT " + json.dumps(out))


def run_child(mode: str, cache: str, trials: list[tuple[float, int]], args,
              no_reset: bool = False) -> list[dict]:
    cmd = [sys.executable, __file__, "--child", "--trainer", args.trainer, "--mode", mode,
           "--cache", cache,
           "--events", str(args.events), "--steps", str(args.steps),
           "--threads", str(args.threads),
           "--trials", ",".join(f"{d}:{s}" for d, s in trials)]
    if no_reset:
        cmd.append("--no-reset")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=3600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"bench child failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def measure(mode: str, args) -> dict[str, list[dict]]:
    """Each scenario's trials for one mode, over ``--repeats`` fresh caches."""
    out: dict[str, list[dict]] = {k: [] for k in (
        "cold", "warm, same worker", "other dropout, same worker", "warm, new worker")}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="compile-bench-", dir=SCRATCH) as cache:
            first = run_child(mode, cache, [(0.1, 0), (0.1, 1), (0.2, 0)], args)
            out["cold"].append(first[0])
            out["warm, same worker"].append(first[1])
            out["other dropout, same worker"].append(first[2])
            out["warm, new worker"].append(run_child(mode, cache, [(0.1, 2)], args)[0])
    return out


def limit_run(args) -> list[dict]:
    """``--limit-trials`` trials with distinct dropouts on one worker, no reset between."""
    drops = [round(0.05 + 0.02 * i, 2) for i in range(args.limit_trials)]
    with tempfile.TemporaryDirectory(prefix="compile-bench-", dir=SCRATCH) as cache:
        return run_child("default", cache, [(d, 0) for d in drops], args, no_reset=True)


def _ev(trial: dict) -> str:
    ev = trial.get("evidence") or {}
    return f"{ev.get('graphs', 0)} / {ev.get('cache_hits', 0)} hit {ev.get('cache_misses', 0)} miss"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="default mode, 1 repeat")
    ap.add_argument("--modes", default="default,max-autotune")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--trainer", choices=sorted(TRAINERS), default="direction",
                    help="reference trainer (regression: a tiny MLP, for a smoke test)")
    ap.add_argument("--events", type=int, default=2000,
                    help="training samples (data only; compilation does not depend on it)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (resources.cpu)")
    ap.add_argument("--limit-trials", type=int, default=10,
                    help="trials of the no-reset run (0: skip it)")
    ap.add_argument("--out", default="compile")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ap.add_argument("--trials", help=argparse.SUPPRESS)
    ap.add_argument("--no-reset", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if args.quick:
        args.modes, args.repeats = "default", 1
    SCRATCH.mkdir(parents=True, exist_ok=True)
    modes = [m for m in args.modes.split(",") if m]
    raw: dict[str, dict[str, list[dict]]] = {}
    rows = []
    eager = run_child("none", tempfile.mkdtemp(prefix="compile-bench-", dir=SCRATCH),
                      [(0.1, 0)], args)[0]
    rows.append({"mode": "none (eager)", "scenario": "first step", "compile_s":
                 eager["compile_s"], "÷ cold": None, "graphs / cache": _ev(eager)})
    verdicts = []
    for mode in modes:
        raw[mode] = measure(mode, args)
        cold = median([t["compile_s"] for t in raw[mode]["cold"]])
        for scenario, trials in raw[mode].items():
            value = median([t["compile_s"] for t in trials])
            rows.append({"mode": mode, "scenario": scenario, "compile_s": value,
                         "÷ cold": value / cold if cold else None,
                         "graphs / cache": _ev(trials[-1])})
        for scenario in ("warm, same worker", "warm, new worker"):
            share = median([t["compile_s"] for t in raw[mode][scenario]]) / cold
            verdicts.append(f"{mode}, {scenario}: warm = {share:.0%} of cold: target <= "
                            f"{TARGET:.0%} {'met' if share <= TARGET else 'MISSED'}")
    print(f"\nReference trainer (trainers/{args.trainer}.py), {args.events} samples, "
          f"{args.threads} torch thread(s), median of {args.repeats} fresh cache(s)\n")
    print(table(rows))
    print()
    print("\n".join(verdicts))
    limit = []
    if args.limit_trials:
        limit = limit_run(args)
        print(f"\nBefore the fix: {args.limit_trials} compile=default trials on one worker, "
              "each with another dropout, no compiler reset between them\n")
        print(table([{"trial": i, "dropout": t["dropout"], "compile_s": t["compile_s"],
                      "limit hit": "yes" if t["evidence"].get("limit") else "no"}
                     for i, t in enumerate(limit)]))
    path = save(args.out, {"args": vars(args), "rows": rows, "raw": raw, "eager": eager,
                           "verdicts": verdicts, "no_reset": limit})
    print(f"\nraw figures: {path}; machine load {machine()['loadavg']}")


if __name__ == "__main__":
    main()
