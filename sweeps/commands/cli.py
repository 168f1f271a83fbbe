"""Command line: ``sweeps COMMAND`` (run, resume, best, try, stability, preflight, report,
audit, validate, submit, jobs, slurm; ``sweeps --help`` lists them)."""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from sweeps.cluster.jobs import add_commands as add_cluster_commands
from sweeps.cluster.slurm import add_commands as add_slurm_commands
from sweeps.commands.audit import add_commands as add_audit_commands
from sweeps.errors import (
    ClusterNotReady,
    PreflightFailed,
    ProbeCrashed,
    RayNotStarted,
    SpecError,
    Terminated,
)
from sweeps.protocol import (
    BASE_NOT_COMPARED,
    CRASH,
    NOT_TOLD_APART,
    OK,
    PRUNED,
    RAY_JOB_ENV,
    SEARCH,
    SLURM_DRIVER_ENV,
    objective_column,
)
from sweeps.state.folder_watch import FolderGone, clear_remnant
from sweeps.terminal import clean, echo, flagged, shell_word
from sweeps.terminal import console as make_console

#: Every string printed here may hold text from a trainer, a knob or a results folder:
#: these consoles print it as text, cleaned of escape codes (:mod:`sweeps.terminal`).
console = make_console()
err_console = make_console(stderr=True)


def none_held(book: Any, chosen: Any, grace: int | None = None) -> str:
    """Why nothing was handed over: the candidates failed their fresh seeds, or no search
    trial ended ok (and, when most sat at the random guess, what to check: a slow start
    ASHA cut at ``grace``, its first rung, or the labels)."""
    if chosen.candidates:
        return "no candidate held on every fresh seed"
    search = [r for r in book.trials.values() if r.role == SEARCH and r.finished]
    if any(r.status == OK for r in search):
        return "no search trial learnt enough to race on a fresh seed"
    def why_of(r: Any) -> str:
        return r.reason or (r.diagnosis or {}).get("reason") or r.status

    why = Counter(why_of(r) for r in search)
    text = "no search trial ended ok (" + ", ".join(f"{n} {k}" for k, n in why.most_common()) + ")"
    flat = [r for r in search if why_of(r) == "flat_at_baseline"]
    if not search or 2 * len(flat) < len(search):  # the rest cut or stopped before they showed
        return text
    every = "every one" if len(flat) == len(search) else f"{len(flat)} of {len(search)}"
    cut = [r for r in flat if r.status == PRUNED]
    if grace is not None and 2 * len(cut) > len(flat):
        last = max(r.last_step for r in cut)
        return text + (f"; {every} sat at the random guess, {len(cut)} of them cut by ASHA "
                       f"by step {last} (budget.grace_steps {grace} after each trial's "
                       "warmup): a model that "
                       "leaves the random guess later than that was never given the steps to "
                       f"show it. Raise budget.grace_steps past where `sweeps try FILE` shows "
                       "your loss leaving the random guess (or budget.scheduler: none); if it "
                       "never leaves it, check that the labels reach the loss")
    return text + (f"; {every} sat at the random guess, so nothing was learnt at any setting: "
                   "check that the labels reach the loss and belong to their inputs, and that "
                   "rules.baseline_loss is the random guess of your data")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.4g}"
    return "" if v is None else str(v)


def cmd_validate(args: argparse.Namespace) -> int:
    from sweeps.spec.loader import load_sweep

    sweep = load_sweep(args.file, workdir=Path.cwd())
    grouped = sweep.grouped
    knobs = ", ".join(f"{k} ({v.type}" + (f": Hydra config group {grouped[k]}" if k in grouped
                                          else "") + ")"
                      for k, v in sweep.space.items())  # the type as the sweep file writes it
    console.print(f"{args.file}: valid. sweep '{sweep.name}', trainer {sweep.spec.trainer}")
    console.print(f"  knobs: {knobs}")
    console.print("  objectives: " + ", ".join(f"{o.metric} ({o.mode})"
                                                for o in sweep.objectives))
    console.print(f"  results go to {sweep.output_dir}")
    for note in sweep.notes:
        console.print(f"  note: {note}")
    return 0


