"""Orchestration overhead: N trials of a trainer that does almost nothing (30 reports each).

Methods, all with 2 trials at a time except the in-process Optuna loop:

- ``ray start``: ``ray.init`` on this machine, timed alone (excluded from the rest);
- plain Ray Tune, defaults: ``tune.Tuner`` + ``OptunaSearch`` + ``ASHAScheduler``, Tune's
  default CSV/JSON/TensorBoard loggers, no actor reuse (what users get);
- plain Ray Tune, tuned: the same with ``reuse_actors=True`` and
  ``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1``;
- ``sweeps``: ``run_sweep`` on the same trainer (rules, journal, per-trial histories,
  trials.csv, MLflow, HTML report, progress lines; preflight on; no confirmation runs);
- plain Optuna: ``study.optimize`` in-process, TPE + MedianPruner, ``trial.report`` at evals.

Per-trial overhead = (wall - ray start) x concurrency / trials (the trainer itself takes
~1 ms). ``--profile`` runs the sweeps driver under cProfile and prints where it spends.

    python bench/overhead.py --quick
    python bench/overhead.py --trials 100 --reports 30 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, SCRATCH, machine, save, table  # noqa: E402

BENCH = str(Path(__file__).resolve().parent)
CONCURRENT = 2


def sweep_dict(name: str, trials: int, reports: int) -> dict:
    return {
        "name": name,
        "trainer": "planted:noop",
        "base_config": {"train": {"reports": reports, "x": 0.5}},
        "search_space": {"x": {"type": "uniform", "low": 0.0, "high": 1.0}},
        "write_back": {"x": "train.x"},
        "rules": {"baseline_loss": 2.0},
        "budget": {"trials": trials, "max_steps": reports, "concurrent": CONCURRENT},
        "confirm": {"seeds": 0, "lr_probe": 0},
        "resources": {"cpu": 1, "gpu": 0},
        "output": str(SCRATCH / "overhead"),
        "seed": 0,
    }


def plain_tune(sweep, trials: int, reports: int, tuned: bool) -> float:
    import optuna
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    def trainable(config):
        sys.path.insert(0, BENCH)
        from common import tune_report_adapter
        from planted import noop
        from ray import tune as t

        cfg = sweep.trial_config({"x": config["x"]}, trial_id=t.get_context().get_trial_id(),
                                 seed=0)
        noop(cfg, tune_report_adapter())

    env = dict(os.environ)
    if tuned:
        os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    try:
        search = OptunaSearch(space={"x": optuna.distributions.FloatDistribution(0, 1)},
                              metric="val_loss", mode="min", seed=0)
        asha = ASHAScheduler(metric="val_loss", mode="min", max_t=reports,
                             grace_period=max(1, reports // 4), reduction_factor=3)
        tuner = tune.Tuner(
            tune.with_resources(trainable, {"cpu": 1}),
            tune_config=tune.TuneConfig(search_alg=search, scheduler=asha, num_samples=trials,
                                        max_concurrent_trials=CONCURRENT, reuse_actors=tuned),
            run_config=tune.RunConfig(name=f"plain-{'tuned' if tuned else 'default'}",
                                      storage_path=str(SCRATCH / "overhead"), verbose=0))
        start = time.perf_counter()
        tuner.fit()
        return time.perf_counter() - start
    finally:
        os.environ.clear()
        os.environ.update(env)


def plain_optuna(trials: int, reports: int) -> float:
    import optuna
    from planted import noop

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=0),
                                pruner=optuna.pruners.MedianPruner())

    def objective(trial):
        x = trial.suggest_float("x", 0, 1)
        last = {}

        def report(m):
            if "val_loss" in m:
                last["v"] = m["val_loss"]
                trial.report(m["val_loss"], m["step"])
                if trial.should_prune():
                    raise optuna.TrialPruned()

        noop({"train": {"reports": reports, "x": x}}, report)
        return last["v"]

    start = time.perf_counter()
    study.optimize(objective, n_trials=trials)
    return time.perf_counter() - start


def run_sweeps(sweep, profile: bool) -> tuple[float, str | None]:
    from sweeps.commands.run import run_sweep

    env = dict(os.environ)
    prof = cProfile.Profile() if profile else None
    start = time.perf_counter()
    try:
        if prof:
            prof.enable()
        run_sweep(sweep, progress=True, check=True)
    finally:
        if prof:
            prof.disable()
        os.environ.clear()
        os.environ.update(env)
    wall = time.perf_counter() - start
    text = None
    if prof:
        prof.dump_stats(str(RESULTS / "overhead_sweeps.prof"))
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf).sort_stats("cumulative")
        stats.print_stats(r"sweeps/|tune_controller|mlflow|optuna/(study|storages)", 45)
        text = buf.getvalue()
    return wall, text


def storage_costs(trials: int) -> dict[str, float]:
    """Driver seconds per trial of what StabilityAwareSearch does with the Optuna study
    (ask, 4 user attributes, a constraint, tell) on sqlite (what sweeps uses), in memory,
    and on a journal file: the largest part of what sweeps adds in the driver loop."""
    import optuna
    from optuna.storages import JournalStorage, RDBStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    folder = SCRATCH / "overhead" / "storage"
    folder.mkdir(parents=True, exist_ok=True)
    for f in folder.glob("*"):
        f.unlink()
    kinds = {
        "sqlite (RDBStorage, the old sweeps default)":
            lambda: RDBStorage(f"sqlite:///{folder}/s.db"),
        "in memory": lambda: None,
        "journal file (sweeps now)":
            lambda: JournalStorage(JournalFileBackend(str(folder / "j.log"))),
    }
    out = {}
    for name, make in kinds.items():
        study = optuna.create_study(storage=make(), directions=["minimize", "minimize"],
                                    sampler=optuna.samplers.TPESampler(seed=0, multivariate=True,
                                                                       n_startup_trials=10))
        start = time.perf_counter()
        for i in range(trials):
            trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
            for key in ("ray_trial_id", "status", "reason", "stop_step"):
                trial.set_user_attr(key, str(i))
            trial.set_constraint("stability", 0.0)
            study.tell(trial, [trial.params["x"], 0.0])
        out[name] = (time.perf_counter() - start) / trials
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="50 trials x 30 reports")
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--reports", type=int, default=30)
    ap.add_argument("--profile", action="store_true", help="cProfile the sweeps driver")
    ap.add_argument("--skip-default", action="store_true",
                    help="skip plain Ray Tune with its defaults (slowest)")
    args = ap.parse_args()
    if args.quick:
        args.trials = 50
    sys.path.insert(0, BENCH)
    RESULTS.mkdir(parents=True, exist_ok=True)
    import ray

    from sweeps.spec.loader import load_sweep_dict

    sweep = load_sweep_dict(sweep_dict("overhead", args.trials, args.reports),
                            base_dir=Path(BENCH), workdir=Path.cwd())
    walls: dict[str, float] = {}
    walls["plain Optuna (in-process, 1 at a time)"] = plain_optuna(args.trials, args.reports)

    start = time.perf_counter()
    ray.init(num_cpus=CONCURRENT, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    ray_start = time.perf_counter() - start
    walls["plain Ray Tune, tuned (reuse_actors, no default loggers)"] = plain_tune(
        sweep, args.trials, args.reports, tuned=True)
    walls["sweeps (rules, journal, MLflow, report, progress)"], prof_text = run_sweeps(
        sweep, args.profile)
    if not args.skip_default:
        walls["plain Ray Tune, defaults (loggers on, no actor reuse)"] = plain_tune(
            sweep, args.trials, args.reports, tuned=False)
    ray.shutdown()
    storage = storage_costs(args.trials)

    per = {}
    for name, wall in walls.items():
        conc = 1 if name.startswith("plain Optuna") else CONCURRENT
        per[name] = wall * conc / args.trials
    ours = per["sweeps (rules, journal, MLflow, report, progress)"]
    rows = [{"method": "ray.init (start-up, once)", "wall s": ray_start, "per-trial s": None,
             "sweeps ÷ this": None}]
    for name, wall in walls.items():
        rows.append({"method": name, "wall s": wall, "per-trial s": per[name],
                     "sweeps ÷ this": ours / per[name]})
    print(f"\n{args.trials} trials x {args.reports} reports, {CONCURRENT} at a time (Optuna: 1)\n")
    print(table(rows))
    target = 0.4
    print(f"\nsweeps per-trial overhead {ours:.3f} s: target <= {target} s "
          f"{'met' if ours <= target else 'MISSED'}")
    print("\nOptuna study bookkeeping per trial in the driver (ask, 5 attributes, tell):\n")
    print(table([{"storage": k, "ms per trial": v * 1e3} for k, v in storage.items()]))
    if prof_text:
        print("\ncProfile of the sweeps driver (cumulative, filtered):\n")
        print(prof_text)
    path = save("overhead", {"args": vars(args), "ray_start_s": ray_start, "walls_s": walls,
                             "per_trial_s": per, "rows": rows, "storage_s_per_trial": storage,
                             "profile": prof_text})
    print(f"raw figures: {path}; machine load {machine()['loadavg']}")


if __name__ == "__main__":
    main()
