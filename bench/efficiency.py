"""Sample efficiency: training steps until a stable, near-best config, same step budget per method.

Every method gets the same budget of training steps (``--budget``, default ``--trials`` x
``--steps``) on the same trainer, search space and trial seed, and starts trials of at most
``--steps`` steps until the budget is spent:

- ``sweeps``: ``run_sweep`` with ``budget.total_steps`` (rules, stability-aware TPE, ASHA);
- ``tune+optuna+asha``: ``tune.Tuner`` + ``OptunaSearch(metric, mode)`` (default TPE) +
  ``ASHAScheduler``, no stopper;
- ``tune random+asha``: ``tune.Tuner`` with the default ``BasicVariantGenerator`` over the
  same space + the same ASHA, no stopper;
- ``optuna tpe+median``: ``optuna.create_study`` (default TPE) + ``MedianPruner``, reporting
  the metric at every evaluation, in-process, one trial at a time;
- ``sweeps search_on=quality`` (opt-in): sweeps with TPE on the first objective alone.

The trainer, space, rules and objective come from a built-in case (``--trainer``) or from
any sweep file (``--sweep FILE``: its trainer, base config, space, rules and first objective;
its initial points are dropped so that no method starts from a known point). ASHA
everywhere as sweeps sets it: max_t = steps, grace = ``budget.grace_steps`` or steps / 4,
reduction factor 3. All methods run 2 trials at a time (``--concurrent``) but the Optuna loop.

Every trial is judged afterwards the same way: stable = no rule of the sweep fires on any
prefix of its history and its final metric is finite. Trials count in the order they
completed, up to and including the one that crossed the budget; a trial still running then
does not count (for any method). "Steps to 2 %" = cumulative steps when the first stable
trial within 2 % of the best stable value any method found *on that seed* completed (all
methods on one seed train the same function of the config: same data, same trial seed).

    python bench/efficiency.py --quick
    python bench/efficiency.py --trainer regression --trials 24 --steps 300 --seeds 5
    python bench/efficiency.py --sweep my_sweep.yaml --steps 200 --budget 6000 --seeds 3
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import replace
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
    plain_asha,
    save,
    spread,
    table,
    trainer_history,
    tune_space,
)

from sweeps.book import last_step  # noqa: E402

BENCH = str(Path(__file__).resolve().parent)
METHODS = ("sweeps", "tune+optuna+asha", "tune random+asha", "optuna tpe+median")
THRESHOLDS = (0.02, 0.05, 0.10)

#: The direction trainer's knobs (the quickstart's space) and where they go in its config.
DIRECTION_SPACE = {
    "lr": {"type": "loguniform", "low": 1e-4, "high": 1.0},
    "grad_clip": {"type": "categorical", "choices": [0, 1.0, 5.0]},
    "dropout": {"type": "uniform", "low": 0.0, "high": 0.3},
    "weight_decay": {"type": "loguniform", "low": 1e-6, "high": 1e-1},
    "warmup": {"type": "int", "low": 0, "high": 50, "step": 10},
    "normalize_inputs": {"type": "categorical", "choices": [True, False]},
}
DIRECTION_PATHS = {"lr": "training.lr", "grad_clip": "training.grad_clip",
                   "dropout": "model.dropout", "weight_decay": "training.weight_decay",
                   "warmup": "training.warmup_steps", "normalize_inputs": "data.normalize_inputs"}

BUILTIN = {
    "direction": {
        "trainer": "trainers.direction:train",
        "base": "examples/configs/direction.yaml",
        "overrides": {"data": {"n_events": 5000, "n_val": 500}},
        "space": DIRECTION_SPACE,
        "write_back": DIRECTION_PATHS,
        "rules": {"baseline_loss": 1.5708, "flat_patience": 60},
    },
    # The "small MLP direction task": an MLP with the vMF loss, where a high LR,
    # SGD without clipping or raw inputs give NaN, grad blowups and flat-at-baseline trials.
    "direction-mlp": {
        "trainer": "trainers.direction:train",
        "base": "examples/configs/direction_mlp.yaml",
        "overrides": {},
        "space": {**DIRECTION_SPACE,
                  "optimizer": {"type": "categorical", "choices": ["adamw", "sgd"]}},
        "write_back": {**DIRECTION_PATHS, "optimizer": "training.optimizer"},
        "rules": {"baseline_loss": 2.531, "flat_patience": 60},  # log(4 pi): a uniform vMF
    },
    "regression": {
        "trainer": "trainers.regression:train",
        "base": "examples/configs/regression.yaml",
        "overrides": {},
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


def builtin_sweep(trainer: str, steps: int):
    """A built-in case as a sweep (evaluation every steps / 4)."""
    import yaml

    from sweeps.spec import load_sweep_dict

    case = BUILTIN[trainer]
    base = yaml.safe_load((ROOT / case["base"]).read_text())
    for section, values in case["overrides"].items():
        base.setdefault(section, {}).update(values)
    base["training"]["eval_every"] = max(10, steps // 4)
    return load_sweep_dict({
        "name": f"eff-{trainer}", "trainer": case["trainer"], "base_config": base,
        "search_space": case["space"], "write_back": case["write_back"],
        "objectives": [{"metric": "val_loss", "mode": "min"},
                       {"metric": "instability", "mode": "min"}],
        "rules": case["rules"], "budget": {"max_steps": steps},
        "resources": {"cpu": 1, "gpu": 0},
    }, base_dir=ROOT)


def for_run(sweep, *, steps: int, budget: int, seed: int, concurrent: int, tag: str = ""):
    """``sweep`` as one benchmark run: step budget, seed, no initial points, no confirmation."""
    from sweeps.spec import Budget, Confirm

    fields = sweep.spec.budget.model_dump()
    del fields["trials"]  # the step budget alone ends the search
    fields.update(max_steps=steps, total_steps=budget, concurrent=concurrent)
    name = f"{sweep.spec.name}-{seed}{tag}"
    spec = sweep.spec.model_copy(update={
        "budget": Budget.model_validate(fields), "confirm": Confirm(seeds=0, lr_probe=0),
        "initial_points": [], "seed": seed, "name": name})
    return replace(sweep, spec=spec, output_dir=SCRATCH / "efficiency" / name)


def search_on_quality(sweep):
    """The same run with TPE on the first objective alone, stability as a constraint only."""
    budget = sweep.spec.budget.model_copy(update={"search_on": "quality"})
    spec = sweep.spec.model_copy(update={"budget": budget, "name": sweep.spec.name + "-q"})
    return replace(sweep, spec=spec, output_dir=sweep.output_dir.with_name(spec.name))


def _trial(values: dict, history: list[dict]) -> dict[str, Any]:
    return {"values": values, "history": history}


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
        os.environ.update(env)  # sweeps sets Tune env vars; the baselines must not see them
    recs = out.book.trials
    ids = order + [t for t in recs if t not in order]
    return [_trial(recs[t].values, list(recs[t].history)) for t in ids if recs[t].role == "search"]


def _tune_trainable(sweep, metric: str):
    def trainable(config):
        sys.path.insert(0, BENCH)
        import torch
        from common import tune_report_adapter
        from ray import tune as t

        from sweeps.trainer_loader import load_trainer

        torch.set_num_threads(1)
        train = load_trainer(sweep.spec.trainer, sweep.trainer_paths)
        values = {k: v for k, v in config.items() if k in sweep.space}
        cfg = sweep.trial_config(values, trial_id=t.get_context().get_trial_id(),
                                 seed=sweep.spec.seed)
        train(cfg, tune_report_adapter(metric))

    return trainable


def _budget_stopper(collector, budget: int):
    """A Tune stopper that never stops a trial, and ends the run once ``budget`` steps of
    finished trials are in (what sweeps' ``budget.total_steps`` does, minus letting the
    running trials finish: those would not count anyway)."""
    from ray.tune import Stopper

    class StepBudget(Stopper):
        def __call__(self, trial_id, result):
            return False

        def stop_all(self):
            done = sum(last_step(collector.history.get(t, [])) for t in collector.order)
            return done >= budget

    return StepBudget()


def run_tune(sweep, random: bool) -> list[dict]:
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator
    from ray.tune.search.optuna import OptunaSearch

    from sweeps.space import optuna_space

    budget, first, seed = sweep.spec.budget, sweep.objectives[0], sweep.spec.seed
    if random:
        search, space = BasicVariantGenerator(random_state=seed), tune_space(sweep)
    else:
        search = OptunaSearch(space=optuna_space(sweep.space), metric=first.metric,
                              mode=first.mode, seed=seed)
        space = None
    collector = Collector()
    # more trials than the budget can hold (each runs at least ASHA's grace period unless
    # it crashes): Tune then stops on the step budget, not on the count
    most = budget.total_steps // budget.asha_grace + 2 * budget.concurrent + 8
    tuner = tune.Tuner(
        tune.with_resources(_tune_trainable(sweep, first.metric), {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(search_alg=search, scheduler=plain_asha(sweep),
                                    num_samples=most,
                                    max_concurrent_trials=budget.concurrent),
        run_config=tune.RunConfig(name=f"{sweep.name}-{'random' if random else 'optuna'}",
                                  storage_path=str(SCRATCH / "efficiency"), verbose=0,
                                  stop=_budget_stopper(collector, budget.total_steps),
                                  callbacks=[collector]))
    tuner.fit()
    out = []
    for tid in collector.order:
        values = {k: v for k, v in collector.config.get(tid, {}).items() if k in sweep.space}
        out.append(_trial(values, trainer_history(collector.history.get(tid, []),
                                                  first.metric)))
    return out


def run_optuna(sweep) -> list[dict]:
    import optuna
    import torch

    from sweeps.space import optuna_space
    from sweeps.trainer_loader import load_trainer

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    train = load_trainer(sweep.spec.trainer, sweep.trainer_paths)
    space, first = optuna_space(sweep.space), sweep.objectives[0]
    study = optuna.create_study(direction="minimize" if first.mode == "min" else "maximize",
                                sampler=optuna.samplers.TPESampler(seed=sweep.spec.seed),
                                pruner=optuna.pruners.MedianPruner())
    trials: list[dict] = []

    def objective(trial):
        values = {name: trial._suggest(name, dist) for name, dist in space.items()}
        history: list[dict] = []
        trials.append(_trial(values, history))

        def report(metrics):
            history.append({k: (float(v) if hasattr(v, "item") else v)
                            for k, v in metrics.items()})
            if first.metric in metrics:
                trial.report(float(metrics[first.metric]), int(metrics["step"]))
                if trial.should_prune():
                    raise optuna.TrialPruned()

        train(sweep.trial_config(values, trial_id=str(trial.number), seed=sweep.spec.seed),
              report)
        vals = [h[first.metric] for h in history if first.metric in h]
        return float(vals[-1]) if vals else float("nan")

    def stop_when_spent(study, _trial):
        if sum(last_step(t["history"]) for t in trials) >= sweep.spec.budget.total_steps:
            study.stop()

    study.optimize(objective, catch=(Exception,), callbacks=[stop_when_spent])
    return trials


def judge(sweep, trials: list[dict]) -> list[dict]:
    """Post-hoc, identical for every method: steps run, final metric, stable or not; only
    the trials that completed within the step budget."""
    from sweeps.trainable import trial_settings

    metric, budget = sweep.objectives[0].metric, sweep.spec.budget.total_steps
    out, spent = [], 0
    for t in trials:
        if spent >= budget:
            break
        hist = t["history"]
        steps = last_step(hist)
        spent += steps
        vals = [h[metric] for h in hist if isinstance(h.get(metric), (int, float))]
        final = float(vals[-1]) if vals else float("nan")
        verdict = first_verdict(hist, trial_settings(sweep, t["values"])) if hist else None
        stable = verdict is None and math.isfinite(final) and bool(hist)
        out.append({"values": t["values"], "steps": steps, "final": final,
                    "stable": stable, "reason": verdict.reason if verdict else None})
    return out


def near(value: float, best: float, share: float, mode: str) -> bool:
    """``value`` within ``share`` of ``best`` (relative to |best|), in the objective's direction."""
    gap = share * abs(best)
    return value <= best + gap if mode == "min" else value >= best - gap