def cmd_try(args: argparse.Namespace) -> int:
    from sweeps.spec.loader import load_sweep
    from sweeps.trial.tryout import lr_not_followed, parse_sets, try_trial, try_values
    from sweeps.trial.wiring import (
        WARMUP_NEVER_RAN_FIX,
        grad_norms_all_zero,
        warmup_never_ran,
        zero_norm_cause,
    )

    sweep = load_sweep(args.file, workdir=Path.cwd())
    sets = parse_sets(args.set or [])
    rec = try_trial(sweep, sets, steps=args.steps, seed=args.seed, every=args.print_every,
                    console=console)
    values = try_values(sweep, sets)
    if lr_not_followed(values.get("lr"), rec.history):
        return 2
    never = warmup_never_ran(values.get("warmup"), rec.history)
    if never:
        raise SpecError("write_back.warmup", never, WARMUP_NEVER_RAN_FIX)
    if grad_norms_all_zero(rec.history):
        problem, fix = zero_norm_cause(rec.history)
        raise SpecError("trainer", f"{problem}; the rules would judge a gradient that "
                        "trains nothing", fix)
    if rec.verdict is not None and rec.verdict.reason == "bad_metric":
        from sweeps.trial.run import unreported

        metric = str(rec.verdict.evidence.get("metric"))
        index = next((i for i, o in enumerate(sweep.objectives) if o.metric == metric), 0)
        raise SpecError(f"objectives.{index}.metric", *unreported(
            metric, rec.history, [o.metric for o in sweep.objectives]))
    return 0 if rec.verdict is None else 1


def cmd_run(args: argparse.Namespace) -> int:
    from sweeps.commands.run import run_sweep
    from sweeps.spec.loader import load_sweep

    sweep = load_sweep(args.file, workdir=Path.cwd(), output=args.output)
    for note in sweep.notes:
        err_console.print(f"note: {note}")
    outcome = run_sweep(sweep, address=args.address, progress=not args.quiet,
                        tracking_uri=args.tracking_uri, check=not args.no_preflight,
                        warm_from=Path(args.warm_start) if args.warm_start else None)
    print_outcome(outcome)
    return all_crashed(outcome.trials, sweep.output_dir)


def all_crashed(trials, folder: Path) -> int:
    """1, with the first traceback's path, when every search trial crashed (the trainer
    raised: an error to fix, not a result), or when every re-run on a fresh seed or at the
    LR probe (at least 2) crashed before its first step (the workers could not run them,
    and the candidates' verdicts rest on nothing); else 0."""
    import pandas as pd

    from sweeps.results.race import owner_of

    search = trials[trials["role"] == SEARCH] if len(trials) else trials
    reruns = trials[trials["role"].map(lambda r: owner_of(str(r)) is not None)] \
        if len(trials) else trials
    if len(reruns) >= 2 and (reruns["status"] == CRASH).all() and \
            (pd.to_numeric(reruns["stop_step"], errors="coerce").fillna(0) == 0).all():
        first = reruns.iloc[0]
        err_console.print(f"error: every re-run on a fresh seed or at the LR probe crashed "
                          f"before its first step ({len(reruns)}); the first: "
                          f"{first['reason']} {first.get('evidence') or ''}: the verdicts "
                          "of the candidates rest on no run; fix what kept the workers "
                          "from running them (on a cluster: its logs) and run again")
        return 1
    if not len(search) or not (search["status"] == CRASH).all():
        return 0
    first = search.iloc[0]
    path = folder / "trials" / f"{first['trial_id']}.error.txt"
    where = f"; traceback: {path}" if path.exists() else ""
    err_console.print(f"error: every search trial crashed ({len(search)}); the first: "
                      f"{first['reason']} {first.get('evidence') or ''}{where}")
    return 1


