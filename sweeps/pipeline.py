"""One whole sweep: search, select, confirm, export, track, report."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import pandas as pd
import yaml

from sweeps import confirm as confirmation
from sweeps.atomic import write_text
from sweeps.book import TrialBook, TrialRecord, close_books, open_book
from sweeps.errors import PreflightFailed, SpecError
from sweeps.ray_session import ray_running
from sweeps.report import write_report
from sweeps.results import trials_frame, write_csv, write_front, write_histories
from sweeps.runner import run_configs, run_search
from sweeps.search import fail_interrupted
from sweeps.select import candidates, pareto_front
from sweeps.spec import Sweep, load_sweep_dict, read_yaml
from sweeps.tracking import log_sweep


@dataclass
class SweepOutcome:
    """What a finished sweep produced."""

    sweep: Sweep
    book: TrialBook
    front: list[TrialRecord]
    selection: confirmation.Selection
    stable_paths: list[Path]
    trials: pd.DataFrame
    pareto: pd.DataFrame
    report: Path | None = None
    warnings: list[str] = field(default_factory=list)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def preflight(sweep: Sweep, echo: Callable[[str], None] = _stderr) -> Sweep:
    """Run the preflight checks, print and save them; raise if one is an error."""
    from sweeps.preflight import run_preflight, write_findings

    sweep, findings = run_preflight(sweep)
    sweep.output_dir.mkdir(parents=True, exist_ok=True)
    write_findings(sweep.output_dir, findings)
    for f in findings:
        echo(f"preflight {f.line()}")
    errors = [f for f in findings if f.level == "error"]
    if errors:
        raise PreflightFailed(f"preflight found {len(errors)} problem(s) that would spoil every "
                              f"trial (see {sweep.output_dir / 'preflight.md'}); fix them or "
                              "run with --no-preflight")
    return sweep


def archive_previous(out: Path) -> Path | None:
    """Move an earlier run's results aside (``<name>.<timestamp>``) instead of mixing them."""
    if not ((out / "trials").exists() or (out / "ray").exists()):
        return None
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    target = out.with_name(f"{out.name}.{stamp}")
    out.rename(target)
    return target


def save_resolved(sweep: Sweep) -> None:
    """A self-contained copy of the sweep (base config and space inline) for ``resume``."""
    data = sweep.spec.model_dump(mode="json")
    if sweep.spec.budget.trial_cap is None:  # a step budget without a trial cap stays so
        del data["budget"]["trials"]
    data["base_config"] = sweep.base_config
    data["search_space"] = {k: v.model_dump(mode="json") for k, v in sweep.space.items()}
    out = sweep.output_dir
    write_text(out / "sweep.yaml", yaml.safe_dump(data, sort_keys=False))
    write_text(out / "sweep_state.json", json.dumps({
        "source": str(sweep.source or ""), "base_dir": str(sweep.base_dir)}, indent=2))


def load_resolved(folder: Path) -> Sweep:
    """The sweep saved in a results folder, with its results going back to that folder."""
    folder = folder.resolve()
    if not (folder / "sweep.yaml").is_file() or not (folder / "sweep_state.json").is_file():
        raise SpecError("DIR", f"{folder} holds no sweep to resume (no sweep.yaml and "
                        "sweep_state.json)", "give the results folder of a sweep, e.g. "
                        "results/direction-demo")
    state = json.loads((folder / "sweep_state.json").read_text())
    data = read_yaml(folder / "sweep.yaml", "DIR/sweep.yaml")
    sweep = load_sweep_dict(data, base_dir=Path(state["base_dir"]))
    src = state.get("source")
    return replace(sweep, output_dir=folder, source=Path(src) if src else None)


def run_sweep(sweep: Sweep, *, address: str | None = None, progress: bool = True,
              tracking_uri: str | None = None, check: bool = True) -> SweepOutcome:
    """Run ``sweep`` end to end and write everything under ``sweep.output_dir``."""
    moved = archive_previous(sweep.output_dir)
    if moved is not None:
        _stderr(f"note: the previous results of this sweep were moved to {moved}")
    if check:
        sweep = preflight(sweep)
    sweep.output_dir.mkdir(parents=True, exist_ok=True)
    save_resolved(sweep)
    return _execute(sweep, address=address, progress=progress, tracking_uri=tracking_uri,
                    resume=False)


def resume_sweep(folder: Path, *, address: str | None = None, progress: bool = True,
                 tracking_uri: str | None = None) -> SweepOutcome:
    """Continue a sweep whose driver died: finished trials are kept, unfinished ones re-run."""
    return _execute(load_resolved(folder), address=address, progress=progress,
                    tracking_uri=tracking_uri, resume=True)


def _execute(sweep: Sweep, *, address: str | None, progress: bool, tracking_uri: str | None,
             resume: bool) -> SweepOutcome:
    close_books()
    book = open_book(sweep)
    if resume:
        book.set_aside_unfinished()
    try:
        with ray_running(address):
            run_search(sweep, book, progress=progress, resume=resume)
            if resume:
                fail_interrupted(sweep)
            search = [r for r in book.trials.values() if r.role == "search"]
            front = pareto_front(book, search, sweep.objectives)
            ordered = candidates(book, search, front, sweep.objectives)

            def rerun(runs: list[dict], name: str) -> None:
                run_configs(sweep, book, runs, name, progress=progress,
                            resume=resume and (sweep.output_dir / name).exists())

            chosen = confirmation.select(sweep, book, ordered, front, rerun)
        return write_outputs(sweep, book, front, chosen, tracking_uri=tracking_uri)
    finally:
        close_books()


def write_outputs(sweep: Sweep, book: TrialBook, front: list[TrialRecord],
                  chosen: confirmation.Selection, tracking_uri: str | None = None
                  ) -> SweepOutcome:
    """trials.csv, pareto.csv, stable/, per-trial histories, MLflow and the report."""
    out = sweep.output_dir
    trials = trials_frame(sweep, book, chosen)
    write_csv(out / "trials.csv", trials)
    write_histories(out / "trials", book)
    pareto, paths = write_front(sweep, book, chosen)
    tags = {c.trial_id: {"sweeps.selection": c.verdict,
                         "sweeps.selection_reason": (c.fragile_reason or "")[:500]}
            for c in chosen.candidates}
    for rank, conf in enumerate(chosen.handed_over, start=1):
        tags[conf.trial_id]["sweeps.pareto_rank"] = str(rank)
    log_sweep(sweep, book, tags, tracking_uri)
    report = write_report(out, sweep.name, [o.metric for o in sweep.objectives])
    warnings = [w for w in [chosen.base_warning()] if w]
    return SweepOutcome(sweep, book, front, chosen, paths, trials, pareto, report, warnings)