def steps_to(judged: list[dict], best: float, share: float, mode: str) -> int | None:
    total = 0
    for t in judged:
        total += t["steps"]
        if t["stable"] and near(t["final"], best, share, mode):
            return total
    return None


def best_by(judged: list[dict], steps: int, mode: str) -> float | None:
    """The best stable value among the trials completed within the first ``steps`` steps."""
    spent, seen = 0, []
    for t in judged:
        spent += t["steps"]
        if spent > steps:
            break
        seen.append(t)
    return best_of(seen, mode)


def best_of(judged: list[dict], mode: str) -> float | None:
    stable = [t["final"] for t in judged if t["stable"]]
    if not stable:
        return None
    return min(stable) if mode == "min" else max(stable)


def _gap(value: float | None, target: float | None) -> float | None:
    """Relative distance of ``value`` from the per-seed best (None: nothing stable yet)."""
    if value is None or not target:
        return None
    return abs(value - target) / abs(target)


def summarise(label: str, runs: dict[str, list[list[dict]]], budget: int,
              mode: str) -> tuple[list[dict], dict]:
    """Per method: median steps to each threshold (vs the per-seed best), best, waste."""
    seeds = len(next(iter(runs.values())))
    targets = []
    for i in range(seeds):
        found = [b for per_seed in runs.values() for b in [best_of(per_seed[i], mode)]
                 if b is not None]
        targets.append((min(found) if mode == "min" else max(found)) if found else None)
    stats: dict[str, dict] = {}
    for method, per_seed in runs.items():
        s: dict[str, Any] = {f"to{int(th * 100)}": [] for th in THRESHOLDS}
        s.update(best=[], gap=[], unstable=[], total=[], trials=[], gap25=[], gap50=[])
        for judged, target in zip(per_seed, targets, strict=True):
            total = sum(t["steps"] for t in judged)
            s["total"].append(total)
            s["trials"].append(len(judged))
            for th in THRESHOLDS:
                s[f"to{int(th * 100)}"].append(
                    steps_to(judged, target, th, mode) if target is not None else None)
            best = best_of(judged, mode)
            s["best"].append(best)
            s["gap"].append(_gap(best, target))
            s["gap25"].append(_gap(best_by(judged, budget // 4, mode), target))
            s["gap50"].append(_gap(best_by(judged, budget // 2, mode), target))
            bad = sum(t["steps"] for t in judged if not t["stable"])
            s["unstable"].append(bad / total if total else None)
        stats[method] = s

    def med(xs: list[int | None]) -> tuple[float, int]:
        # a seed that never got there counts as the whole budget: a lower bound
        return median([budget if x is None else x for x in xs]), sum(x is None for x in xs)

    ref = {th: med(stats["sweeps"][f"to{int(th * 100)}"])[0] if "sweeps" in stats else None
           for th in THRESHOLDS}
    rows = []
    for method, s in stats.items():
        row: dict[str, Any] = {"case": label, "method": method}
        for th in THRESHOLDS:
            key = f"to{int(th * 100)}"
            m, missing = med(s[key])
            n = len(s[key])
            row[f"steps to {int(th * 100)} % (reached)"] = \
                f"{'≥' if missing * 2 >= n else ''}{m:.0f} ({n - missing}/{n})"
            row[f"÷ sweeps ({int(th * 100)} %)"] = m / ref[th] if ref[th] else None
        row.update({
            "best stable (median)": median(s["best"]),
            "best stable (spread)": spread(s["best"]),
            "gap at 25 % of budget": _median_gap(s["gap25"]),
            "gap at 50 %": _median_gap(s["gap50"]),
            "gap at 100 %": _median_gap(s["gap"]),
            "unstable step share": median(s["unstable"]),
            "trials (median)": median(s["trials"]),
        })
        rows.append(row)
    return rows, {"targets_per_seed": targets, "per_method": stats}


def seed_noise(base, runs: dict[str, list[list[dict]]], steps: int, budget: int,
               seeds: int) -> dict[str, Any]:
    """Re-train each method's best stable config of each run on ``seeds`` other trial seeds
    (in this process): how far apart the same config lands is the floor under any
    "within x %" target."""
    import statistics

    import torch

    from sweeps.trainer_loader import load_trainer

    torch.set_num_threads(1)
    sweep = for_run(base, steps=steps, budget=budget, seed=0, concurrent=1)
    train = load_trainer(sweep.spec.trainer, sweep.trainer_paths)
    metric, mode = sweep.objectives[0].metric, sweep.objectives[0].mode
    configs: list[dict] = []
    for per_seed in runs.values():
        for judged in per_seed:
            stable = [t for t in judged if t["stable"]]
            if stable:
                pick = (min if mode == "min" else max)(stable, key=lambda t: t["final"])
                if pick["values"] not in configs:
                    configs.append(pick["values"])
    rows = []
    for values in configs:
        finals = []
        for k in range(seeds):
            history: list[dict] = []
            train(sweep.trial_config(values, trial_id="noise", seed=10_000 + k), history.append)
            vals = [h[metric] for h in history if isinstance(h.get(metric), (int, float))]
            finals.append(float(vals[-1]) if vals else float("nan"))
        finite = [f for f in finals if math.isfinite(f)]
        mean = statistics.fmean(finite) if finite else float("nan")
        std = statistics.stdev(finite) if len(finite) > 1 else float("nan")
        rows.append({"values": values, "finals": finals, "mean": mean, "std": std,
                     "relative_std": std / abs(mean) if finite and mean else float("nan")})
    rel = [r["relative_std"] for r in rows if math.isfinite(r["relative_std"])]
    return {"seeds": seeds, "configs": rows,
            "median_relative_std": median(rel) if rel else float("nan")}


def _median_gap(gaps: list[float | None]) -> str:
    """Median gap in %, a run with nothing stable yet counting as the worst."""
    if not gaps:
        return "–"
    if sum(g is None for g in gaps) * 2 >= len(gaps):
        return "none stable"
    return f"{100 * median([math.inf if g is None else g for g in gaps]):.1f} %"


def run_method(method: str, sweep) -> list[dict]:
    if method == "sweeps":
        return run_sweeps(sweep)
    if method == "sweeps search_on=quality":
        return run_sweeps(search_on_quality(sweep))
    if method == "tune+optuna+asha":
        return run_tune(sweep, random=False)
    if method == "tune random+asha":
        return run_tune(sweep, random=True)
    if method == "optuna tpe+median":
        return run_optuna(sweep)
    raise SystemExit(f"--methods: unknown method {method!r}; known: {', '.join(METHODS)}, "
                     "sweeps search_on=quality")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="regression and direction-mlp: 16 x 200 steps; direction: 10 x 120 "
                    "steps; 2 seeds")
    ap.add_argument("--trainer", choices=(*BUILTIN, "all"), default="all")
    ap.add_argument("--sweep", type=Path, help="benchmark this sweep file instead")
    ap.add_argument("--steps", type=int, help="most steps per trial (default: 300, or the "
                    "sweep file's budget.max_steps)")
    ap.add_argument("--trials", type=int, default=24,
                    help="the step budget in trials of --steps (default 24)")
    ap.add_argument("--budget", type=int, help="training steps per method run "
                    "(default: --trials x --steps, or the sweep file's budget.total_steps)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--concurrent", type=int, default=2)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--noise-seeds", type=int, default=0, help="afterwards, re-train each "
                    "best stable config on this many other seeds to measure the seed noise")
    ap.add_argument("--out", default="efficiency",
                    help="name of the results file: bench/results/<out>.json")
    args = ap.parse_args()

    from sweeps.spec import load_sweep

    cases: list[tuple[str, Any, int, int]] = []  # label, sweep, steps, budget
    if args.sweep is not None:
        user = load_sweep(args.sweep)
        steps = args.steps or user.spec.budget.max_steps
        budget = args.budget or user.spec.budget.total_steps or args.trials * steps
        cases.append((user.spec.name, user, steps, budget))
    else:
        quick = {"regression": (16, 200), "direction-mlp": (16, 200), "direction": (10, 120)}
        for trainer in (list(quick) if args.trainer == "all" else [args.trainer]):
            trials, steps = quick[trainer] if args.quick else (args.trials, args.steps or 300)
            budget = trials * steps if args.quick else args.budget or trials * steps
            cases.append((trainer, builtin_sweep(trainer, steps), steps, budget))
    if args.quick:
        args.seeds = 2
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]

    import ray

    from sweeps.ray_session import quiet_logs

    ray.init(num_cpus=args.concurrent, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    quiet_logs()
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    all_rows, raw = [], {}
    for label, base, steps, budget in cases:
        mode = base.objectives[0].mode
        runs: dict[str, list] = {m: [] for m in methods}
        walls: dict[str, list] = {m: [] for m in methods}
        for seed in range(args.seeds):
            sweep = for_run(base, steps=steps, budget=budget, seed=seed,
                            concurrent=args.concurrent)
            for method in methods:
                start = time.perf_counter()
                got = run_method(method, sweep)
                walls[method].append(time.perf_counter() - start)
                runs[method].append(judge(sweep, got))
                print(f"[{label} seed {seed}] {method}: {len(runs[method][-1])} trials, "
                      f"{sum(t['steps'] for t in runs[method][-1])} steps, "
                      f"{walls[method][-1]:.0f} s", flush=True)
        rows, stats = summarise(label, runs, budget, mode)
        for r in rows:
            r["wall s (median)"] = median(walls[r["method"]])
        all_rows.extend(rows)
        raw[label] = {"steps": steps, "budget": budget, "seeds": args.seeds, "walls": walls,
                      "metric": base.objectives[0].metric, "mode": mode, **stats,
                      "trials_judged": runs}
        if args.noise_seeds > 1:
            noise = seed_noise(base, runs, steps, budget, args.noise_seeds)
            raw[label]["seed_noise"] = noise
            print(f"[{label}] seed noise: the best stable configs re-trained on "
                  f"{args.noise_seeds} other seeds vary by a median "
                  f"{100 * noise['median_relative_std']:.1f} % (std / mean)", flush=True)
        save(args.out, {"args": {k: str(v) for k, v in vars(args).items()},
                            "rows": all_rows, "raw": raw})
    ray.shutdown()
    print()
    print(table(all_rows))
    path = save(args.out, {"args": {k: str(v) for k, v in vars(args).items()},
                               "rows": all_rows, "raw": raw})
    print(f"raw figures: {path}; machine load {machine()['loadavg']}")


if __name__ == "__main__":
    main()