def cmd_stability(args: argparse.Namespace) -> int:
    from sweeps.commands.preflight_step import preflight
    from sweeps.commands.stability import FOLDER, held_knobs, run_stability, stability_sweep
    from sweeps.results import stability
    from sweeps.spec.loader import load_sweep
    from sweeps.trial.tryout import _with_budget

    if args.probe:
        from sweeps.commands.stability import cmd_probe

        return cmd_probe(args)
    for flag, given in (("--verify", args.verify), ("--no-sharpness", args.no_sharpness)):
        if given:
            raise SpecError(flag, "goes with --probe only (the grid runs every value in full)",
                            f"add --probe, or drop {flag}")
    for flag, given in (("--seeds", args.seeds), ("--steps", args.steps)):
        if given is not None and given < 1:
            raise SpecError(flag, f"{given} is below 1", f"give e.g. {flag} 3")
    sweep = load_sweep(args.file, workdir=Path.cwd())
    held = held_knobs(sweep, args.set or [], args.param, args.and_)
    if args.steps:
        sweep = _with_budget(sweep, args.steps)
    if bool(args.values) == bool(args.range):
        raise SpecError("--values/--range", "give exactly one of them",
                        "e.g. --values 1e-4,1e-3,1e-2 or --range 1e-5:1e-1 --points 9")
    if args.values:
        values = stability.parse_values(args.values)
    else:
        low, sep, high = args.range.partition(":")
        try:
            values = stability.log_range(float(low), float(high), args.points)
        except ValueError as exc:
            raise SpecError("--range", f"{args.range!r} is not 0 < LOW <= HIGH ({exc})",
                            "write e.g. --range 1e-5:1e-1") from None
        if not sep or float(low) <= 0 or float(high) < float(low):
            raise SpecError("--range", f"{args.range!r} is not 0 < LOW <= HIGH",
                            "write e.g. --range 1e-5:1e-1")
    second = None
    if args.and_:
        name, sep, rest = args.and_.partition("=")
        if not sep:
            raise SpecError("--and", f"{args.and_!r} is not NAME=v1,v2",
                            "write e.g. --and grad_clip=0,1,5")
        second = (name.strip(), stability.parse_values(rest))
    from sweeps.commands.stability import check_grid
    from sweeps.state.folder_lock import claim
    from sweeps.tune.session import check_address

    check_grid(sweep, args.param, values, second)  # bad input: exit 2, nothing written
    check_address(args.address)
    # the sweep's results folder is held from the preflight to the last file (a `sweeps
    # run` of it waits); the stability files go to its own subfolder
    with claim(sweep.output_dir, "stability"):
        sweep = stability_sweep(sweep)
        if not args.no_preflight:
            sweep = preflight(sweep)
        result = run_stability(sweep, args.param, values, seeds=args.seeds, second=second,
                               address=args.address, progress=not args.quiet, fixed=held)
    shown = result.table if result.display is None else result.display
    table = Table(title=f"Stability of '{sweep.name}'")
    for col in shown.columns:
        table.add_column(str(col), overflow="fold")
    for _, row in shown.iterrows():
        table.add_row(*[_fmt(v) for v in row])
    console.print(table)
    console.print(result.quality_note)
    console.print(f"boundary: {result.boundary_text}")
    console.print(f"recommended {args.param}: {stability.label((result.recommended,))} "
                  f"({result.why})")
    console.print(result.clip_line)
    for w in result.warnings:
        console.print(f"warning: {w}")
    console.print("written: " + ", ".join(str(f) for f in result.files))
    crashed = result.table[result.table["verdict"] == "crashed"] if len(result.table) \
        else result.table
    if len(crashed):
        names = [c for c in (args.param, second[0] if second else None) if c]
        where = "every grid point" if len(crashed) == len(result.table) else "; ".join(
            ", ".join(f"{n}={_fmt(row[n])}" for n in names) for _, row in crashed.iterrows())
        err_console.print(f"error: the trainer crashed on every seed at {where} (an error to "
                          "fix, not an instability): see the tracebacks in "
                          f"{sweep.output_dir / FOLDER}/*.error.txt")
        return 1
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from sweeps.commands.run import resume_sweep

    outcome = resume_sweep(Path(args.dir), address=args.address, progress=not args.quiet,
                           tracking_uri=args.tracking_uri, trust_state=args.trust_state,
                           total_steps=args.total_steps, tolerance=args.tolerance,
                           project=Path(args.project) if args.project else None)
    print_outcome(outcome)
    return all_crashed(outcome.trials, outcome.sweep.output_dir)


