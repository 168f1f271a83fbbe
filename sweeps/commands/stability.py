"""``sweeps stability``: run the grid on Ray and write stability.csv / .md (and a map)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from sweeps.errors import SpecError
from sweeps.record.book import TrialBook, books_of, open_book
from sweeps.results import stability
from sweeps.results.files import write_csv, write_histories
from sweeps.spec.loader import Sweep
from sweeps.state.atomic import write_text
from sweeps.state.folder_lock import claim
from sweeps.trial.tryout import try_values
from sweeps.tune.experiments import run_configs
from sweeps.tune.session import ray_running

#: Where ``sweeps stability`` writes, under the sweep's results folder: its own place, so a
#: stability sweep and ``sweeps run`` of one sweep file never overwrite each other's files.
STABILITY_DIR = "stability"
#: Folder (under :data:`STABILITY_DIR`) for the stability runs' journals and histories.
FOLDER = "trials"


def stability_sweep(sweep: Sweep) -> Sweep:
    """``sweep`` writing into ``results/<name>/stability/``."""
    return replace(sweep, output_dir=sweep.output_dir / STABILITY_DIR)


@dataclass
class StabilityOutcome:
    """The table and what it recommends."""

    table: pd.DataFrame
    names: list[str]
    recommended: Any
    why: str
    clip: float | None
    clip_why: str
    boundary: tuple[Any, Any] | None
    boundary_text: str
    warnings: list[str]
    files: list[Path]
    quality_note: str = ""
    display: pd.DataFrame | None = None


def _check_knob(sweep: Sweep, name: str, values: list[Any], flag: str) -> None:
    if name not in sweep.space:
        raise SpecError(flag, f"{name!r} is not a knob of the search space",
                        f"use one of {', '.join(sweep.space)}")
    if not values:
        raise SpecError(flag, "no values given", "give e.g. --values 1e-4,1e-3,1e-2")


def run_stability(sweep: Sweep, param: str, values: list[Any], *, seeds: int = 3,
                  second: tuple[str, list[Any]] | None = None, address: str | None = None,
                  progress: bool = True) -> StabilityOutcome:
    """Run every grid value on ``seeds`` seeds and analyse the runs; ``sweep`` is the
    :func:`stability_sweep` (its output folder is the stability one)."""
    _check_knob(sweep, param, values, "--param")
    if second:
        _check_knob(sweep, second[0], second[1], "--and")
    names = [param] + ([second[0]] if second else [])
    base = {k: v for k, v in try_values(sweep, {}).items() if k not in names}
    runs = stability.plan(base, param, values, [sweep.spec.seed + i for i in range(seeds)], second)
    with claim(sweep.output_dir, "stability"):  # one owner per results folder
        shutil.rmtree(sweep.output_dir / FOLDER, ignore_errors=True)
        with books_of(sweep):
            book = open_book(sweep, FOLDER)
            with ray_running(address):
                run_configs(sweep, book, runs, "ray", progress=progress)
            return write_stability(sweep, book, names)


def quality_of(sweep: Sweep) -> stability.Quality | None:
    """The sweep's first objective, the quality the stability table reports."""
    first = sweep.objectives[0] if sweep.objectives else None
    return stability.Quality(first.metric, first.mode, sweep.quality_baseline) \
        if first else None


def write_stability(sweep: Sweep, book: TrialBook, names: list[str]) -> StabilityOutcome:
    """stability.csv, stability.md and, for two knobs, stability_map.png."""
    out = sweep.output_dir
    rows = stability.cells(book, names[0], names[1] if len(names) > 1 else None)
    quality = quality_of(sweep)
    records = stability.table_rows(rows, names, quality)
    table = pd.DataFrame(records)
    display = pd.DataFrame(stability.display_rows(records, quality))
    recommended, why = stability.recommend(rows, quality)
    note = stability.quality_note(rows, quality)
    clip, clip_why = stability.recommend_clip(rows)
    below, above = stability.boundary(rows)
    warnings = stability.clip_warnings(rows)
    files = [out / "stability.csv", out / "stability.md"]
    write_csv(files[0], table)
    write_histories(out / FOLDER, book)
    md = [f"# Stability of {sweep.name} over {' × '.join(names)}", "",
          display.to_markdown(index=False), "",
          f"- {note}",
          f"- boundary: {_edge(below, above)}",
          f"- recommended {names[0]}: {stability.label((recommended,))} ({why})",
          f"- recommended grad_clip: {clip if clip is None else f'{clip:.3g}'} ({clip_why})"]
    md += [f"- warning: {w}" for w in warnings]
    write_text(files[1], "\n".join(md) + "\n")
    if len(names) == 2:
        files.append(out / "stability_map.png")
        stability.draw_map(rows, names, files[-1], quality)
    edge = (below.key[0] if below else None, above.key[0]) if above else None
    return StabilityOutcome(table, names, recommended, why, clip, clip_why, edge,
                            _edge(below, above), warnings, files, note, display)


def _edge(below, above) -> str:
    if above is None:
        return "not found in the grid"
    low = stability.label(below.key[:1]) if below else "(none stable)"
    return f"between {low} and {stability.label(above.key[:1])} ({above.verdict()})"
