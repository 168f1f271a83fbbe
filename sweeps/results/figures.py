"""The report's figures: the Pareto plot, the seeds plot, the stability maps and the curves,
PNG files beside report.html."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd

from sweeps.protocol import (
    FAILED,
    SEARCH,
    SELECTION,
    WARM_START,
)
from sweeps.results import plots
from sweeps.results.folder_data import (
    MAX_FAILED_CURVES,
    MAX_TOP_CURVES,
    PLOT_GLOBS,
    SAFE_ID,
    Results,
    read_csv,
)
from sweeps.results.summary import base_summary, seed_values


def _history(res: Results, trial_id: str) -> pd.DataFrame | None:
    if not SAFE_ID.fullmatch(trial_id):
        return None
    hist = read_csv(res.folder / "trials" / f"{trial_id}.csv")
    return hist if len(hist) else None


def _failed_curves(res: Results) -> list[plots.Curve]:
    failed = res.trials[((res.trials["reason"] != "") | res.trials["status"].isin(FAILED))
                        & (res.trials["role"] != WARM_START)]
    failed = pd.concat([failed[failed["role"] == SEARCH], failed[failed["role"] != SEARCH]])
    queues = [list(g.itertuples()) for _, g in failed.groupby("reason", sort=False)]
    curves: list[plots.Curve] = []
    while any(queues) and len(curves) < MAX_FAILED_CURVES:  # round-robin over reasons
        for queue in queues:
            if queue and len(curves) < MAX_FAILED_CURVES:
                row = queue.pop(0)
                hist = _history(res, row.trial_id)
                if hist is None:
                    continue
                stop = pd.to_numeric(pd.Series([row.stop_step]), errors="coerce").iloc[0]
                role = "" if row.role == SEARCH else f" [{row.role.split(':')[0]}]"
                at = f" @ {int(stop)}" if pd.notna(stop) else ""
                curves.append(plots.Curve(f"{row.trial_id} {row.reason or row.status}{at}"
                                          f"{role}", hist, None if pd.isna(stop) else stop))
    return curves


def _top_curves(res: Results) -> list[plots.Curve]:
    curves = []
    for row in res.pareto.head(MAX_TOP_CURVES).itertuples():
        hist = _history(res, row.trial_id)
        if hist is not None:
            tag = "confirmed" if row.confirmed else "not confirmed"
            curves.append(plots.Curve(f"#{row.front_rank} {row.trial_id} ({tag})", hist))
    return curves


def _seed_plot(res: Results, path: Path) -> Path | None:
    if not res.objectives or not len(res.pareto):
        return None
    metric = res.objectives[0]
    cols = seed_values(res.pareto, metric)
    if not cols:
        return None
    rows = []
    for rec in res.pareto.to_dict(orient="records"):
        values = {s: pd.to_numeric(rec.get(c), errors="coerce") for s, c in cols.items()}
        search = values.pop(res.seed, float("nan"))
        rows.append(plots.SeedRow(str(rec["trial_id"]), str(rec.get(SELECTION) or ""),
                                  None if pd.isna(search) else float(search),
                                  [float(v) for v in values.values() if pd.notna(v)]))
    base = base_summary(res)
    if base:
        nums = {s: v for s, v in base["by_seed"].items() if isinstance(v, (int, float))}
        rows.append(plots.SeedRow("base", "base config", nums.pop(res.seed, None),
                                  list(nums.values())))
    return plots.seed_plot(rows, metric, res.modes.get(metric, "min"), path)


def _default_pair(res: Results) -> tuple[str, str | None] | None:
    numeric = [k for k in res.knobs if pd.to_numeric(res.trials[k], errors="coerce").notna().any()]
    varying = [k for k in numeric if res.trials[k].nunique() > 1] + \
              [k for k in numeric if res.trials[k].nunique() <= 1]
    x = "lr" if "lr" in numeric else next((k for k in varying if k != "grad_clip"), None)
    rest = [k for k in varying if k != x]
    y = "grad_clip" if "grad_clip" in rest and res.trials["grad_clip"].nunique() > 1 else \
        next(iter(rest), None)
    if x is None:
        x, y = y, None
    return None if x is None else (x, y)


def _slug(*parts: str | None) -> str:
    return "-".join(re.sub(r"[^A-Za-z0-9_.]+", "_", p or "outcome") for p in parts)


def draw(res: Results, pairs: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """Write every plot; returns {section: [(file name, caption)], "notes": [...]}."""
    folder, out, notes = res.folder, {}, []
    pareto = res.pareto
    handed = set(pareto.loc[pareto["rank"].notna(), "trial_id"]) \
        if {"rank", "trial_id"} <= set(pareto.columns) else set()
    path = plots.pareto_plot(res.search, res.pareto, res.objectives, res.modes,
                             folder / "pareto.png")
    out["pareto"] = [(path.name, "Pareto front")] if path else []
    path = _seed_plot(res, folder / "seeds.png")
    out["seeds"] = [(path.name, "Quality on every seed")] if path else []
    maps = [p for p in [_default_pair(res)] if p] + list(pairs or [])
    out["map"] = []
    for x, y in dict.fromkeys(maps):
        missing = [k for k in (x, y) if k is not None and k not in res.trials]
        if missing:
            notes.append(f"stability map {x} × {y}: no column {', '.join(missing)}")
            continue
        path = plots.stability_map(res.search, x, y, res.kinds, handed,
                                   folder / f"stability-{_slug(x, y)}.png")
        if path:
            out["map"].append((path.name, f"{x} × {y or 'outcome'}"))
    out["curves"] = []
    for key, curves, title in (
            ("failed", _failed_curves(res), "Failed trials (dotted line: stop step)"),
            ("top", _top_curves(res), "Candidates judged on fresh seeds (pareto.csv order)")):
        path = plots.curves_plot(curves, title, folder / f"curves-{key}.png", res.baseline)
        if path:
            out["curves"].append((path.name, title))
    out["notes"] = notes
    made = {name for section in ("pareto", "seeds", "map", "curves")
            for name, _ in out[section]}
    for pattern in PLOT_GLOBS:  # plots of an earlier report that this one did not draw
        for stale in folder.glob(pattern):
            if stale.name not in made:
                stale.unlink(missing_ok=True)
    return out