def cmd_best(args: argparse.Namespace) -> int:
    from sweeps.results.export import handed_over, header_lines, worse_than_base

    folder = Path(args.dir)
    files = handed_over(folder / "stable")
    if not folder.is_dir():
        raise SpecError("DIR", f"no results folder at {folder}", "give e.g. results/<name>")
    if not files:
        echo(f"no confirmed stable config in {folder / 'stable'}", file=sys.stderr)
        return 1
    for line in header_lines(files[0]):  # the header says if it is unconfirmed or worse
        if "UNCONFIRMED" in line or line.startswith("WARNING"):
            echo(f"warning: {line}", file=sys.stderr)
        elif line.startswith("your base config:") or BASE_NOT_COMPARED in line or \
                NOT_TOLD_APART in line:  # it is what you have, it failed, or it is as good
            echo(f"note: {line}", file=sys.stderr)
    if worse_than_base(files[0]) and not args.allow_worse:
        echo(f"not printing {files[0]}: the sweep measured it worse than your base config "
             "on the same fresh seeds; keep your base config, or pass --allow-worse to get "
             "its path anyway", file=sys.stderr)
        return 1
    if args.flags:  # a script that takes its settings as argparse options
        return _print_flags(folder, files[0], args.flags)
    if args.overrides:  # a Hydra app takes the knob values as command-line overrides
        listed = files[0].with_suffix(".overrides").read_text(encoding="utf-8").splitlines()
        echo("\n".join(listed))  # a value of the user's: no terminal controls
        if any(len(o.split()) > 1 for o in listed):
            echo("note: a value holds whitespace, which $(...) would split: pass the lines as "
                 "they are, e.g. mapfile -t o < <(sweeps best DIR --overrides); "
                 'python app.py "${o[@]}"', file=sys.stderr)
        return 0
    print(files[0])
    return 0


def _print_flags(folder: Path, path: Path, how: str) -> int:
    """``sweeps best DIR --flags [keys|dashes]``: the hand-over as ``--key=value`` lines,
    spelt as the trainer module's argparse parser spells its options when it holds one
    (``how`` unset), else as the write-back keys (``dashes``: their ``_`` as ``-``)."""
    from sweeps.results.export import flag_lines, parser_options
    from sweeps.spec.loader import read_json, read_yaml
    from sweeps.state import saved_sweep

    sweep = saved_sweep.read(folder, import_trainer=False)
    key = f"DIR/stable/{path.name}"  # a damaged hand-over: one line naming it, exit 2
    config = read_json(path, key) if path.suffix == ".json" else read_yaml(path, key)
    options = parser_options(sweep) if how == "auto" else {}
    lines, skipped = flag_lines(sweep, config, how == "dashes", options)
    echo("\n".join(lines))  # a value of the user's: no terminal controls
    if skipped:
        echo(f"note: left out {', '.join(skipped)}: no number, text or bool to pass as a "
             "flag", file=sys.stderr)
    if sweep.grouped:
        echo("note: knobs that pick a Hydra config group's option are not flags: use "
             "--overrides", file=sys.stderr)
    if any(len(line.split()) > 1 for line in lines):
        echo("note: a value holds whitespace, which $(...) would split: pass the lines as "
             "they are, e.g. mapfile -t f < <(sweeps best DIR --flags); "
             'python train.py "${f[@]}"', file=sys.stderr)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    import json

    from sweeps.results.folder_data import load
    from sweeps.results.report import write_report
    from sweeps.results.summary import summary_of
    from sweeps.state.check import check_for_report

    folder = Path(args.dir)
    if not (folder / "trials.csv").is_file():
        raise SpecError("DIR", f"{folder} holds no finished sweep (no trials.csv)",
                        "give the results folder of a sweep, e.g. results/direction-demo")
    check_for_report(folder)  # a cut or garbled trials.csv: exit 2 before anything is written
    if args.format == "json":
        print(json.dumps(summary_of(load(folder)), indent=2, default=str))
        return 0
    if args.format == "csv":
        sys.stdout.write(clean((folder / "trials.csv").read_text()))  # no escape codes
        return 0
    pairs = []
    for pair in args.pair or []:
        a, sep, b = pair.partition(",")
        if not sep:
            raise SpecError("--pair", f"{pair!r} is not KNOB,KNOB", "write e.g. lr,dropout")
        pairs.append((a.strip(), b.strip()))
    loaded = load(folder)  # read and summarised once, for the report and the lines below
    info = summary_of(loaded)
    page = write_report(folder, pairs=pairs or None, loaded=loaded, info=info)
    console.print(f"sweep {info['name']}: {info['search_trials']} search trials: " + ", ".join(
        f"{k} {v}" for k, v in info["counts"].items()))
    if info["failures"]:
        console.print("failure reasons: " + ", ".join(
            f"{k} {v}" for k, v in info["failures"].items()))
    if info["selection"]:
        console.print("candidates on fresh seeds: " + ", ".join(
            f"{k} {v}" for k, v in info["selection"].items()))
    for trial_id, why in info["fragile"].items():
        console.print(f"  not handed over {trial_id}: {why}")
    console.print(f"best stable config: {info['best_yaml'] or 'none'}")
    if info["worse_than_base"]:
        console.print(f"WARNING: {info['worse_than_base']}")
    console.print(f"report: {page}")
    return 0


