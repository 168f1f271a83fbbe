"""Seed noise and fresh-seed outcome of a finished sweep: its best configs re-trained on new seeds.

Takes a results folder, picks the ``--top`` search trials by their search-seed quality
plus every config the sweep handed over (``stable/``), and re-trains each on ``--seeds``
seeds the sweep never used, in this process, with the sweep's rules judging every run.
Prints per config: the search-seed value, the fresh-seed mean and worst, the gap between
its best and worst seed (``objectives.quality_gap``, the measure of ``confirm.tolerance``)
and how many fresh runs a rule stopped. The gaps of the robust configs are the seed noise
``confirm.tolerance`` has to clear; the rows of the handed-over configs are what a user of
``sweeps best`` gets.

    python bench/seed_noise.py results/direction-demo --top 6 --seeds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import save, table  # noqa: E402


def retrain(sweep, values: dict[str, Any], seeds: list[int]) -> list[tuple[float | None, str]]:
    """(quality, verdict) of ``values`` on each seed, judged by the sweep's rules."""
    from sweeps.protocol import SEED_KEY
    from sweeps.record import objectives
    from sweeps.trial.run import prepare_process, run_trainer

    prepare_process(sweep, int(sweep.spec.resources.cpu))
    metric = sweep.objectives[0].metric
    out = []
    for seed in seeds:
        reporter = run_trainer(sweep, {**values, SEED_KEY: seed}, f"noise-{seed}",
                               lambda result: None)
        verdict = reporter.verdict.reason if reporter.verdict else "ok"
        out.append((objectives.metric_value(reporter.history, metric), verdict))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="results folder of a finished sweep")
    ap.add_argument("--top", type=int, default=5, help="search trials to re-train, best first")
    ap.add_argument("--seeds", type=int, default=5, help="fresh seeds per config")
    ap.add_argument("--first-seed", type=int, default=1000)
    args = ap.parse_args()

    import pandas as pd

    from sweeps.commands.run import load_resolved
    from sweeps.record.objectives import quality_gap

    sweep = load_resolved(args.dir)
    quality = sweep.objectives[0]
    trials = pd.read_csv(args.dir / "trials.csv", dtype={"trial_id": str})
    pareto = pd.read_csv(args.dir / "pareto.csv", dtype={"trial_id": str}) \
        if (args.dir / "pareto.csv").stat().st_size > 1 else pd.DataFrame()
    col = f"objective_{quality.metric}"
    search = trials[(trials["role"] == "search") & (trials["status"] == "ok")]
    search = search.sort_values(col, ascending=quality.mode == "min")
    handed = list(pareto.loc[pareto["yaml"].notna(), "trial_id"]) if "yaml" in pareto else []
    picks = list(dict.fromkeys(list(search["trial_id"][:args.top]) + handed))
    verdicts = dict(zip(pareto.get("trial_id", []), pareto.get("selection", []), strict=False))
    ranks = dict(zip(pareto.get("trial_id", []), pareto.get("rank", []), strict=False))
    seeds = [args.first_seed + k for k in range(args.seeds)]
    baseline = sweep.spec.rules.baseline_loss
    rows, raw = [], []
    for trial_id in picks:
        row = trials[trials["trial_id"] == trial_id].iloc[0]
        values = {k: row[k] for k in sweep.space if k in row and pd.notna(row[k])}
        values = {k: (v.item() if hasattr(v, "item") else v) for k, v in values.items()}
        runs = retrain(sweep, values, seeds)
        good = [q for q, v in runs if v == "ok" and q is not None]
        best = (min if quality.mode == "min" else max)(good) if good else None
        worst = (max if quality.mode == "min" else min)(good) if good else None
        rank = ranks.get(trial_id)
        rows.append({
            "trial": trial_id, "selection": verdicts.get(trial_id, "-"),
            "stable/ rank": int(rank) if pd.notna(rank) and rank is not None else "-",
            "search value": row[col],
            "fresh mean": statistics.fmean(good) if good else None, "fresh worst": worst,
            "gap (worst vs best)": quality_gap(worst, best, quality.mode, baseline)
            if good else None,
            "gap vs own search value": quality_gap(worst, row[col], quality.mode, baseline)
            if good else None,
            "unstable runs": f"{sum(v != 'ok' for _, v in runs)}/{len(runs)}"})
        raw.append({"trial_id": trial_id, "values": values, "runs": runs})
        print(f"{trial_id}: {[round(q, 4) if q is not None else v for q, v in runs]}",
              flush=True)
    print()
    print(table(rows))
    path = save(f"seed_noise-{sweep.name}", {"dir": str(args.dir), "seeds": seeds,
                                            "rows": rows, "raw": raw})
    print(f"raw figures: {path}")


if __name__ == "__main__":
    main()
