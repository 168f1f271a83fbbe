"""``sweeps stability``: run the grid on Ray and write stability.csv / .md (and a map), or
with ``--probe`` search the boundary one trial at a time and write boundary.md."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from sweeps.errors import SpecError
from sweeps.protocol import CRASH, SEED_KEY, STATUS_KEY
from sweeps.record.book import TrialBook, books_of, open_book
from sweeps.results import boundary, stability
from sweeps.results.files import write_csv, write_histories
from sweeps.spec.loader import Sweep
from sweeps.state.atomic import write_text
from sweeps.state.folder_lock import claim
from sweeps.trial.run import prepare_process, run_trainer
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


# -- the boundary probe (``--probe``) ---------------------------------------------------------

#: The probe's report, under :data:`STABILITY_DIR`.
BOUNDARY_FILE = "boundary.md"


def probe_range(sweep: Sweep, param: str, text: str | None) -> tuple[float, float]:
    """``--range LOW:HIGH``, else the search space's range of ``lr``; a SpecError otherwise."""
    _check_knob(sweep, param, [1], "--param")
    if text:
        low, sep, high = text.partition(":")
        try:
            lo, hi = float(low), float(high)
        except ValueError:
            lo = hi = -1.0
        if not sep or not 0 < lo < hi:
            raise SpecError("--range", f"{text!r} is not 0 < LOW < HIGH",
                            "write e.g. --probe --range 1e-5:10")
        return lo, hi
    knob = sweep.space.get(param)
    low, high = getattr(knob, "low", None), getattr(knob, "high", None)
    if param != "lr" or not isinstance(low, (int, float)) or not isinstance(high, (int, float)) \
            or not 0 < low < high:
        raise SpecError("--probe", f"no range to probe {param!r} in (only lr's range in the "
                        "search space is used, and it must be numeric with 0 < low < high)",
                        "give the range: --range LOW:HIGH, e.g. --range 1e-5:10")
    return float(low), float(high)


def run_probe(sweep: Sweep, param: str, rng: tuple[float, float], *, seeds: int = 3,
              echo: Callable[[str], None] | None = None) -> boundary.Boundary:
    """Probe the boundary of ``param`` one trial at a time in this process (no Ray) and
    write ``boundary.md``; ``sweep`` is the :func:`stability_sweep`, its budget the steps."""
    _check_knob(sweep, param, [1], "--param")
    if seeds < 1:
        raise SpecError("--seeds", f"{seeds} is below 1", "give e.g. --seeds 3")
    base = try_values(sweep, {})
    start = base.get(param)
    if not isinstance(start, (int, float)) or isinstance(start, bool) or not start > 0:
        start = math.sqrt(rng[0] * rng[1])
    prepare_process(sweep, int(sweep.spec.resources.cpu), shared_cache=False)

    def run(value: float, seed: int) -> boundary.SeedRun:
        one = _probe_run(sweep, {**base, param: value, SEED_KEY: seed})
        if echo:
            why = "held" if one.held else f"failed: {one.reason} at step {one.stop_step}"
            echo(f"probe {param}={value:.4g} seed {seed}: {why} ({one.steps} steps)")
        return one

    steps = int(sweep.spec.budget.max_steps)
    with claim(sweep.output_dir, "stability"):  # marks and holds the stability folder
        result = boundary.probe(run, float(start), *rng,
                                seeds=[sweep.spec.seed + i for i in range(seeds)],
                                steps_per_run=steps)
        md = [f"# Stability boundary of {sweep.name} in {param}", "",
              *boundary.summary(result, param), "", "Probes:", "",
              *boundary.probe_lines(result)]
        write_text(sweep.output_dir / BOUNDARY_FILE, "\n".join(md) + "\n")
    return result


def _probe_run(sweep: Sweep, config: dict[str, Any]) -> boundary.SeedRun:
    """One full-length run (a rule stops it at its verdict): it fails when a rule gave an
    instability verdict other than a slow one (as the grid's ``explodes``/``borderline``);
    a crash (a trainer error, not instability) is raised as a RuntimeError."""
    final: dict[str, Any] = {}
    reporter = run_trainer(sweep, config, "probe", final.update)
    steps = int(reporter.history[-1].get("step", len(reporter.history))) \
        if reporter.history else 0
    verdict = reporter.verdict
    if final.get(STATUS_KEY) == CRASH:
        raise RuntimeError(f"the trainer crashed at {config} (not an instability): "
                           f"{verdict.summary() if verdict else 'no verdict'}")
    if verdict is None or verdict.reason in stability.SLOW_REASONS:
        return boundary.SeedRun(True, steps)
    return boundary.SeedRun(False, steps, verdict.reason, int(verdict.step))


def cmd_probe(args: Any) -> int:
    """``sweeps stability FILE --param P --probe``: flags checked, probe run, answer printed
    (plain text, or JSON with ``--format json``); 1 when the trainer crashed."""
    import json
    import sys

    from sweeps.commands.run import preflight
    from sweeps.spec.loader import load_sweep
    from sweeps.trial.tryout import _with_budget

    for flag, given in (("--values", args.values), ("--and", args.and_)):
        if given:
            raise SpecError(flag, "does not go with --probe (the probe picks its own "
                            "values, one knob only)",
                            f"drop {flag}, or drop --probe to run a grid")
    sweep = load_sweep(args.file, workdir=Path.cwd())
    if args.steps:
        sweep = _with_budget(sweep, args.steps)
    rng = probe_range(sweep, args.param, args.range)

    def echo(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    with claim(sweep.output_dir, "stability"):
        sweep = stability_sweep(sweep)
        if not args.no_preflight:
            sweep = preflight(sweep)
        try:
            result = run_probe(sweep, args.param, rng, seeds=args.seeds, echo=echo)
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    if args.format == "json":
        print(json.dumps(result.as_dict(), indent=2))
    else:
        print("\n".join([*boundary.summary(result, args.param), *boundary.probe_lines(result),
                         f"written: {sweep.output_dir / BOUNDARY_FILE}"]))
    return 0
