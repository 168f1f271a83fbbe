"""One whole sweep: search, select, confirm, export, track, report."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from sweeps import confirm as confirmation
from sweeps.atomic import write_text
from sweeps.book import TrialBook, TrialRecord
from sweeps.errors import PreflightFailed
from sweeps.ray_session import ray_running
from sweeps.report import write_report
from sweeps.results import trials_frame, write_csv, write_front, write_histories
from sweeps.runner import run_configs, run_search
from sweeps.select import pareto_front
from sweeps.spec import Sweep
from sweeps.tracking import log_sweep


@dataclass
class SweepOutcome:
    """What a finished sweep produced."""

    sweep: Sweep
    book: TrialBook
    front: list[TrialRecord]
    confirmations: dict[str, confirmation.Confirmation]
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


def run_sweep(sweep: Sweep, *, address: str | None = None, progress: bool = True,
              tracking_uri: str | None = None, check: bool = True) -> SweepOutcome:
    """Run ``sweep`` end to end and write everything under ``sweep.output_dir``."""
    if check:
        sweep = preflight(sweep)
    out = sweep.output_dir
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "sweep.yaml", yaml.safe_dump(
        {"source": str(sweep.source or ""), **sweep.spec.model_dump(mode="json")},
        sort_keys=False))
    book = TrialBook(sweep)
    with ray_running(address):
        run_search(sweep, book, progress=progress)
        search = [r for r in book.trials.values() if r.role == "search"]
        front = pareto_front(book, search, sweep.objectives)
        confirmations: dict[str, confirmation.Confirmation] = {}
        runs = confirmation.plan(sweep, front)
        if runs:
            run_configs(sweep, book, runs, "confirm", progress=progress)
            confirmations = confirmation.collect(sweep, book, front)
    return write_outputs(sweep, book, front, confirmations if runs else None,
                         tracking_uri=tracking_uri)


def write_outputs(sweep: Sweep, book: TrialBook, front: list[TrialRecord],
                  confirmations: dict[str, confirmation.Confirmation] | None,
                  tracking_uri: str | None = None) -> SweepOutcome:
    """trials.csv, pareto.csv, stable/, per-trial histories, MLflow and the report."""
    out = sweep.output_dir
    trials = trials_frame(sweep, book)
    write_csv(out / "trials.csv", trials)
    write_histories(out / "trials", book)
    pareto, paths = write_front(sweep, book, front, confirmations)
    ranks = {rec.trial_id: i for i, rec in enumerate(front, start=1)}
    log_sweep(sweep, book, ranks, tracking_uri)
    report = write_report(out, sweep.name, [o.metric for o in sweep.objectives])
    return SweepOutcome(sweep, book, front, confirmations or {}, paths, trials, pareto, report)
