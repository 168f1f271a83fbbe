"""Detection latency: how many training steps a failure costs, sweeps vs plain Ray Tune.

Each case runs once per seed under

- ``sweeps``: ``run_sweep`` with the cases as its initial points (each runs exactly once),
  ASHA on the first objective, rules on;
- plain Ray Tune: ``tune.Tuner`` + ``OptunaSearch(metric, mode)`` with the same points to
  evaluate + ``ASHAScheduler`` (same max_t / grace / reduction factor as sweeps), no
  stopper, default loggers, no actor reuse.

The cases are ``bench/planted.py``'s (non-finite loss at step k, grad blowup from step k,
flat at the baseline, prediction collapse, LR warm restart, two healthy controls and a
slow learner), or with
``--sweep FILE`` the ``initial_points`` of any sweep file: its trainer, rules and first
objective, one case per point (knobs a point leaves out take the base config's value).

"Detectable" is the first report at which ``sweeps.rules.evaluate`` (the sweep's rule
settings) fires on the trial's history, computed on a reference run of the same seed
without any orchestration; for non_finite / blowup / restart that is the planted onset.
A false stop is a case sweeps stopped as unstable whose reference run no rule flagged, or
any stop of a control (a healthy or slowly learning case: ``planted.CONTROLS``).

    python bench/detection.py --quick
    python bench/detection.py --seeds 5 --steps 400 --onset 120
    python bench/detection.py --sweep my_failures.yaml --seeds 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    SCRATCH,
    Collector,
    first_verdict,
    machine,
    plain_asha,
    save,
    table,
)
from planted import CONTROLS  # noqa: E402

from sweeps.record.book import last_step  # noqa: E402

BENCH = str(Path(__file__).resolve().parent)


def sweep_dict(name: str, cases: list[str], steps: int, onset: int, seed: int) -> dict:
    return {
        "name": name,
        "trainer": "planted:train",
        "base_config": {"train": {"case": "healthy", "onset": onset, "warmup": 10, "lr": 0.05}},
        "search_space": {"case": {"type": "categorical", "choices": cases}},
        "write_back": {"case": "train.case"},
        "objectives": [{"metric": "val_loss", "mode": "min"},
                       {"metric": "instability", "mode": "min"}],
        "rules": {"baseline_loss": 1.0, "flat_patience": 50, "warmup_steps": 10},
        "initial_points": [{"case": c} for c in cases],
        "budget": {"trials": len(cases), "max_steps": steps, "concurrent": 2,
                   "grace_steps": steps // 4},
        "confirm": {"seeds": 0, "lr_probe": 0},
        "resources": {"cpu": 1, "gpu": 0},
        "output": str(SCRATCH / "detection"),
        "seed": seed,
    }


def planted_sweep(steps: int, onset: int):
    """The planted cases of bench/planted.py as a sweep whose knob is the case."""
    from planted import CASES

    from sweeps.spec.loader import load_sweep_dict

    return load_sweep_dict(sweep_dict("planted", list(CASES), steps, onset, 0),
                           base_dir=Path(BENCH), workdir=Path.cwd())


def for_seed(sweep, seed: int, steps: int | None):
    """One seed's run of ``sweep``: a trial per initial point, no confirmation runs."""
    from sweeps.spec.loader import Confirm

    points = len(sweep.spec.initial_points)
    budget = sweep.spec.budget.model_copy(update={
        "trials": points, "total_steps": None, "concurrent": 2,
        **({"max_steps": steps} if steps else {})})
    name = f"{sweep.spec.name}-{seed}"
    spec = sweep.spec.model_copy(update={"budget": budget, "seed": seed, "name": name,
                                         "confirm": Confirm(seeds=0, lr_probe=0)})
    return replace(sweep, spec=spec, output_dir=SCRATCH / "detection" / name)


def label(point: dict[str, Any]) -> str:
    if set(point) == {"case"}:
        return str(point["case"])
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in point.items())


def _key(values: dict[str, Any], point: dict[str, Any]) -> bool:
    return all(values.get(k) == v for k, v in point.items())


def run_sweeps(sweep, points: list[dict]) -> dict[str, dict]:
    from sweeps.commands.run import run_sweep

    env = dict(os.environ)
    try:
        out = run_sweep(sweep, progress=False, check=False)
    finally:
        os.environ.clear()
        os.environ.update(env)  # sweeps sets Tune env vars; the plain baseline must not see them
    rows = {}
    for rec in out.book.trials.values():
        point = next((p for p in points if _key(rec.values, p)), None)
        if point is None:
            continue
        rows[label(point)] = {"stop": rec.last_step, "status": rec.status, "reason": rec.reason,
                              "stop_step": rec.stop_step}
    return rows


def run_plain(sweep, filled: list[dict], points: list[dict]) -> dict[str, dict]:
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    from sweeps.spec.space import optuna_space

    first, seed = sweep.objectives[0], sweep.spec.seed

    def trainable(config):
        sys.path.insert(0, BENCH)
        from common import tune_report_adapter
        from ray import tune as t

        from sweeps.spec.trainer_loader import load_trainer

        train = load_trainer(sweep.spec.trainer, sweep.trainer_paths)
        values = {k: v for k, v in config.items() if k in sweep.space}
        train(sweep.trial_config(values, trial_id=t.get_context().get_trial_id(), seed=seed),
              tune_report_adapter(first.metric))

    search = OptunaSearch(space=optuna_space(sweep.space), metric=first.metric,
                          mode=first.mode, seed=seed, points_to_evaluate=filled)
    collector = Collector()
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        tune_config=tune.TuneConfig(search_alg=search, scheduler=plain_asha(sweep),
                                    num_samples=len(filled),
                                    max_concurrent_trials=2),
        run_config=tune.RunConfig(name=f"plain-{sweep.spec.name}",
                                  storage_path=str(SCRATCH / "detection"),
                                  verbose=0, callbacks=[collector]))
    tuner.fit()
    rows = {}
    for tid, hist in collector.history.items():
        point = next((p for p in points if _key(collector.config[tid], p)), None)
        if point is not None:
            rows[label(point)] = {"stop": last_step(hist), "status": "ended",
                                  "errored": tid in collector.errors}
    return rows


