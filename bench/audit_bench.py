"""False alarms: ``sweeps audit`` on real sweeps of the vMF direction MLP.

Per seed, a real sweep (``run_sweep``: rules, stability-aware TPE, ASHA, no confirmation)
runs efficiency.py's built-in ``direction-mlp`` case (``sweeps.trainers.direction`` with
``examples/configs/direction_mlp.yaml`` and its space); its first trials are the failure
set of ``bench/cases/direction_mlp_failures.yaml`` (``--no-failure-points``: TPE alone).
Then :func:`sweeps.results.audit.run_audit` re-runs every rule-stopped and every pruned search
trial to full length on its own seed with the rules only observing, and judges it against
the best ``ok`` search trial (``recovered`` = within ``--margin`` by
``objectives.quality_gap``). The ``ok`` trials, which ran to full length already, are
judged the same way from their own history.

Printed per verdict (a rule's stop, or a pruned trial's diagnosis by rule, or
``pruned (no diagnosis)``): stopped, audited, recovered, poor, failed, precision; then the
verdicts on trials whose full-length value is within 10 % of the best stable trial (by the
audit's gap and by plain ``val_loss <= 1.1 x best``), and the trials without a verdict
or diagnosis whose full-length run a rule flags, or that failed.

    python bench/audit_bench.py --seeds 2 --trials 14 --steps 200
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, SCRATCH, machine, save, table  # noqa: E402

FAILURES = ROOT / "bench" / "cases" / "direction_mlp_failures.yaml"
NEAR = 0.10
UNDIAGNOSED = "pruned (no diagnosis)"


def failure_points() -> list[dict[str, Any]]:
    import yaml

    return list(yaml.safe_load(FAILURES.read_text())["initial_points"])


def for_seed(seed: int, trials: int, steps: int, points: list[dict[str, Any]]):
    """The direction-mlp case as one seed's sweep: ``trials`` trials of ``steps`` steps."""
    from efficiency import builtin_sweep

    from sweeps.spec.loader import Confirm

    sweep = builtin_sweep("direction-mlp", steps)
    budget = sweep.spec.budget.model_copy(update={
        "trials": trials, "total_steps": None, "max_steps": steps, "concurrent": 2})
    name = f"audit-direction-mlp-{seed}"
    spec = sweep.spec.model_copy(update={
        "budget": budget, "seed": seed, "name": name, "initial_points": points,
        "confirm": Confirm(seeds=0, lr_probe=0)})
    return replace(sweep, spec=spec, output_dir=SCRATCH / "audit" / name)


def verdict_of(rec) -> str:
    """The verdict a search trial got in the sweep: its rule, ``pruned · <rule>``,
    :data:`UNDIAGNOSED`, or "" (ran to the end)."""
    if rec.status == "pruned":
        return f"pruned · {rec.diagnosis['reason']}" if rec.diagnosis else UNDIAGNOSED
    if rec.status == "ok":
        return ""
    return str(rec.reason or rec.status)


def one_seed(seed: int, trials: int, steps: int, points: list[dict[str, Any]],
             margin: float) -> list[dict[str, Any]]:
    """Run the sweep, audit every stopped trial, judge the ok ones; one row per trial."""
    from sweeps.commands.run import run_sweep
    from sweeps.results.audit import Rerun, judge, run_audit

    sweep = for_seed(seed, trials, steps, points)
    out = run_sweep(sweep, progress=False, check=False)
    search = {t: r for t, r in out.book.trials.items() if r.role == "search"}
    result = run_audit(sweep.output_dir, sample=len(search), pruned=True, margin=margin)
    rules = sweep.spec.rules
    runs = {r.trial_id: r for r in (result.reruns if result else [])}
    best = result.best if result else None
    rows = []
    for tid, rec in search.items():
        run = runs.get(tid)
        if run is None:  # ran to the end in the sweep: judge its own history
            run = judge(Rerun(tid, rec.status, None, rec.values, rec.seed,
                              history=list(rec.history)), "val_loss", "min", best,
                        sweep.quality_baseline, rules.flat_tolerance, margin)
        rows.append({
            "seed": seed, "trial_id": tid, "status": rec.status,
            "verdict": verdict_of(rec), "stop_step": rec.stop_step or rec.last_step,
            "full_val_loss": run.quality, "best_ok": best, "gap": run.gap,
            "rel_gap": None if best is None or run.quality is None or
            not math.isfinite(run.quality) else run.quality / best - 1,
            "outcome": run.outcome, "why": run.why,
            "rerun_rule": run.verdict_reason or "", "rerun_step": run.verdict_step,
            "values": rec.values})
    return rows


