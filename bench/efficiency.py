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
- ``tune+optuna+repeater3``: ``OptunaSearch`` inside Ray Tune's ``Repeater(repeat=3)``, every
  config on 3 seeds (its ``nanmean`` told to Optuna), no scheduler (as Repeater's docs
  advise); it hands over the config with the best mean over its repeats;
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

With ``--fresh-seeds N`` the outcome a user gets is measured too: each method's handed-over
config re-trained on N fresh trial seeds (50 000 + k, never used by any search), in this
process, the sweep's rules judging every run. A baseline hands over its best stable trial
(best final value of the first objective); sweeps runs *with* confirmation (the sweep file's
``confirm`` section, ``Confirm()`` defaults for a built-in case) within the same
``budget.total_steps``, and hands over the first YAML it wrote (``sweeps best``: the trainer
gets that file as it is, plus the ``sweep`` key), or nothing. A re-run is *bad* when it went
unstable or ended more than ``confirm.tolerance`` (relative, 0.2 when the spec has none)
worse than the config's own search value; a run that handed nothing over counts as N bad
re-runs. The fresh-seed table also has the base config's own values re-trained on the same
fresh seeds (``base config (no search)``): what the user had. ``--trainer fragile``
(``bench/fragile.py``) is the planted case for it: above an LR edge a config is the best
one on the search seed and ~2-3x worse on most other seeds, smoothly, with no rule able to
fire; its runs search on seeds where that region is lucky.

    python bench/efficiency.py --quick
    python bench/efficiency.py --trainer regression --trials 24 --steps 300 --seeds 5
    python bench/efficiency.py --sweep my_sweep.yaml --steps 200 --budget 6000 --seeds 3
    python bench/efficiency.py --quick --fresh-seeds 3 --trainer fragile
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import re
import statistics
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

from sweeps.record.book import last_step  # noqa: E402

BENCH = str(Path(__file__).resolve().parent)
#: Ray Tune's Repeater(3) around OptunaSearch: every config on 3 seeds, their mean told.
REPEATER = "tune+optuna+repeater3"
METHODS = ("sweeps", "tune+optuna+asha", "tune random+asha", "optuna tpe+median", REPEATER)
THRESHOLDS = (0.02, 0.05, 0.10)
#: Fresh-seed re-runs use trial seeds FRESH_SEED + k: no search or confirmation run uses them.
FRESH_SEED = 50_000
#: ``--trainer all``: the cases run by default (``fragile`` only when named).
DEFAULT_CASES = ("regression", "direction-mlp", "direction")

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
        "trainer": "sweeps.trainers.direction:train",
        "base": "examples/configs/direction.yaml",
        "overrides": {"data": {"n_events": 5000, "n_val": 500}},
        "space": DIRECTION_SPACE,
        "write_back": DIRECTION_PATHS,
        "rules": {"baseline_loss": 1.5708, "flat_patience": 60},
    },
    # The "small MLP direction task": an MLP with the vMF loss, where a high LR,
    # SGD without clipping or raw inputs give NaN, grad blowups and flat-at-baseline trials.
    "direction-mlp": {
        "trainer": "sweeps.trainers.direction:train",
        "base": "examples/configs/direction_mlp.yaml",
        "overrides": {},
        "space": {**DIRECTION_SPACE,
                  "optimizer": {"type": "categorical", "choices": ["adamw", "sgd"]}},
        "write_back": {**DIRECTION_PATHS, "optimizer": "training.optimizer"},
        "rules": {"baseline_loss": 2.531, "flat_patience": 60},  # log(4 pi): a uniform vMF
        "quality_baseline": 1.5708,  # val_loss is the mean angle: pi/2 for a random guess
    },
    "regression": {
        "trainer": "sweeps.trainers.regression:train",
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
    # A planted fragile region (bench/fragile.py): above lr 0.02 a config is the best one on
    # a "lucky" trial seed and ~2-3x worse on the others, smoothly; the runs search on lucky
    # seeds (the first ones of the hash), so every search sees that region at its best.
    "fragile": {
        "trainer": "bench.fragile:train",
        "base": "bench/cases/fragile.yaml",
        "overrides": {},
        "space": {
            "lr": {"type": "loguniform", "low": 1e-3, "high": 1.0},
            "weight_decay": {"type": "loguniform", "low": 1e-6, "high": 1e-2},
            "dropout": {"type": "uniform", "low": 0.0, "high": 0.2},
            "warmup": {"type": "int", "low": 0, "high": 50, "step": 10},
        },
        "write_back": {"lr": "training.lr", "weight_decay": "training.weight_decay",
                       "dropout": "model.dropout", "warmup": "training.warmup_steps"},
        "rules": {"baseline_loss": 1.0},  # MSE of predicting the mean of a standardised target
        "run_seeds": "lucky",
    },

}

