"""The report's content as plain data (``sweeps report --format json``): counts, failure
taxonomy, front, base config, importance, the YAML handed over."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from sweeps.protocol import (
    BASE_CONFIG,
    OK,
    PRUNED,
    PRUNED_LABEL_PREFIX,
    SELECTION,
    SELECTION_REASON,
    confirm_role,
    objective_column,
    seed_column_prefix,
)
from sweeps.results.export import base_held, base_not_compared, worse_than_base
from sweeps.results.folder_data import Results, load, plain_value, taxonomy
from sweeps.results.importance import importance


def summary(folder: Path) -> dict[str, Any]:
    """The report's content as plain data: counts, failure taxonomy, front, stable YAMLs."""
    return summary_of(load(folder))


def summary_of(res: Results) -> dict[str, Any]:
    """``summary`` of an already loaded folder."""
    front = [{k: plain_value(v) for k, v in row.items()}
             for row in res.pareto.to_dict(orient="records")]
    tax = taxonomy(res)
    return {
        "name": res.name,
        "folder": str(res.folder),
        "objectives": [{"metric": o, "mode": res.modes.get(o, "min"),
                        **({"baseline": res.baselines[o]} if o in res.baselines else {})}
                       for o in res.objectives],
        "knobs": res.knobs,
        "search_trials": int(len(res.search)),
        "counts": {k: int(v) for k, v in res.search["status"].value_counts().items()},
        "rerun_counts": {k: int(v) for k, v in res.reruns["status"].value_counts().items()},
        "warm_start": _warm_summary(res),
        "lr_probe": lr_probe_summary(res),
        "selection_notes": list(res.notes),
        "failures": {t["reason"]: t["trials"] for t in tax
                     if t["trials"] and not t["reason"].startswith(PRUNED)},
        "diagnoses": {t["reason"].removeprefix(PRUNED_LABEL_PREFIX): t["trials"] for t in tax
                      if t["reason"].startswith(PRUNED)},
        "taxonomy": tax,
        "front": front,
        "selection": {k: int(v) for k, v in res.pareto.get(
            SELECTION, pd.Series(dtype=str)).value_counts().items()},
        "fragile": {str(r["trial_id"]): str(r.get(SELECTION_REASON) or "")
                    for r in res.pareto.to_dict(orient="records")
                    if r.get(SELECTION) == "fragile"},
        "not_handed_over": {str(r["trial_id"]): {"verdict": str(r.get(SELECTION)),
                                                 "reason": str(r.get(SELECTION_REASON) or "")}
                            for r in res.pareto.to_dict(orient="records")
                            if r.get(SELECTION) in ("fragile", "incomplete", "poor")},
        "base": base_summary(res),
        "compile_fallbacks": compile_fallbacks(res.trials),
        "importance": importance(res.folder, res.name, res.objectives, res.search, res.space),
        "stable_yamls": res.stable,
        "best_yaml": str(res.folder / res.stable[0]) if res.stable else None,
        "worse_than_base": worse_than_base(res.folder / res.stable[0]) if res.stable else None,
        "base_held": base_held(res.folder / res.stable[0]) if res.stable else None,
        "base_not_compared": base_not_compared(res.folder / res.stable[0]) if res.stable
        else None,
    }


def _warm_summary(res: Results) -> dict[str, Any] | None:
    """How many trials of which earlier sweeps seeded the search (``--warm-start``)."""
    warm = res.warm
    if not len(warm):
        return None
    source = warm["warm_start_from"] if "warm_start_from" in warm else pd.Series(dtype=str)
    return {"trials": int(len(warm)),
            "counts": {k: int(v) for k, v in warm["status"].value_counts().items()},
            "from": sorted({str(v) for v in source.dropna()})}


def lr_probe_summary(res: Results) -> dict[str, Any] | None:
    """lr's range when its high came from the boundary probe (``high: probe``): low, high,
    the probe's record and a line saying so; else None."""
    from sweeps.spec.probed import ProbedHigh

    entry = res.space.get("lr") or {}
    record = entry.get("probed")
    low = entry.get("low")
    if not isinstance(record, dict) or not isinstance(low, (int, float)):
        return None
    try:
        probed = ProbedHigh.model_validate(record)
    except ValueError:  # a hand-edited sweep.yaml: the report says nothing of it
        return None
    return {"low": low, "high": entry.get("high"), **probed.model_dump(mode="json"),
            "text": probed.line(low)}


def seed_values(frame: pd.DataFrame, metric: str) -> dict[int, str]:
    """Columns ``<metric>@seed<s>`` of pareto.csv, by seed."""
    prefix = seed_column_prefix(metric)
    return {int(c[len(prefix):]): c for c in frame.columns
            if c.startswith(prefix) and c[len(prefix):].isdigit()}


def base_trial_id(res: Results) -> str | None:
    """The search trial that ran the base config's own values, if one did."""
    if BASE_CONFIG not in res.trials:
        return None
    marked = res.trials[res.trials[BASE_CONFIG].astype(str) == "True"]
    return str(marked.iloc[0]["trial_id"]) if len(marked) else None


def base_summary(res: Results) -> dict[str, Any] | None:
    """The base config's reference runs: quality by seed, the fresh-seed mean and, when
    it was a search trial, its ``trial_id``."""
    if not res.objectives:
        return None
    col = objective_column(res.objectives[0])
    runs = res.trials[res.trials["role"] == "base"]
    trial_id = base_trial_id(res)
    if not len(runs) and trial_id is not None:  # the base config was a search trial
        runs = res.trials[(res.trials["trial_id"] == trial_id)
                          | (res.trials["role"] == confirm_role(trial_id))]
    if not len(runs) or col not in runs:
        return None
    by_seed = {int(r["seed"]): plain_value(r[col]) if r["status"] == OK else r["status"]
               for r in runs.to_dict(orient="records")}
    fresh = [v for s, v in by_seed.items() if s != res.seed and isinstance(v, (int, float))]
    return {"by_seed": by_seed, "mean": sum(fresh) / len(fresh) if fresh else None,
            "trial_id": trial_id}



def compile_fallbacks(trials: pd.DataFrame) -> dict[str, str]:
    """Trials labelled compiled that ran eagerly (trials.csv ``compile_fallback``): id -> why."""
    if "compile_fallback" not in trials:
        return {}
    rows = trials[trials["compile_fallback"].fillna("").astype(str) != ""]
    return {str(t): str(r) for t, r in zip(rows["trial_id"], rows["compile_fallback"],
                                           strict=True)}