def per_verdict(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """stopped / recovered / poor / failed / precision per verdict over all seeds."""
    out = []
    for key in sorted({r["verdict"] for r in rows if r["verdict"]}):
        part = [r for r in rows if r["verdict"] == key]
        n = {o: sum(r["outcome"] == o for r in part) for o in ("recovered", "poor", "failed")}
        out.append({"verdict": key, "stopped": len(part), **n,
                    "precision": None if key == UNDIAGNOSED else 1 - n["recovered"] / len(part)})
    return out


def summarise(rows: list[dict[str, Any]], margin: float) -> dict[str, Any]:
    verdicts = [r for r in rows if r["verdict"] and r["verdict"] != UNDIAGNOSED]
    bare = [r for r in rows if not r["verdict"] or r["verdict"] == UNDIAGNOSED]

    def ids(rs: list[dict[str, Any]]) -> list[str]:
        return [f"{r['seed']}/{r['trial_id']}" for r in rs]

    near_gap = [r for r in verdicts if r["gap"] is not None and r["gap"] <= NEAR]
    near_rel = [r for r in verdicts if r["rel_gap"] is not None and r["rel_gap"] <= NEAR]
    flagged = [r for r in bare if r["rerun_rule"]]
    failed = [r for r in bare if r["outcome"] == "failed"]
    return {"trials": len(rows), "verdicts": len(verdicts),
            "rule_stops": sum(r["status"] == "unstable" for r in rows),
            "diagnosed_pruned": sum(r["verdict"].startswith("pruned · ") for r in rows),
            "undiagnosed_pruned": sum(r["verdict"] == UNDIAGNOSED for r in rows),
            "ok": sum(r["status"] == "ok" for r in rows), "margin": margin,
            "verdicts_near_best_gap": len(near_gap), "near_best_gap_ids": ids(near_gap),
            "verdicts_near_best_rel": len(near_rel), "near_best_rel_ids": ids(near_rel),
            "undiagnosed_flagged": len(flagged), "undiagnosed_flagged_ids": ids(flagged),
            "undiagnosed_failed": len(failed), "undiagnosed_failed_ids": ids(failed)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--trials", type=int, default=14, help="search trials per seed")
    ap.add_argument("--steps", type=int, default=200, help="steps per trial and re-run")
    ap.add_argument("--margin", type=float, default=0.10,
                    help="the audit's margin for 'recovered' (quality_gap)")
    ap.add_argument("--no-failure-points", action="store_true",
                    help="start from TPE alone, not from the failure set's configs")
    ap.add_argument("--out", default="detection-audit-direction-mlp")
    args = ap.parse_args()
    import os

    import ray

    from sweeps.tune.session import quiet_logs

    points = [] if args.no_failure_points else failure_points()
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    quiet_logs()
    env = dict(os.environ)
    rows: list[dict[str, Any]] = []
    try:
        for seed in range(args.seeds):
            rows += one_seed(seed, args.trials, args.steps, points, args.margin)
            os.environ.clear()
            os.environ.update(env)
    finally:
        ray.shutdown()
    shown = [{k: r[k] for k in ("seed", "trial_id", "verdict", "stop_step", "full_val_loss",
                                "gap", "outcome", "rerun_rule", "rerun_step")} for r in rows]
    print(table(shown))
    rules = per_verdict(rows)
    print()
    print(table(rules, floatfmt=".2f"))
    summary = {**summarise(rows, args.margin), "wall_s": time.perf_counter() - t0}
    print(f"\nverdicts on trials within {NEAR:.0%} of the best stable trial: "
          f"{summary['verdicts_near_best_gap']} by the audit's gap, "
          f"{summary['verdicts_near_best_rel']} by val_loss <= 1.1 x best; "
          f"trials without a verdict that a rule flags at full length: "
          f"{summary['undiagnosed_flagged']}; that failed at full length: "
          f"{summary['undiagnosed_failed']}; wall {summary['wall_s']:.0f} s")
    path = save(args.out, {"args": vars(args), "rows": rows, "per_verdict": rules,
                           "summary": summary})
    print(f"raw figures: {path}; machine load {machine()['loadavg']}")


if __name__ == "__main__":
    main()