def reference(sweep, filled: list[dict], points: list[dict]) -> dict[str, dict]:
    """The first report at which the rules fire, on an orchestration-free run."""
    from sweeps.spec.trainer_loader import load_trainer
    from sweeps.trial.run import trial_settings

    train = load_trainer(sweep.spec.trainer, sweep.trainer_paths)
    out = {}
    for values, point in zip(filled, points, strict=True):
        history: list[dict] = []
        try:
            train(sweep.trial_config(values, trial_id="ref", seed=sweep.spec.seed),
                  history.append)
        except Exception as exc:  # noqa: BLE001 - the trainer raised: detectable there
            step = last_step(history)
            out[label(point)] = {"detectable": step, "reason": f"crash: {type(exc).__name__}",
                                 "steps": step}
            continue
        verdict = first_verdict(history, trial_settings(sweep, values))
        out[label(point)] = {"detectable": verdict.step if verdict else None,
                             "reason": verdict.reason if verdict else None,
                             "steps": last_step(history)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 seeds, 200 steps, onset 60")
    ap.add_argument("--sweep", type=Path,
                    help="benchmark this sweep file's initial_points instead of the planted cases")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, help="steps per trial (planted: 300; a sweep file: "
                    "its budget.max_steps)")
    ap.add_argument("--onset", type=int, default=90, help="planted cases: the failure's step")
    ap.add_argument("--out", default="detection",
                    help="name of the results file: bench/results/<out>.json")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.steps, args.onset = 2, 200, 60
    sys.path.insert(0, BENCH)
    import ray

    from sweeps.spec.loader import load_sweep
    from sweeps.tune.searcher import initial_points
    from sweeps.tune.session import quiet_logs

    if args.sweep is not None:
        base = load_sweep(args.sweep, workdir=Path.cwd())
        if not base.spec.initial_points:
            raise SystemExit(f"{args.sweep}: initial_points is empty; list the configs to "
                             "measure there, one per case")
        onset = None
    else:
        base = planted_sweep(args.steps or 300, args.onset)
        onset = args.onset
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    quiet_logs()
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    raw = []
    for seed in range(args.seeds):
        sweep = for_seed(base, seed, args.steps)
        points = [dict(p) for p in sweep.spec.initial_points]
        filled = initial_points(sweep)
        ref = reference(sweep, filled, points)
        plain = run_plain(sweep, filled, points)
        ours = run_sweeps(sweep, points)
        for point in points:
            case = label(point)
            raw.append({"seed": seed, "case": case, "onset": onset, **{
                f"ref_{k}": v for k, v in ref[case].items()},
                **{f"sweeps_{k}": v for k, v in ours.get(case, {}).items()},
                **{f"plain_{k}": v for k, v in plain.get(case, {}).items()}})
    ray.shutdown()

    rows = []
    for r in raw:
        det = r["ref_detectable"]
        planted_at = "–" if r["onset"] is None or r["case"] in (*CONTROLS, "flat") else \
            r["onset"]

        def after(stop, det=det):
            """Steps run after the failure was detectable (0 if ASHA cut the trial before)."""
            if stop is None or det is None:
                return None
            return max(0, stop - det)

        rows.append({
            "case": r["case"], "seed": r["seed"], "planted at": planted_at,
            "detectable (rule)": f"{det} ({r['ref_reason']})" if det else "never",
            "sweeps stop": r.get("sweeps_stop"),
            "sweeps status": (r.get("sweeps_status") or "") +
            (f" ({r['sweeps_reason']})" if r.get("sweeps_reason") else ""),
            "sweeps steps after": after(r.get("sweeps_stop")),
            "plain Tune stop": r.get("plain_stop"),
            "plain Tune steps after": after(r.get("plain_stop")),
            "false stop (sweeps)": ("yes" if r.get("sweeps_status") == "unstable" else "no")
            if det is None or r["case"] in CONTROLS else "",
        })
    print(table(rows))
    wasted_s = sum(x["sweeps steps after"] or 0 for x in rows)
    wasted_p = sum(x["plain Tune steps after"] or 0 for x in rows)
    total_p = sum(x["plain Tune stop"] or 0 for x in rows)
    total_s = sum(x["sweeps stop"] or 0 for x in rows)
    false_stops = sum(x["false stop (sweeps)"] == "yes" for x in rows)
    summary = {"steps_after_detectable_sweeps": wasted_s, "steps_after_detectable_plain": wasted_p,
               "total_steps_sweeps": total_s, "total_steps_plain": total_p,
               "false_stops_sweeps": false_stops, "wall_s": time.perf_counter() - t0}
    print(f"\nsteps run after the failure was detectable: sweeps {wasted_s}, plain Ray Tune "
          f"{wasted_p} (of {total_p} steps run in all; sweeps ran {total_s}); "
          f"false stops by sweeps: {false_stops}")
    path = save(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
                           "raw": raw, "summary": summary})
    print(f"raw figures: {path}; machine load {machine()['loadavg']}")


if __name__ == "__main__":
    main()