# The oracle for the fragile case: its space cut at the LR edge (every config robust),
# searched on the same lucky run seeds: what the best robust config there gives on fresh
# seeds, which a hand-over on "fragile" should come within 10 % of.
BUILTIN["fragile-robust"] = {**BUILTIN["fragile"], "space": {
    **BUILTIN["fragile"]["space"], "lr": {"type": "loguniform", "low": 1e-3, "high": 2e-2}}}


def run_seeds(case: str | None, sweep, count: int, first: int = 0) -> list[int]:
    """The search seeds of ``count`` runs from the ``first``-th on: first, first + 1, ...,
    or for the fragile case the seeds whose basin above the edge is the good one (so
    each search sees the fragile configs as the best)."""
    if case is None or BUILTIN[case].get("run_seeds") != "lucky":
        return list(range(first, first + count))
    from bench.fragile import DEFAULTS, lucky_seeds

    plant = {**DEFAULTS, **(sweep.base_config.get("fragile") or {})}
    return lucky_seeds(first + count, float(plant["lucky_share"]), str(plant["salt"]))[first:]


def builtin_sweep(trainer: str, steps: int):
    """A built-in case as a sweep (evaluation every steps / 4)."""
    import yaml

    from sweeps.spec.loader import load_sweep_dict

    case = BUILTIN[trainer]
    base = yaml.safe_load((ROOT / case["base"]).read_text())
    for section, values in case["overrides"].items():
        base.setdefault(section, {}).update(values)
    base["training"]["eval_every"] = max(10, steps // 4)
    return load_sweep_dict({
        "name": f"eff-{trainer}", "trainer": case["trainer"], "base_config": base,
        "search_space": case["space"], "write_back": case["write_back"],
        "objectives": [{"metric": "val_loss", "mode": "min",
                        "baseline": case.get("quality_baseline")},
                       {"metric": "instability", "mode": "min"}],
        "rules": case["rules"], "budget": {"max_steps": steps},
        "resources": {"cpu": 1, "gpu": 0},
    }, base_dir=ROOT, workdir=Path.cwd())


def for_run(sweep, *, steps: int, budget: int, seed: int, concurrent: int, tag: str = "",
            confirm=None):
    """``sweep`` as one benchmark run: step budget, seed, no initial points, and no
    confirmation unless ``confirm`` (a ``Confirm``) is given."""
    from sweeps.spec.loader import Budget, Confirm

    fields = sweep.spec.budget.model_dump()
    del fields["trials"]  # the step budget alone ends the search
    fields.update(max_steps=steps, total_steps=budget, concurrent=concurrent)
    name = f"{sweep.spec.name}-{seed}{tag}"
    spec = sweep.spec.model_copy(update={
        "budget": Budget.model_validate(fields),
        "confirm": Confirm(seeds=0, lr_probe=0) if confirm is None else confirm,
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
    return run_sweeps_outcome(sweep)[0]


def run_sweeps_outcome(sweep) -> tuple[list[dict], Any]:
    """The search trials in completion order, and the ``SweepOutcome``."""
    from sweeps.commands.run import run_sweep
    from sweeps.record import book as book_mod

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
    return ([_trial(recs[t].values, list(recs[t].history)) for t in ids
             if recs[t].role == "search"], out)


def _tune_trainable(sweep, metric: str):
    def trainable(config):
        sys.path.insert(0, BENCH)
        import torch
        from common import tune_report_adapter
        from ray import tune as t

        from sweeps.spec.trainer_loader import load_trainer

        torch.set_num_threads(1)
        train = load_trainer(sweep.spec.trainer, sweep.trainer_paths)
        values = {k: v for k, v in config.items() if k in sweep.space}
        repeat = int(config.get("__trial_index__", 0))  # Repeater's repeat: its own seed
        cfg = sweep.trial_config(values, trial_id=t.get_context().get_trial_id(),
                                 seed=sweep.spec.seed + repeat)
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


def run_tune(sweep, random: bool, repeat: int = 0) -> list[dict]:
    """Plain Ray Tune: OptunaSearch (or random search) with ASHA; with ``repeat``, every
    config on that many seeds by Ray Tune's ``Repeater`` (its mean, ``nanmean``, told to
    Optuna) and no scheduler, as Repeater's docs advise."""
    from ray import tune
    from ray.tune.search import Repeater
    from ray.tune.search.basic_variant import BasicVariantGenerator
    from ray.tune.search.optuna import OptunaSearch

    from sweeps.spec.space import optuna_space

    budget, first, seed = sweep.spec.budget, sweep.objectives[0], sweep.spec.seed
    if random:
        search, space = BasicVariantGenerator(random_state=seed), tune_space(sweep)
    else:
        search = OptunaSearch(space=optuna_space(sweep.space), metric=first.metric,
                              mode=first.mode, seed=seed)
        space = None
    if repeat:
        search = Repeater(search, repeat=repeat, set_index=True)
    collector = Collector()
    # more trials than the budget can hold (each runs at least ASHA's grace period unless
    # it crashes): Tune then stops on the step budget, not on the count
    most = budget.total_steps // budget.asha_grace + 2 * budget.concurrent + 8
    tuner = tune.Tuner(
        tune.with_resources(_tune_trainable(sweep, first.metric), {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(search_alg=search,
                                    scheduler=None if repeat else plain_asha(sweep),
                                    num_samples=most,
                                    max_concurrent_trials=budget.concurrent),
        run_config=tune.RunConfig(name=f"{sweep.name}-{'random' if random else 'optuna'}"
                                  f"{f'-repeat{repeat}' if repeat else ''}",
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

    from sweeps.spec.space import optuna_space
    from sweeps.spec.trainer_loader import load_trainer

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
    from sweeps.trial.run import trial_settings

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

    from sweeps.spec.trainer_loader import load_trainer

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


def _final(history: list[dict], metric: str) -> float:
    vals = [h[metric] for h in history if isinstance(h.get(metric), (int, float))]
    return float(vals[-1]) if vals else float("nan")


def _at_path(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(config, dict) or part not in config:
            return None
        config = config[part]
    return config


def handover_best_trial(judged: list[dict], mode: str) -> dict | None:
    """What a user of a plain tool takes: the stable trial with the best final value."""
    stable = [t for t in judged if t["stable"]]
    if not stable:
        return None
    pick = (min if mode == "min" else max)(stable, key=lambda t: t["final"])
    return {"from": "best stable trial", "values": dict(pick["values"]),
            "search_value": pick["final"]}


def handover_best_mean(judged: list[dict], mode: str) -> dict | None:
    """What a user of Ray Tune's Repeater takes: the config with the best mean final value
    over its repeats, a repeat that went unstable left out of the mean (``nanmean``)."""
    groups: dict[tuple, list[dict]] = {}
    for t in judged:
        groups.setdefault(tuple(sorted(t["values"].items())), []).append(t)
    means = []
    for trials in groups.values():
        finals = [t["final"] for t in trials if t["stable"] and math.isfinite(t["final"])]
        if finals:
            means.append((statistics.fmean(finals), trials[0]))
    if not means:
        return None
    value, pick = (min if mode == "min" else max)(means, key=lambda vt: vt[0])
    return {"from": "best mean over repeats", "values": dict(pick["values"]),
            "search_value": value}


def handover_sweeps(outcome) -> dict | None:
    """What ``sweeps best`` prints: the first YAML the sweep wrote (None: nothing written),
    loaded as a user loads it. Its search value is the final value of the search trial
    whose knob values the file holds."""
    import yaml

    paths = list(outcome.stable_paths or [])
    if not paths:
        return None
    sweep, path = outcome.sweep, Path(paths[0])
    config = yaml.safe_load(path.read_text())
    values = {knob: _at_path(config, dotted) for knob, dotted in sweep.spec.write_back.items()}
    search = [r for r in outcome.book.trials.values() if r.role == "search"]
    rec = next((r for r in search
                if all(r.values.get(k) == v for k, v in values.items())), None)
    if rec is None:  # by the file name (rank-01-<trial>.yaml)
        m = re.match(r"rank-\d+-(.+)\.yaml$", path.name)
        rec = outcome.book.trials.get(m.group(1)) if m else None
    metric = sweep.objectives[0].metric
    return {"from": str(path), "yaml": config, "values": values,
            "trial_id": rec.trial_id if rec is not None else None,
            "search_value": _final(list(rec.history), metric) if rec is not None
            else float("nan")}


def _worse_by(value: float, reference: float, mode: str) -> float | None:
    """How much worse ``value`` is than ``reference``, relative to |reference|."""
    if not (math.isfinite(value) and math.isfinite(reference)) or reference == 0:
        return None
    return ((value - reference) if mode == "min" else (reference - value)) / abs(reference)


_TRAINERS: dict[str, Any] = {}


def fresh_runs(sweep, handover: dict, seeds: int, steps: int) -> dict[str, Any]:
    """Re-train a handed-over config on ``seeds`` fresh trial seeds (FRESH_SEED + k), in this
    process, the sweep's rules judging each run afterwards (as ``seed_noise`` does). A YAML
    hand-over is trained from the file itself, with the reserved ``sweep`` key added."""
    import torch

    from sweeps.spec.loader import RESERVED_KEY
    from sweeps.spec.trainer_loader import load_trainer
    from sweeps.trial.run import trial_settings

    torch.set_num_threads(1)
    if sweep.spec.trainer not in _TRAINERS:
        _TRAINERS[sweep.spec.trainer] = load_trainer(sweep.spec.trainer, sweep.trainer_paths)
    train = _TRAINERS[sweep.spec.trainer]
    metric, mode = sweep.objectives[0].metric, sweep.objectives[0].mode
    tolerance = float(getattr(sweep.spec.confirm, "tolerance", 0.2))
    settings = trial_settings(sweep, handover["values"])
    runs = []
    for k in range(seeds):
        seed, trial_id = FRESH_SEED + k, f"fresh-{k}"
        if "yaml" in handover:
            config = copy.deepcopy(handover["yaml"])
            config[RESERVED_KEY] = {"trial_id": trial_id, "seed": seed, "max_steps": steps}
        else:
            config = sweep.trial_config(handover["values"], trial_id=trial_id, seed=seed,
                                        max_steps=steps)
        history: list[dict] = []
        error = None
        try:
            train(config, history.append)
        except Exception as exc:  # noqa: BLE001 - a crash is an outcome too
            error = f"{type(exc).__name__}: {exc}"
        history = [{k2: (float(v) if hasattr(v, "item") else v) for k2, v in h.items()}
                   for h in history]
        final = _final(history, metric)
        verdict = first_verdict(history, settings) if history else None
        stable = error is None and verdict is None and math.isfinite(final)
        worse = _worse_by(final, handover["search_value"], mode)
        runs.append({"seed": seed, "final": final, "stable": stable,
                     "reason": error or (verdict.reason if verdict else None),
                     "worse_by": worse,
                     "bad": not stable or (worse is not None and worse > tolerance),
                     **({"basin": history[-1]["basin"]} if "basin" in history[-1] else {})})
    good = [r["final"] for r in runs if r["stable"]]
    penalty = math.inf if mode == "min" else -math.inf
    finals = [r["final"] if r["stable"] else penalty for r in runs]
    return {"tolerance": tolerance, "runs": runs,
            "mean": statistics.fmean(good) if good else penalty,
            "worst": (max if mode == "min" else min)(finals) if finals else penalty,
            "bad": sum(r["bad"] for r in runs)}


#: The row of the user's own base config in the fresh-seed table.
BASE = "base config (no search)"


def base_fresh(sweep, seeds: int, steps: int) -> dict[str, Any]:
    """The base config's own knob values re-trained on the fresh seeds: what the user had,
    which a hand-over should not be worse than."""
    from sweeps.trial.tryout import try_values

    handover = {"from": "base config", "values": try_values(sweep, {}),
                "search_value": float("nan")}
    return {"handover": handover, "result": fresh_runs(sweep, handover, seeds, steps),
            "steps": 0, "confirm_steps": 0, "base_steps": 0}


def _whole(x: float) -> int | float:
    return int(round(x)) if math.isfinite(x) else x


def summarise_fresh(label: str, fresh: dict[str, list[dict]], seeds: int,
                    mode: str) -> list[dict]:
    """One row per method: what its handed-over configs did on fresh seeds, over the runs."""
    def med(xs: list[float]) -> float:
        xs = [x for x in xs if not (isinstance(x, float) and math.isnan(x))]
        return median(xs)

    def ratio(value: float, ref: float | None) -> float | None:
        if ref is None or not (math.isfinite(value) and math.isfinite(ref)) or not ref:
            return None
        return value / ref if mode == "min" else ref / value

    stats = {}
    for method, per_run in fresh.items():
        handed = [r for r in per_run if r["handover"] is not None]
        means = [r["result"]["mean"] for r in handed]
        worsts = [r["result"]["worst"] for r in handed]
        bad = sum(r["result"]["bad"] for r in handed) + seeds * (len(per_run) - len(handed))
        stats[method] = {
            "handed": f"{len(handed)}/{len(per_run)}",
            "search": med([r["handover"]["search_value"] for r in handed]),
            "means": means, "worsts": worsts, "mean": med(means), "worst": med(worsts),
            "bad": bad, "re-runs": seeds * len(per_run),
            "steps": median([r["steps"] for r in per_run]),
            "confirm": median([r["confirm_steps"] for r in per_run]),
            "base": median([r.get("base_steps", 0) for r in per_run]),
            "share": median([r["confirm_steps"] / r["steps"] if r["steps"] else 0.0
                             for r in per_run])}
    ref = stats.get("sweeps")
    rows = []
    for method, s in stats.items():
        rows.append({
            "case": label, "method": method, "handed over (runs)": s["handed"],
            "search value (median)": s["search"],
            "fresh mean (median)": s["mean"], "fresh mean (spread)": spread(s["means"]),
            "fresh worst (median)": s["worst"], "fresh worst (spread)": spread(s["worsts"]),
            "bad re-runs (none handed = all bad)":
                f"{s['bad']}/{s['re-runs']} ({100 * s['bad'] / max(1, s['re-runs']):.0f} %)",
            "÷ sweeps (fresh mean)": ratio(s["mean"], ref["mean"] if ref else None),
            "÷ sweeps (fresh worst)": ratio(s["worst"], ref["worst"] if ref else None),
            "steps run (median)": _whole(s["steps"]),
            "of which seeds + probes (median)": _whole(s["confirm"]),
            "seeds + probes share (median)": f"{100 * s['share']:.0f} %",
            "base config re-runs (median)": _whole(s["base"]),
        })
    return rows


def _median_gap(gaps: list[float | None]) -> str:
    """Median gap in %, a run with nothing stable yet counting as the worst."""
    if not gaps:
        return "–"
    if sum(g is None for g in gaps) * 2 >= len(gaps):
        return "none stable"
    return f"{100 * median([math.inf if g is None else g for g in gaps]):.1f} %"


def run_method(method: str, sweep) -> tuple[list[dict], Any]:
    """The method's trials in completion order, and (sweeps only) its ``SweepOutcome``."""
    if method == "sweeps":
        return run_sweeps_outcome(sweep)
    if method == "sweeps search_on=quality":
        return run_sweeps_outcome(search_on_quality(sweep))
    if method == "tune+optuna+asha":
        return run_tune(sweep, random=False), None
    if method == "tune random+asha":
        return run_tune(sweep, random=True), None
    if method == "optuna tpe+median":
        return run_optuna(sweep), None
    if method == REPEATER:
        return run_tune(sweep, random=False, repeat=3), None
    raise SystemExit(f"--methods: unknown method {method!r}; known: {', '.join(METHODS)}, "
                     "sweeps search_on=quality")


def _fresh_outcome(sweep, judged: list[dict], outcome, seeds: int, steps: int,
                   mode: str, method: str = "") -> dict[str, Any]:
    """One method run's hand-over and its fresh-seed re-runs (``result`` None: nothing)."""
    if outcome is not None:  # sweeps: the YAML it wrote first, or nothing
        handover = handover_sweeps(outcome)
        kinds = outcome.selection.steps
        search_steps = kinds["search"]
        confirm_steps, base_steps = kinds["seeds"] + kinds["probe"], kinds["base"]
    else:
        pick = handover_best_mean if method == REPEATER else handover_best_trial
        handover = pick(judged, mode)
        search_steps, confirm_steps, base_steps = sum(t["steps"] for t in judged), 0, 0
    result = fresh_runs(sweep, handover, seeds, steps) if handover is not None else None
    return {"handover": handover, "result": result,
            "steps": search_steps + confirm_steps + base_steps,
            "confirm_steps": confirm_steps, "base_steps": base_steps}


def _print_fresh(prefix: str, got: dict[str, Any]) -> None:
    hand, res = got["handover"], got["result"]
    if hand is None:
        print(f"{prefix}: nothing handed over", flush=True)
        return
    where = Path(hand["from"]).name if hand["from"].endswith(".yaml") else hand["from"]
    finals = ", ".join(f"{r['final']:.4g}" + ("" if r["stable"] else f" ({r['reason']})")
                       for r in res["runs"])
    print(f"{prefix}: hands over {where} (search {hand['search_value']:.4g}); fresh seeds "
          f"{finals}: {res['bad']}/{len(res['runs'])} bad", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="regression and direction-mlp: 16 x 200 steps; direction: 10 x 120 "
                    "steps; fragile: 24 x 80 steps; 2 run seeds unless --seeds")
    ap.add_argument("--trainer", choices=(*BUILTIN, "all"), default="all",
                    help=f"a built-in case; all = {', '.join(DEFAULT_CASES)}")
    ap.add_argument("--sweep", type=Path, help="benchmark this sweep file instead")
    ap.add_argument("--steps", type=int, help="most steps per trial (default: 300, or the "
                    "sweep file's budget.max_steps)")
    ap.add_argument("--trials", type=int, default=24,
                    help="the step budget in trials of --steps (default 24)")
    ap.add_argument("--budget", type=int, help="training steps per method run "
                    "(default: --trials x --steps, or the sweep file's budget.total_steps)")
    ap.add_argument("--seeds", type=int, help="run seeds (default 3; 2 with --quick)")
    ap.add_argument("--first-seed", type=int, default=0, metavar="K",
                    help="start at the K-th run seed (to add runs to an earlier benchmark)")
    ap.add_argument("--concurrent", type=int, default=2)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--noise-seeds", type=int, default=0, help="afterwards, re-train each "
                    "best stable config on this many other seeds to measure the seed noise")
    ap.add_argument("--fresh-seeds", type=int, nargs="?", const=5, default=0, metavar="N",
                    help="measure what the user gets: sweeps runs with confirmation (inside "
                    "the same step budget), and each method's handed-over config is re-trained "
                    "on N fresh seeds (5 when given without N; 0 = off)")
    ap.add_argument("--out", default="efficiency",
                    help="name of the results file: bench/results/<out>.json")
    args = ap.parse_args()

    from sweeps.spec.loader import load_sweep

    cases: list[tuple[str, Any, int, int, str | None]] = []  # label, sweep, steps, budget, case
    if args.sweep is not None:
        user = load_sweep(args.sweep, workdir=Path.cwd())
        steps = args.steps or user.spec.budget.max_steps
        budget = args.budget or user.spec.budget.total_steps or args.trials * steps
        cases.append((user.spec.name, user, steps, budget, None))
    else:
        quick = {"regression": (16, 200), "direction-mlp": (16, 200), "direction": (10, 120),
                 "fragile": (24, 80), "fragile-robust": (24, 80)}
        for trainer in (list(DEFAULT_CASES) if args.trainer == "all" else [args.trainer]):
            trials, steps = quick[trainer] if args.quick else (args.trials, args.steps or 300)
            budget = trials * steps if args.quick else args.budget or trials * steps
            cases.append((trainer, builtin_sweep(trainer, steps), steps, budget, trainer))
    if args.quick and args.seeds is None:
        args.seeds = 2
    args.seeds = 3 if args.seeds is None else args.seeds
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]

    import ray

    from sweeps.tune.session import quiet_logs

    ray.init(num_cpus=args.concurrent, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    quiet_logs()
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    all_rows, fresh_rows, raw = [], [], {}
    for label, base, steps, budget, case in cases:
        mode = base.objectives[0].mode
        runs: dict[str, list] = {m: [] for m in methods}
        walls: dict[str, list] = {m: [] for m in methods}
        fresh: dict[str, list] = {m: [] for m in methods}
        seeds = run_seeds(case, base, args.seeds, args.first_seed)
        # with --fresh-seeds, sweeps confirms as a user's sweep would: the file's confirm
        # section (a built-in case's: the Confirm() defaults), inside the same step budget
        confirm = base.spec.confirm if args.fresh_seeds > 0 else None
        for seed in seeds:
            sweep = for_run(base, steps=steps, budget=budget, seed=seed,
                            concurrent=args.concurrent, confirm=confirm)
            for method in methods:
                start = time.perf_counter()
                got, outcome = run_method(method, sweep)
                walls[method].append(time.perf_counter() - start)
                runs[method].append(judge(sweep, got))
                print(f"[{label} seed {seed}] {method}: {len(runs[method][-1])} trials, "
                      f"{sum(t['steps'] for t in runs[method][-1])} steps, "
                      f"{walls[method][-1]:.0f} s", flush=True)
                if args.fresh_seeds > 0:
                    fresh[method].append(_fresh_outcome(sweep, runs[method][-1], outcome,
                                                        args.fresh_seeds, steps, mode,
                                                        method))
                    _print_fresh(f"[{label} seed {seed}] {method}", fresh[method][-1])
        if args.fresh_seeds > 0:  # the user's own base config on the same fresh seeds
            fresh[BASE] = [base_fresh(sweep, args.fresh_seeds, steps)] * len(seeds)
        rows, stats = summarise(label, runs, budget, mode)
        for r in rows:
            r["wall s (median)"] = median(walls[r["method"]])
        all_rows.extend(rows)
        raw[label] = {"steps": steps, "budget": budget, "seeds": args.seeds,
                      "run_seeds": seeds, "walls": walls,
                      "metric": base.objectives[0].metric, "mode": mode, **stats,
                      "trials_judged": runs}
        if args.fresh_seeds > 0:
            fresh_rows.extend(summarise_fresh(label, fresh, args.fresh_seeds, mode))
            raw[label]["fresh"] = {"seeds": [FRESH_SEED + k for k in range(args.fresh_seeds)],
                                   "confirm": confirm.model_dump() if confirm else None,
                                   "per_method": fresh}
        if args.noise_seeds > 1:
            noise = seed_noise(base, runs, steps, budget, args.noise_seeds)
            raw[label]["seed_noise"] = noise
            print(f"[{label}] seed noise: the best stable configs re-trained on "
                  f"{args.noise_seeds} other seeds vary by a median "
                  f"{100 * noise['median_relative_std']:.1f} % (std / mean)", flush=True)
        save(args.out, {"args": {k: str(v) for k, v in vars(args).items()},
                        "rows": all_rows, "fresh_rows": fresh_rows, "raw": raw})
    ray.shutdown()
    print()
    print(table(all_rows))
    if fresh_rows:
        print()
        print(f"What the user gets: each method's handed-over config re-trained on "
              f"{args.fresh_seeds} fresh seeds (median over {args.seeds} runs; ÷ sweeps > 1: "
              "sweeps' config did better; bad = unstable or worse than its own search value "
              "by more than the tolerance)")
        print(table(fresh_rows))
    path = save(args.out, {"args": {k: str(v) for k, v in vars(args).items()},
                           "rows": all_rows, "fresh_rows": fresh_rows, "raw": raw})
    print(f"raw figures: {path}; machine load {machine()['loadavg']}")


if __name__ == "__main__":
    main()
