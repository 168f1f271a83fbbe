"""The sweep report: report.html with its plots beside it."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from sweeps.atomic import write_text

STATUS_COLOURS = {"ok": "#2a9d8f", "unstable": "#e76f51", "crash": "#6d597a",
                  "pruned": "#adb5bd"}


def _pareto_plot(trials: pd.DataFrame, pareto: pd.DataFrame, objectives: list[str],
                 path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len(objectives) < 2:
        return False
    x, y = (f"objective_{objectives[0]}", f"objective_{objectives[1]}")
    search = trials[trials["role"] == "search"]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for status, colour in STATUS_COLOURS.items():
        part = search[(search["status"] == status) & search[x].notna() & search[y].notna()]
        if len(part):
            ax.scatter(part[x], part[y], c=colour, label=f"{status} ({len(part)})", s=28)
    if len(pareto):
        front = search[search["trial_id"].isin(pareto["trial_id"])]
        conf = set(pareto.loc[pareto["confirmed"].astype(bool), "trial_id"])
        for _, row in front.iterrows():
            ax.scatter(row[x], row[y], s=150, facecolors="none",
                       edgecolors="black" if row["trial_id"] in conf else "grey",
                       linewidths=2 if row["trial_id"] in conf else 1)
    ax.set_xlabel(objectives[0])
    ax.set_ylabel(objectives[1])
    ax.set_title("Stable trials and the Pareto front (ringed: front, black: confirmed)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(folder: Path, name: str, objectives: list[str]) -> Path:
    """Build report.html from trials.csv and pareto.csv in ``folder``."""
    trials = pd.read_csv(folder / "trials.csv")
    pareto_path = folder / "pareto.csv"
    pareto = pd.read_csv(pareto_path) if pareto_path.exists() and \
        pareto_path.stat().st_size > 1 else pd.DataFrame()
    plots = []
    if _pareto_plot(trials, pareto, objectives, folder / "pareto.png"):
        plots.append("pareto.png")
    search = trials[trials["role"] == "search"]
    failures = search[search["reason"].fillna("") != ""]
    taxonomy = failures.groupby("reason").size().sort_values(ascending=False)
    parts = [f"<h1>Sweep {html.escape(name)}</h1>",
             f"<p>{len(search)} search trials: " + ", ".join(
                 f"{s} {n}" for s, n in search["status"].value_counts().items()) + "</p>"]
    parts += [f'<img src="{p}" alt="{p}">' for p in plots]
    parts.append("<h2>Failure taxonomy</h2>")
    parts.append(taxonomy.rename("trials").to_frame().to_html() if len(taxonomy)
                 else "<p>No trial failed.</p>")
    if len(pareto):
        parts.append("<h2>Pareto front</h2>")
        parts.append(pareto.to_html(index=False, na_rep=""))
    parts.append("<h2>Trials</h2>")
    parts.append(trials.to_html(index=False, na_rep="", float_format=lambda v: f"{v:.4g}"))
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>"
            f"{html.escape(name)}</title><style>body{{font-family:sans-serif;margin:2em}}"
            "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;"
            "padding:2px 6px}</style></head><body>" + "\n".join(parts) + "</body></html>")
    out = folder / "report.html"
    write_text(out, page)
    return out