def cmd_preflight(args: argparse.Namespace) -> int:
    from sweeps.commands.preflight_step import preflight
    from sweeps.spec.loader import load_sweep

    sweep = preflight(load_sweep(args.file, workdir=Path.cwd()))
    console.print(f"preflight passed; findings saved in {sweep.output_dir / 'preflight.md'}")
    return 0


def print_outcome(outcome) -> None:
    """The end-of-run summary: the trials table on a terminal, a compact list that fits 80
    columns elsewhere (a log file, nohup, SLURM's output file); then the selection."""
    if console.is_terminal:
        print_trials_table(outcome)
    else:
        print_top_trials(outcome)
    print_counts_and_selection(outcome)


#: Search trials the compact summary lists.
TOP_TRIALS = 5


def print_top_trials(outcome) -> None:
    """The best ``ok`` search trials, each on two lines of at most 80 columns."""
    import textwrap

    sweep, trials = outcome.sweep, outcome.trials
    first = sweep.objectives[0]
    col = objective_column(first.metric)
    ok = trials[(trials["role"] == SEARCH) & (trials["status"] == OK)]
    if col in ok:
        ok = ok.sort_values(col, ascending=first.mode == "min")
    console.print(f"top search trials by {first.metric} ({len(ok)} ok; every trial is in "
                  "trials.csv):")
    for _, row in ok.head(TOP_TRIALS).iterrows():
        console.print(f"  {row['trial_id']}  {first.metric} {_fmt(row.get(col))}")
        knobs = " ".join(f"{k}={_fmt(row.get(k))}" for k in sweep.space)
        for line in textwrap.wrap(knobs, width=74):
            console.print(f"      {line}")


def print_trials_table(outcome) -> None:
    sweep, trials = outcome.sweep, outcome.trials
    table = Table(title=f"Trials of sweep '{sweep.name}'")
    objs = [objective_column(o.metric) for o in sweep.objectives]
    for col in ["trial", "role", "status", "reason @ step", *sweep.space, *[
            o.metric for o in sweep.objectives]]:
        table.add_column(col)
    for _, row in trials.iterrows():
        why = f"{row['reason']} @ {int(row['stop_step'])}" if row["reason"] else ""
        table.add_row(row["trial_id"], row["role"], row["status"], why,
                      *[_fmt(row.get(k)) for k in sweep.space], *[_fmt(row.get(c)) for c in objs])
    console.print(table)


