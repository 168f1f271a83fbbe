"""Sample efficiency: training steps until a stable, near-best config, same budget per method.

Methods (each: ``--trials`` trials of at most ``--steps`` steps, 2 at a time except the
in-process Optuna loop, trial seed = sampler seed = the run's seed, no initial points):

- ``sweeps``: ``run_sweep`` (OptunaSearch-based stability-aware TPE, rules, ASHA on val_loss);
- ``tune+optuna+asha``: ``tune.Tuner`` + ``OptunaSearch(metric="val_loss", mode="min")``
  (default TPE) + ``ASHAScheduler``, no stopper;
- ``tune random+asha``: ``tune.Tuner`` with the default ``BasicVariantGenerator`` over the
  same space (``tune.loguniform`` ...) + the same ASHA, no stopper;
- ``optuna tpe+median``: ``optuna.create_study`` (default TPE) + ``MedianPruner``,
  ``trial.report(val_loss, step)`` at evaluations, in-process, 1 trial at a time.

ASHA everywhere: max_t = steps, grace = steps / 4, reduction factor 3 (what sweeps uses).
Every trial's history is judged afterwards the same way: stable = no rule of the sweep's
``RuleSettings`` fires on any prefix of it and its final val_loss is finite. Steps = the
last ``step`` each trial ran. "Steps to 2 %" = cumulative steps, in trial completion
order, when the first stable trial within 2 % of the best stable val_loss any method
found (on that trainer, any seed) completed.

    python bench/efficiency.py --quick
    python bench/efficiency.py --trainer direction --trials 40 --steps 400 --seeds 5
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ROOT,
    SCRATCH,
    Collector,
    first_verdict,
    machine,
    median,
    save,
    spread,
    table,
    trainer_history,
    tune_space,
)

BENCH = str(Path(__file__).resolve().parent)
CONCURRENT = 2
METHODS = ("sweeps", "tune+optuna+asha", "tune random+asha", "optuna tpe+median")

SPACES = {
    "direction": {
        "trainer": "trainers.direction:train",
        "base": "examples/configs/direction.yaml",
        "data": {"n_events": 5000, "n_val": 500},
        "space": {
            "lr": {"type": "loguniform", "low": 1e-4, "high": 1.0},
            "grad_clip": {"type": "categorical", "choices": [0, 1.0, 5.0]},
            "dropout": {"type": "uniform", "low": 0.0, "high": 0.3},
            "weight_decay": {"type": "loguniform", "low": 1e-6, "high": 1e-1},
            "warmup": {"type": "int", "low": 0, "high": 50, "step": 10},
            "normalize_inputs": {"type": "categorical", "choices": [True, False]},
        },
        "write_back": {"lr": "training.lr", "grad_clip": "training.grad_clip",
                       "dropout": "model.dropout", "weight_decay": "training.weight_decay",
                       "warmup": "training.warmup_steps",
                       "normalize_inputs": "data.normalize_inputs"},
        "rules": {"baseline_loss": 1.5708, "flat_patience": 60},
    },
    "regression": {
        "trainer": "trainers.regression:train",
        "base": "examples/configs/regression.yaml",
        "data": {},
        "space": {
            "lr": {"type": "loguniform", "low": 1e-4, "high": 1.0},
            "weight_decay": {"type": "loguniform", "low": 1e-5, "high": 1.0},
            "grad_clip": {"type": "loguniform", "low": 0.1, "high": 10.0},
            "dropout": {"type": "uniform", "low": 0.0, "high": 0.3},
            "warmup": {"type": "int", "low": 0, "high": 100, "step": 10},
        },
        "write_back": {"lr": "training.lr", "grad_clip": "training.grad_clip",
                       "dropout": "model.dropout", "weight_decay": "training.weight_decay",
                       "warmup": "training.warmup_steps"},
        "rules": {"baseline_loss": 1.0},
    },
}


def make_sweep(trainer: str, trials: int, steps: int, seed: int):
    import yaml

    from sweeps.spec import load_sweep_dict

    spec = SPACES[trainer]
    base = yaml.safe_load((ROOT / spec["base"]).read_text())
    base.setdefault("data", {}).update(spec["data"])
    base["training"]["eval_every"] = max(10, steps // 4)
    data = {
        "name": f"eff-{trainer}-{seed}", "trainer": spec["trainer"], "base_config": base,
        "search_space": spec["space"], "write_back": spec["write_back"],
        "objectives": [{"metric": "val_loss", "mode": "min"},
                       {"metric": "instability", "mode": "min"}],
        "rules": spec["rules"],
        "budget": {"trials": trials, "max_steps": steps, "concurrent": CONCURRENT},
        "confirm": {"seeds": 0, "lr_probe": 0},
        "resources": {"cpu": 1, "gpu": 0},
        "output": str(SCRATCH / "efficiency"), "seed": seed,
    }
    return load_sweep_dict(data, base_dir=ROOT)


def _trial(values: dict, history: list[dict]) -> dict[str, Any]:
    return {"values": values, "history": history}


def _search_on_quality(sweep):
    """The same sweep with TPE on val_loss alone and stability as a constraint only."""
    from dataclasses import replace

    budget = sweep.spec.budget.model_copy(update={"search_on": "quality"})
    spec = sweep.spec.model_copy(update={"budget": budget, "name": sweep.spec.name + "-q"})
    return replace(sweep, spec=spec, output_dir=sweep.output_dir.with_name(spec.name))


def run_sweeps(sweep) -> list[dict]:
    from sweeps import book as book_mod
    from sweeps.pipeline import run_sweep

    order: list[str] = []
    original = book_mod.TrialBook.finish

    def finish(self, trial_id, result, error):  # record the completion order
        rec = original(self, trial_id, result, error)
        if trial_id not in order:
            order.append(trial_id)
        return rec

    env = dict(os.environ)
    book_mod.TrialBook.finish = finish
    try:
        out = run_sweep(sweep, progress=False, check=False)
    finally:
        book_mod.TrialBook.finish = original
        os.environ.clear()
        os.environ.update(env)
    recs = out.book.trials
    ids = order + [t for t in recs if t not in order]
    return [_trial(recs[t].values, list(recs[t].history)) for t in ids if recs[t].role == "search"]


def _tune_trainable(sweep, seed: int):
    def trainable(config):
        sys.path.insert(0, BENCH)
        import torch
        from common import tune_report_adapter
        from ray import tune as t

        from sweeps.trainer_loader import load_trainer

        torch.set_num_threads(1)
        train = load_trainer(sweep.spec.trainer, sweep.trainer_paths)
        values = {k: v for k, v in config.items() if k in sweep.space}
        cfg = sweep.trial_config(values, trial_id=t.get_context().get_trial_id(), seed=seed)
        train(cfg, tune_report_adapter())

    return trainable


def run_tune(sweep, seed: int, random: bool) -> list[dict]:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator
    from ray.tune.search.optuna import OptunaSearch

    from sweeps.space import optuna_space

    budget = sweep.spec.budget
    asha = ASHAScheduler(metric="val_loss", mode="min", time_attr="training_iteration",
                         max_t=budget.max_steps, grace_period=max(1, budget.max_steps // 4),
                         reduction_factor=3)
    if random:
        search, space = BasicVariantGenerator(random_state=seed), tune_space(sweep)
    else:
        search = OptunaSearch(space=optuna_space(sweep.space), metric="val_loss", mode="min",
                              seed=seed)
        space = None
    collector = Collector()
    tuner = tune.Tuner(
        tune.with_resources(_tune_trainable(sweep, seed), {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(search_alg=search, scheduler=asha,
                                    num_samples=budget.trials,
                                    max_concurrent_trials=CONCURRENT),
        run_config=tune.RunConfig(name=f"{sweep.name}-{'random' if random else 'optuna'}",
                                  storage_path=str(SCRATCH / "efficiency"), verbose=0,
                                  callbacks=[collector]))
    tuner.fit()
    ids = collector.order + [t for t in collector.history if t not in collector.order]
    out = []
    for tid in ids:
        values = {k: v for k, v in collector.config.get(tid, {}).items() if k in sweep.space}
        out.append(_trial(values, trainer_history(collector.history.get(tid, []))))
    return out


def run_optuna(sweep, seed: int) -> list[dict]:
    import optuna
    import torch

    from sweeps.space import optuna_space
    from sweeps.trainer_loader import load_trainer

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    train = load_trainer(sweep.spec.trainer, sweep.trainer_paths)
    space = optuna_space(sweep.space)
    study = optuna.create_study(direction="minimize",
                                sampler=optuna.samplers.TPESampler(seed=seed),
                                pruner=optuna.pruners.MedianPruner())
    trials: list[dict] = []

    def suggest(trial, name, dist):
        if isinstance(dist, optuna.distributions.FloatDistribution):
            return trial.suggest_float(name, dist.low, dist.high, log=dist.log)
        if isinstance(dist, optuna.distributions.IntDistribution):
            return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
        return trial.suggest_categorical(name, dist.choices)

    def objective(trial):
        values = {name: suggest(trial, name, dist) for name, dist in space.items()}
        history: list[dict] = []
        trials.append(_trial(values, history))

        def report(metrics):
            history.append({k: (float(v) if hasattr(v, "item") else v)
                            for k, v in metrics.items()})
            if "val_loss" in metrics:
                trial.report(float(metrics["val_loss"]), int(metrics["step"]))
                if trial.should_prune():
                    raise optuna.TrialPruned()

        train(sweep.trial_config(values, trial_id=str(trial.number), seed=seed), report)
        vals = [h["val_loss"] for h in history if "val_loss" in h]
        return float(vals[-1]) if vals else float("nan")

    study.optimize(objective, n_trials=sweep.spec.budget.trials, catch=(Exception,))
    return trials


def judge(sweep, trials: list[dict]) -> list[dict]:
    """Post-hoc, identical for every method: steps run, final val_loss, stable or not."""
    from sweeps.trainable import trial_settings

    out = []
    for t in trials:
        hist = t["history"]
        steps = int(hist[-1].get("step", 0)) if hist else 0
        vals = [h["val_loss"] for h in hist if isinstance(h.get("val_loss"), (int, float))]
        final = float(vals[-1]) if vals else float("nan")
        verdict = first_verdict(hist, trial_settings(sweep, t["values"])) if hist else None
        stable = verdict is None and math.isfinite(final) and bool(hist)
        out.append({"values": t["values"], "steps": steps, "final_val_loss": final,
                    "stable": stable, "reason": verdict.reason if verdict else None})
    return out


def steps_to(judged: list[dict], threshold: float) -> int | None:
    total = 0
    for t in judged:
        total += t["steps"]
        if t["stable"] and t["final_val_loss"] <= threshold:
            return total
    return None


def summarise(trainer: str, runs: dict[str, list[list[dict]]], cap: int) -> tuple[list, dict]:
    best = min((t["final_val_loss"] for per_seed in runs.values() for judged in per_seed
                for t in judged if t["stable"]), default=float("nan"))
    stats: dict[str, dict] = {}
    for method, per_seed in runs.items():
        s: dict[str, Any] = {"to2": [], "to10": [], "best": [], "unstable": [], "total": []}
        for judged in per_seed:
            total = sum(t["steps"] for t in judged)
            s["total"].append(total)
            s["to2"].append(steps_to(judged, best * 1.02))
            s["to10"].append(steps_to(judged, best * 1.10))
            stable = [t["final_val_loss"] for t in judged if t["stable"]]
            s["best"].append(min(stable) if stable else None)
            bad = sum(t["steps"] for t in judged if not t["stable"])
            s["unstable"].append(bad / total if total else None)
        stats[method] = s

    def med(xs):  # a seed that never got there counts as the whole budget (a lower bound)
        missing = sum(x is None for x in xs)
        return median([cap if x is None else x for x in xs]), missing

    ours2, _ = med(stats["sweeps"]["to2"])
    ours10, _ = med(stats["sweeps"]["to10"])
    rows = []
    for method, s in stats.items():
        m2, miss2 = med(s["to2"])
        m10, miss10 = med(s["to10"])
        n = len(s["to2"])
        rows.append({
            "trainer": trainer, "method": method,
            "steps to 2 % (median)": f"{'≥' if miss2 * 2 >= n else ''}{m2:.0f}",
            "reached 2 %": f"{n - miss2}/{n}",
            "÷ sweeps (2 %)": m2 / ours2 if ours2 else None,
            "steps to 10 % (median)": f"{'≥' if miss10 * 2 >= n else ''}{m10:.0f}",
            "÷ sweeps (10 %)": m10 / ours10 if ours10 else None,
            "best stable val_loss (median)": median(s["best"]),
            "best stable (spread)": spread(s["best"]),
            "unstable step share (median)": median(s["unstable"]),
            "steps run (median)": median(s["total"]),
        })
    return rows, {"best_any_method": best, "per_method": stats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="regression 16x200 and direction 10x120, 2 seeds")
    ap.add_argument("--trainer", choices=("direction", "regression", "both"), default="both")
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--methods", default=",".join(METHODS))
    args = ap.parse_args()
    budgets = {"regression": (args.trials, args.steps), "direction": (args.trials, args.steps)}
    if args.quick:
        args.seeds = 2
        budgets = {"regression": (16, 200), "direction": (10, 120)}
    trainers = ["regression", "direction"] if args.trainer == "both" else [args.trainer]
    methods = [m for m in args.methods.split(",") if m]
    import ray

    from sweeps.ray_session import quiet_logs

    ray.init(num_cpus=CONCURRENT, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    quiet_logs()
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    all_rows, raw = [], {}
    for trainer in trainers:
        trials, steps = budgets[trainer]
        runs: dict[str, list] = {m: [] for m in methods}
        walls: dict[str, list] = {m: [] for m in methods}
        for seed in range(args.seeds):
            sweep = make_sweep(trainer, trials, steps, seed)
            for method in methods:
                start = time.perf_counter()
                if method == "sweeps":
                    got = run_sweeps(sweep)
                elif method == "sweeps search_on=quality":
                    got = run_sweeps(_search_on_quality(sweep))
                elif method == "tune+optuna+asha":
                    got = run_tune(sweep, seed, random=False)
                elif method == "tune random+asha":
                    got = run_tune(sweep, seed, random=True)
                else:
                    got = run_optuna(sweep, seed)
                walls[method].append(time.perf_counter() - start)
                runs[method].append(judge(sweep, got))
                print(f"[{trainer} seed {seed}] {method}: {len(got)} trials, "
                      f"{sum(t['steps'] for t in runs[method][-1])} steps, "
                      f"{walls[method][-1]:.0f} s", flush=True)
        rows, stats = summarise(trainer, runs, trials * steps)
        for r in rows:
            r["wall s (median)"] = median(walls[r["method"]])
        all_rows.extend(rows)
        raw[trainer] = {"trials": trials, "steps": steps, "seeds": args.seeds, "walls": walls,
                        **stats, "trials_judged": runs}
        save("efficiency", {"args": vars(args), "rows": all_rows, "raw": raw})
    ray.shutdown()
    print()
    print(table(all_rows))
    path = save("efficiency", {"args": vars(args), "rows": all_rows, "raw": raw})
    print(f"raw figures: {path.relative_to(ROOT)}; machine load {machine()['loadavg']}")


if __name__ == "__main__":
    main()
