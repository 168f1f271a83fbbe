"""The files a sweep leaves behind: trials.csv, pareto.csv, stable/*.yaml, trials/*.csv."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from sweeps import objectives
from sweeps.atomic import replace_dir, write_text
from sweeps.book import TrialBook, TrialRecord
from sweeps.confirm import Confirmation
from sweeps.export import write_config
from sweeps.spec import Sweep


def trial_row(sweep: Sweep, book: TrialBook, rec: TrialRecord) -> dict[str, Any]:
    """One row of trials.csv."""
    row: dict[str, Any] = {
        "trial_id": rec.trial_id, "role": rec.role, "status": rec.status,
        "reason": rec.reason or "", "stop_step": rec.stop_step, "seed": rec.seed,
        "steps": rec.history[-1].get("step") if rec.history else 0,
        "retries": rec.retries,
    }
    row.update({k: rec.values.get(k) for k in sweep.space})
    for obj, value in zip(sweep.objectives, book.objective_values(rec, sweep.objectives),
                          strict=True):
        if obj.metric == "instability" and rec.failed:
            value = max(objectives.FAILED_INSTABILITY, value or 0.0)  # as told to Optuna
        row[f"objective_{obj.metric}"] = value
    row.update(objectives.summary(rec.history))
    row["evidence"] = json.dumps(rec.evidence, default=str) if rec.evidence else ""
    row["warnings"] = "; ".join(rec.warnings)
    return row


def trials_frame(sweep: Sweep, book: TrialBook) -> pd.DataFrame:
    """All trials, search first then re-runs, in the order they were created."""
    frame = pd.DataFrame([trial_row(sweep, book, r) for r in book.trials.values()])
    for col in ("stop_step", "steps"):
        if col in frame:
            frame[col] = frame[col].astype("Int64")
    return frame


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    write_text(path, frame.to_csv(index=False))


def write_histories(folder: Path, book: TrialBook) -> None:
    """Each trial's metric history as trials/<id>.csv, and its traceback as <id>.error.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    for rec in book.trials.values():
        if rec.history:
            write_csv(folder / f"{rec.trial_id}.csv", pd.DataFrame(rec.history))
        if rec.error:
            write_text(folder / f"{rec.trial_id}.error.txt", rec.error)


def _finite_or_none(x: float | None) -> float | str | None:
    if x is None:
        return None
    return x if math.isfinite(x) else str(x)


def write_front(sweep: Sweep, book: TrialBook, front: list[TrialRecord],
                confirmations: dict[str, Confirmation] | None) -> tuple[pd.DataFrame, list[Path]]:
    """pareto.csv and stable/: confirmed members only (all members if confirmation is off)."""
    out = sweep.output_dir
    rows, chosen = [], []
    for rank, rec in enumerate(front, start=1):
        conf = (confirmations or {}).get(rec.trial_id)
        ok = conf.confirmed if conf is not None else True
        row: dict[str, Any] = {"front_rank": rank, "trial_id": rec.trial_id}
        row.update({k: rec.values.get(k) for k in sweep.space})
        values = book.objective_values(rec, sweep.objectives)
        row.update({o.metric: v for o, v in zip(sweep.objectives, values, strict=True)})
        if conf is not None:
            row.update({"seeds_passed": conf.seeds_passed, "seeds_run": len(conf.seeds),
                        "seed_failures": "; ".join(conf.seed_reasons),
                        "lr_probe": conf.probe_status or "",
                        "lr_probe_reason": conf.probe_reason or "",
                        "lr_sensitivity": _finite_or_none(conf.lr_sensitivity)})
        row["confirmed"] = ok
        row["yaml"] = ""
        if ok:
            chosen.append((rec, conf, values, row))
        rows.append(row)

    paths: list[Path] = []

    def fill(tmp: Path) -> None:
        for i, (rec, conf, values, row) in enumerate(chosen, start=1):
            name = f"rank-{i:02d}-{rec.trial_id}.yaml"
            provenance: dict[str, Any] = {
                "rank": f"{i} of {len(chosen)} confirmed Pareto-stable configs",
                "trial": f"{rec.trial_id} (seed {rec.seed})",
                "objectives": {o.metric: v for o, v in zip(sweep.objectives, values,
                                                           strict=True)},
                "knobs": dict(rec.values),
            }
            if conf is None:
                provenance["confirmation"] = "not run (confirm.seeds: 0)"
            else:
                provenance["confirmation"] = (
                    f"stable on {conf.seeds_passed}/{len(conf.seeds)} extra seeds "
                    f"{conf.seeds}; LR x{sweep.spec.confirm.lr_probe:g} probe: "
                    f"{conf.probe_status or 'not run'}"
                    + (f" ({conf.probe_reason})" if conf.probe_reason else "")
                    + (f"; LR sensitivity {conf.lr_sensitivity:.3g}"
                       if conf.lr_sensitivity is not None else ""))
            write_config(tmp / name, sweep, rec.values, provenance)
            row["yaml"] = f"stable/{name}"
            paths.append(out / "stable" / name)

    replace_dir(out / "stable", fill)
    frame = pd.DataFrame(rows)
    write_csv(out / "pareto.csv", frame)
    return frame, paths