def print_counts_and_selection(outcome) -> None:
    sweep, trials = outcome.sweep, outcome.trials
    search = trials[trials["role"] == SEARCH]
    counts = search["status"].value_counts().to_dict()
    lr = sweep.space.get("lr")
    if getattr(lr, "probed", None) is not None:
        console.print(lr.probed.line(lr.low))
    console.print("search: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    reasons = search[search["reason"] != ""]["reason"].value_counts().to_dict()
    if reasons:
        console.print("failure reasons: " + ", ".join(f"{k} {v}" for k, v in reasons.items()))
    print_selection(outcome)
    out = sweep.output_dir
    console.print(f"trials: {out / 'trials.csv'}  report: {outcome.report}")
    tracked = getattr(outcome, "tracking", None)
    if tracked and tracked.startswith("sqlite:"):
        console.print(f"MLflow: mlflow ui --backend-store-uri {shell_word(tracked)}")
    elif tracked:
        console.print(f"MLflow: {tracked} (experiment {sweep.name})")
    else:
        console.print(f"MLflow: NOT LOGGED ({getattr(outcome, 'tracking_error', None)}); "
                      f"see {out / 'tracking.txt'}")


def print_selection(outcome) -> None:
    """Candidates judged, why any were fragile, the steps spent, what went to stable/."""
    chosen = outcome.selection
    metric = outcome.sweep.objectives[0].metric
    verdicts = Counter(c.verdict for c in chosen.candidates)
    judged = {c.trial_id for c in chosen.candidates}
    unjudged = [r.trial_id for r in outcome.front if r.trial_id not in judged]
    why = "the step budget ended first (see the note below)" if chosen.budget_ended else \
        "the race takes the best confirm.keep by quality"
    left = (f" ({len(unjudged)} of the front not judged: {why}; {', '.join(unjudged[:3])}"
            f"{', …' if len(unjudged) > 3 else ''} in trials.csv)") if unjudged else ""
    console.print(f"Pareto front: {len(outcome.front)} trial(s){left}; "
                  f"{len(chosen.candidates)} candidate(s) judged on fresh seeds: "
                  + (", ".join(f"{n} {v}" for v, n in verdicts.items()) or "none"))
    fixed = ", ".join(f"{k}={v}" for k, v in outcome.sweep.fixed_changes.items())
    yours = f" (your base config{f' with {fixed}' if fixed else ''})"
    for conf in chosen.fragile:
        own = yours if conf.trial_id == chosen.base_id else ""
        console.print(f"  {conf.verdict} {conf.trial_id}{own}: {conf.fragile_reason}")
    console.print("steps: " + ", ".join(f"{k} {v}" for k, v in chosen.steps.items() if v))
    for note in chosen.notes:
        console.print(f"note: {note}")
    kind = "confirmed" if any(c.confirmed for c in chosen.handed_over) or \
        not outcome.stable_paths else "UNCONFIRMED"
    paired = any(c.shared_mean is not None for c in chosen.handed_over)
    if outcome.stable_paths:
        console.print(f"{len(outcome.stable_paths)} {kind} stable config(s) written, best "
                      f"first (mean {metric} over fresh seeds"
                      + (", ranked on the fresh seeds every one of them ran" if paired else "")
                      + "; worst seed of every seed run, the search's included unless it was "
                      "cut short):")
    for conf, path in zip(chosen.handed_over, outcome.stable_paths, strict=False):
        mean = "-" if conf.mean is None else f"{conf.mean:.4g}"
        if conf.shared_mean is not None:
            mean += (f" over {len(conf.fresh_quality)} fresh seeds, {conf.shared_mean:.4g} "
                     f"on seeds {', '.join(map(str, conf.shared_seeds))}")
        worst = "-" if conf.worst is None else f"{conf.worst:.4g}"
        own = (f", your base config{f' with {fixed}' if fixed else ''}"
               if conf.trial_id == chosen.base_id else "")
        console.print(f"  {path}  ({metric} mean {mean}, worst seed {worst}{own})")
    if not outcome.stable_paths:
        budget = outcome.sweep.spec.budget
        grace = budget.asha_grace if budget.scheduler == "asha" else None
        console.print(f"No stable config written: {none_held(outcome.book, chosen, grace)}")
    if chosen.base is not None and chosen.base.mean is not None:
        console.print(f"base config: {chosen.base.summary()}")
    unjudged_base = chosen.base.not_compared() if chosen.base is not None else None
    if unjudged_base and chosen.base_id not in judged and outcome.stable_paths:
        console.print(f"note: {unjudged_base} (trial {chosen.base_id}, the search's first; "
                      "`sweeps try FILE` shows why)")
    if chosen.base_line():
        console.print(f"note: {chosen.base_line()}")
    tie = chosen.base_tie()
    if tie:
        console.print(f"note: {tie}")
    for note in getattr(outcome, "notes", []):
        console.print(f"note: {note}")
    for warning in outcome.warnings:
        console.print(flagged("WARNING", f": {warning}"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sweeps", description="Hyperparameter search and stability sweeps for PyTorch "
        "training. Every command is listed below; sweeps COMMAND --help for its options.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a sweep: search, confirm, write stable YAMLs")
    p.add_argument("file", help="sweep file (YAML)")
    p.add_argument("--address", default=None,
                   help="Ray cluster address (auto, ray://HOST:10001); default: embedded Ray")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default: MLFLOW_TRACKING_URI or "
                        "sqlite in the results folder)")
    p.add_argument("--quiet", action="store_true", help="no per-trial progress lines")
    p.add_argument("--output", "--storage", dest="output", default=None,
                   help="results root folder (overrides the sweep file's output:); on a "
                        "cluster, a path every node and the driver can reach")
    p.add_argument("--no-preflight", action="store_true",
                   help="skip the checks of compile modes, LR schedule and input scale")
    p.add_argument("--warm-start", metavar="DIR", default=None,
                   help="seed the search with the finished trials of an earlier sweep's "
                   "results folder whose knobs fit this space (they are not run again)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("resume", help="continue a sweep whose driver died")
    p.add_argument("dir", help="the sweep's results folder, e.g. results/direction-demo")
    p.add_argument("--address", default=None)
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--trust-state", action="store_true",
                   help="resume a folder this account's sweeps did not write (or that other "
                   "users can write); its Ray Tune state is loaded like code")
    p.add_argument("--total-steps", type=int, default=None, metavar="N",
                   help="raise budget.total_steps to N first: the candidates the budget left "
                   "unsettled are settled with what it adds")
    p.add_argument("--project", default=None, metavar="PATH",
                   help="the folder the trials run in and import the trainer from, when the "
                   "one the sweep ran from is gone (a Ray job's temporary working_dir) or "
                   "moved; kept for later resumes")
    p.add_argument("--tolerance", type=float, default=None, metavar="X",
                   help="set confirm.tolerance to X first: the candidates are judged again "
                   "against it (a wider one accepts seeds that disagree more)")
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("report", help="(re)write report.html, or print the results as json/csv")
    p.add_argument("dir", help="the sweep's results folder")
    p.add_argument("--format", choices=["html", "json", "csv"], default="html")
    p.add_argument("--pair", action="append", metavar="KNOB,KNOB",
                   help="an extra stability-map pair, e.g. lr,dropout; repeatable")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("best", help="print the path of the top confirmed stable YAML")
    p.add_argument("dir", help="the sweep's results folder")
    p.add_argument("--allow-worse", action="store_true",
                   help="print the path even when the sweep measured that config worse than "
                   "your base config on fresh seeds (otherwise exit 1)")
    p.add_argument("--overrides", action="store_true",
                   help="print its values as Hydra command-line overrides instead, one a "
                   "line (python app.py $(sweeps best DIR --overrides))")
    p.add_argument("--flags", nargs="?", const="auto", choices=("auto", "keys", "dashes"),
                   help="print its values as command-line flags instead, --key=value one a "
                   "line, for a script that takes argparse options (python train.py "
                   "$(sweeps best DIR --flags)), spelt as the trainer module's argparse "
                   "parser spells them when it holds one; 'keys': the write_back keys; "
                   "'dashes': their _ as -")
    p.set_defaults(func=cmd_best)

    p = sub.add_parser("stability", help="grid over one knob (x a second) on several seeds")
    p.add_argument("file")
    p.add_argument("--param", required=True, help="the knob to grid over, e.g. lr")
    p.add_argument("--values", help="comma-separated values, e.g. 1e-5,1e-4,1e-3")
    p.add_argument("--range", help="LOW:HIGH, spaced in log scale (with --points)")
    p.add_argument("--points", type=int, default=9)
    p.add_argument("--and", dest="and_", metavar="KNOB=V1,V2", help="a second knob to cross")
    p.add_argument("--set", action="append", metavar="KNOB=VALUE",
                   help="hold a knob at this value in every run (e.g. a hand-over's) "
                   "instead of the base config's; repeatable")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="steps per run (default: budget)")
    p.add_argument("--address", default=None)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--no-preflight", action="store_true")
    p.add_argument("--probe", action="store_true", help="search the boundary adaptively "
                   "(bracket, then bisection to 1.25x) instead of a grid; --range bounds it")
    p.add_argument("--format", choices=["text", "json"], default="text",
                   help="with --probe: the answer as text or JSON")
    p.add_argument("--verify", action="store_true", help="with --probe: then full-length "
                   "runs (budget.max_steps) at both ends of the interval on the probe seeds")
    p.add_argument("--no-sharpness", action="store_true", help="with --probe: start the "
                   "bracket at the base config's LR, not at the loss_closure prediction")
    p.set_defaults(func=cmd_stability)

    p = sub.add_parser("preflight", help="check compile modes, the LR schedule and input scale")
    p.add_argument("file")
    p.set_defaults(func=cmd_preflight)

    p = sub.add_parser("try", help="run one trial in-process without Ray, print metrics")
    p.add_argument("file")
    p.add_argument("--set", action="append", metavar="KNOB=VALUE",
                   help="knob value (or dotted config path); repeatable")
    p.add_argument("--steps", type=int, default=None, help="max steps (default: budget)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--print-every", type=int, default=25)
    p.set_defaults(func=cmd_try)

    p = sub.add_parser("validate", help="check a sweep file without running anything")
    p.add_argument("file")
    p.set_defaults(func=cmd_validate)

    add_cluster_commands(sub)
    add_slurm_commands(sub)
    add_audit_commands(sub)
    for name in ("run", "resume", "stability", "preflight"):
        sub.choices[name].add_argument(
            "--allow-shared-folder", action="store_true",
            help="use a results folder (or root) another user owns or can write; they could "
            "replace what it hands over")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from sweeps.state import folder_lock

    folder_lock.allow_shared(bool(getattr(args, "allow_shared_folder", False)))
    before = _exit_on_sigterm(args)
    try:
        return args.func(args)
    except SystemExit as exc:
        if exc.code != signal.SIGTERM and not _TERMINATED:
            raise  # (Ray's wait turns the handler's exit into a SystemExit(1))
        _say_terminated(args)  # unless the handler did: Ray's own ended it in ray.init
        return 128 + signal.SIGTERM
    except SpecError as exc:
        echo(f"error: {exc.key}: {exc.problem}.\n  fix: {exc.fix}", file=sys.stderr)
        return SpecError.exit_code
    except (PreflightFailed, ClusterNotReady, ProbeCrashed, RayNotStarted) as exc:
        echo(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except FolderGone as exc:
        echo(f"error: {exc}", file=sys.stderr)
        clear_remnant(exc.folder)  # what the sweep wrote there since: run or resume may go on
        return exc.exit_code
    except KeyboardInterrupt:
        err_console.print(interrupted_line(args))
        return 130
    except Exception as exc:
        import errno

        from sweeps.state.disk_full import message, no_room

        if isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            echo(f"error: {exc.filename or _folder_of(args)}: cannot write there "
                 f"({exc.strerror}).\n  fix: give a results folder you own and can write to "
                 "(--output DIR, or output: in the sweep file), or make this one writable",
                 file=sys.stderr)
            return SpecError.exit_code
        full = no_room(exc)
        if full is None:
            raise
        echo(message(full, _folder_of(args)), file=sys.stderr)
        return 1
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)


