"""Detection latency: how many training steps a planted failure costs, sweeps vs plain Ray Tune.

Each case of ``bench/planted.py`` (non-finite loss at step k, grad blowup from step k,
flat at the baseline, prediction collapse, LR warm restart, and two healthy controls)
runs on a few seeds under

- ``sweeps``: ``run_sweep`` on a sweep whose knob is the case (initial points = every
  case, so each runs exactly once per seed), ASHA on val_loss, rules on;
- plain Ray Tune: ``tune.Tuner`` + ``OptunaSearch(metric="val_loss", mode="min")`` with
  the same points to evaluate + ``ASHAScheduler`` (same max_t / grace / reduction factor
  as sweeps), no stopper, default loggers, no actor reuse.

"Detectable" is the first report at which ``sweeps.rules.evaluate`` (the sweep's rule
settings) fires on the trial's history, computed on a reference run of the same seed
without any orchestration; for non_finite / blowup / restart that is the planted onset.

    python bench/detection.py --quick
    python bench/detection.py --seeds 5 --steps 400 --onset 120
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, SCRATCH, Collector, first_verdict, machine, save, table  # noqa: E402

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


def run_sweeps(sweep) -> dict[str, dict]:
    from sweeps.pipeline import run_sweep

    env = dict(os.environ)
    try:
        out = run_sweep(sweep, progress=False, check=False)
    finally:
        os.environ.clear()
        os.environ.update(env)  # sweeps sets Tune env vars; the plain baseline must not see them
    rows = {}
    for rec in out.book.trials.values():
        case = rec.values["case"]
        last = rec.history[-1]["step"] if rec.history else 0
        rows[case] = {"stop": last, "status": rec.status, "reason": rec.reason,
                      "stop_step": rec.stop_step}
    return rows


def run_plain(sweep, cases: list[str], steps: int, seed: int) -> dict[str, dict]:
    import optuna
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    def trainable(config):
        sys.path.insert(0, BENCH)
        from planted import train
        from ray import tune as t

        trial_config = sweep.trial_config({"case": config["case"]},
                                          trial_id=t.get_context().get_trial_id(), seed=seed)
        from common import tune_report_adapter

        train(trial_config, tune_report_adapter())

    search = OptunaSearch(space={"case": optuna.distributions.CategoricalDistribution(cases)},
                          metric="val_loss", mode="min", seed=seed,
                          points_to_evaluate=[{"case": c} for c in cases])
    asha = ASHAScheduler(metric="val_loss", mode="min", time_attr="training_iteration",
                         max_t=steps, grace_period=steps // 4, reduction_factor=3)
    collector = Collector()
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        tune_config=tune.TuneConfig(search_alg=search, scheduler=asha, num_samples=len(cases),
                                    max_concurrent_trials=2),
        run_config=tune.RunConfig(name=f"plain-{seed}", storage_path=str(SCRATCH / "detection"),
                                  verbose=0, callbacks=[collector]))
    tuner.fit()
    rows = {}
    for tid, hist in collector.history.items():
        case = collector.config[tid]["case"]
        rows[case] = {"stop": hist[-1].get("step", 0), "status": "ended",
                      "errored": tid in collector.errors}
    return rows


def reference(cases: list[str], sweep, seed: int) -> dict[str, dict]:
    """The first report at which the rules fire, on an orchestration-free run."""
    from planted import train

    from sweeps.trainable import trial_settings

    out = {}
    for case in cases:
        history: list[dict] = []
        train(sweep.trial_config({"case": case}, trial_id="ref", seed=seed), history.append)
        verdict = first_verdict(history, trial_settings(sweep, {"case": case}))
        out[case] = {"detectable": verdict.step if verdict else None,
                     "reason": verdict.reason if verdict else None,
                     "steps": history[-1]["step"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 seeds, 200 steps, onset 60")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--onset", type=int, default=90)
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.steps, args.onset = 2, 200, 60
    sys.path.insert(0, BENCH)
    import ray
    from planted import CASES

    from sweeps.ray_session import quiet_logs
    from sweeps.spec import load_sweep_dict

    cases = list(CASES)
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    quiet_logs()
    raw = []
    for seed in range(args.seeds):
        sweep = load_sweep_dict(sweep_dict(f"detect-{seed}", cases, args.steps, args.onset, seed),
                                base_dir=Path(BENCH))
        ref = reference(cases, sweep, seed)
        plain = run_plain(sweep, cases, args.steps, seed)
        ours = run_sweeps(sweep)
        for case in cases:
            raw.append({"seed": seed, "case": case, "onset": args.onset, **{
                f"ref_{k}": v for k, v in ref[case].items()},
                **{f"sweeps_{k}": v for k, v in ours.get(case, {}).items()},
                **{f"plain_{k}": v for k, v in plain.get(case, {}).items()}})
    ray.shutdown()

    rows = []
    for r in raw:
        det = r["ref_detectable"]
        healthy = r["case"].startswith("healthy")

        def after(stop, det=det):
            """Steps run after the failure was detectable (0 if ASHA cut the trial before)."""
            if stop is None or det is None:
                return None
            return max(0, stop - det)

        rows.append({
            "case": r["case"], "seed": r["seed"],
            "planted at": "–" if r["case"] in ("healthy", "flat") else r["onset"],
            "detectable (rule)": f"{det} ({r['ref_reason']})" if det else "never",
            "sweeps stop": r.get("sweeps_stop"),
            "sweeps status": (r.get("sweeps_status") or "") +
            (f" ({r['sweeps_reason']})" if r.get("sweeps_reason") else ""),
            "sweeps steps after": after(r.get("sweeps_stop")),
            "plain Tune stop": r.get("plain_stop"),
            "plain Tune steps after": after(r.get("plain_stop")),
            "false stop (sweeps)": ("yes" if healthy and r.get("sweeps_status") in
                                    ("unstable", "crash") else ("no" if healthy else "")),
        })
    print(table(rows))
    wasted_s = sum(x["sweeps steps after"] or 0 for x in rows)
    wasted_p = sum(x["plain Tune steps after"] or 0 for x in rows)
    total_p = sum(x["plain Tune stop"] or 0 for x in rows)
    total_s = sum(x["sweeps stop"] or 0 for x in rows)
    summary = {"steps_after_detectable_sweeps": wasted_s, "steps_after_detectable_plain": wasted_p,
               "total_steps_sweeps": total_s, "total_steps_plain": total_p,
               "wall_s": time.perf_counter() - t0}
    print(f"\nsteps run after the failure was detectable: sweeps {wasted_s}, plain Ray Tune "
          f"{wasted_p} (of {total_p} steps run in all; sweeps ran {total_s})")
    path = save("detection", {"args": vars(args), "rows": rows, "raw": raw, "summary": summary})
    print(f"raw figures: {path.relative_to(ROOT)}; machine load {machine()['loadavg']}")


if __name__ == "__main__":
    main()