def _exit_on_sigterm(args: argparse.Namespace) -> Any:
    """SIGTERM (a scheduler's, a user's or ``ray job stop``'s kill) ends the command as
    Ray's driver handler does, by a ``SystemExit(SIGTERM)`` (:class:`Terminated`, which a
    trainer in this process cannot take for its own ``sys.exit``), after saying at once how to
    continue (a Ray job's driver is killed for good a few seconds after the SIGTERM, before
    the sweep has wound down); the handler it replaced is returned (None off the main
    thread: nothing is changed)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    _TERMINATED.clear()

    def terminated(signum: int, _frame: Any) -> None:
        _say_terminated(args)
        raise Terminated(signum)

    return signal.signal(signal.SIGTERM, terminated)


_TERMINATED: list[bool] = []  # SIGTERM reached this command and it said how to continue


def _say_terminated(args: argparse.Namespace) -> None:
    """Say once how to continue after SIGTERM: as after Ctrl-C."""
    if not _TERMINATED:
        _TERMINATED.append(True)
        line = interrupted_line(args)
        sys.stderr.write("terminated" + line.removeprefix("interrupted") + "\n")
        sys.stderr.flush()


def interrupted_line(args: argparse.Namespace) -> str:
    """What an interrupted command prints: for a sweep, how to continue it (cleaned: the
    SIGTERM handler writes it to stderr as it is)."""
    if getattr(args, "func", None) not in (cmd_run, cmd_resume):
        return "interrupted"
    folder = _folder_of(args)
    if folder is None or not (folder / "sweep.yaml").is_file():
        return "interrupted"
    if os.environ.get(SLURM_DRIVER_ENV):  # its Ray cluster ends with the SLURM job
        return clean(f"interrupted: `sweeps slurm --resume {shell_word(folder)}` (the same "
                     "options as this job) continues where it stopped in a new job")
    address = getattr(args, "address", None)
    if address is None and os.environ.get(RAY_JOB_ENV):  # a Ray job's driver
        address = os.environ.get("RAY_ADDRESS")  # the cluster's GCS address
    where = f" --address {shell_word(address)}" if address not in (None, "auto", "local") \
        else ""
    return clean(f"interrupted: `sweeps resume {shell_word(folder)}{where}` continues "
                 "where it stopped")  # a folder's name is text: no escape sequence in it


def _folder_of(args: argparse.Namespace) -> Path | None:
    """The results folder a command works on: DIR, or the sweep file's output folder."""
    if getattr(args, "dir", None):
        return Path(args.dir)
    if getattr(args, "file", None):
        from sweeps.spec.loader import load_sweep

        try:
            return load_sweep(args.file, workdir=Path.cwd(), import_trainer=False,
                              output=getattr(args, "output", None)).output_dir
        except (SpecError, OSError):
            return None
    return None


if __name__ == "__main__":
    sys.exit(main())
