"""One whole sweep: search, select, confirm, export, track, report."""

from __future__ import annotations

import math
import os
import re
import shutil
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import pandas as pd

from sweeps.commands.lr_range import probe_lr_high
from sweeps.commands.preflight_step import preflight
from sweeps.errors import PreflightFailed, ProbeCrashed, SpecError
from sweeps.protocol import SEARCH, probe_role
from sweeps.record.book import TrialBook, TrialRecord, books_of, open_book
from sweeps.results import confirm as confirmation
from sweeps.results import warm_start
from sweeps.results.asha_decay import cut_before_decay
from sweeps.results.files import (
    fallback_warning,
    trials_frame,
    write_csv,
    write_front,
    write_histories,
)
from sweeps.results.front import candidates, pareto_front
from sweeps.results.race import owner_of
from sweeps.results.report import write_report
from sweeps.results.tracking import log_sweep, scrub
from sweeps.results.tracking import tracking_uri as resolve_tracking_uri
from sweeps.secrets import MASK, hide_credentials
from sweeps.spec.loader import Sweep
from sweeps.state import check as state_check
from sweeps.state import folder_lock, saved_sweep
from sweeps.state import seal as state_seal
from sweeps.state.atomic import remove_left_behind, write_text
from sweeps.state.folder_watch import watching
from sweeps.state.layout import MLFLOW_DB, SELECTION_NOTES, STUDY_FILE, TRACKING_NOTE
from sweeps.terminal import echo_stderr, shell_word
from sweeps.trial.knob_check import sweep_problem
from sweeps.trial.run import trainer_metrics
from sweeps.tune.experiments import run_configs, run_search
from sweeps.tune.searcher import fail_interrupted, study_storage
from sweeps.tune.session import check_address, ray_running


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
    tracking: str | None = None  # where MLflow has the sweep, or None when tracking failed
    tracking_error: str | None = None
    #: What the run shows about how it searched (:mod:`sweeps.results.asha_decay`).
    notes: list[str] = field(default_factory=list)


def archive_previous(out: Path) -> Path | None:
    """Move an earlier run's results aside (``<name>.<timestamp>``) instead of mixing them.

    Takes the folder first (:func:`folder_lock.claim`): a folder another command holds is
    never renamed (:class:`folder_lock.FolderInUse`), nor is one that is not a sweeps
    results folder (:class:`folder_lock.ForeignFolder`); both exit 2.
    """
    with folder_lock.claim(out, "run"):
        if not ((out / "trials").exists() or (out / "ray").exists()):
            return None
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        target = out.with_name(f"{out.name}.{stamp}")
        n = 1
        while target.exists() or target.is_symlink():
            n += 1
            target = out.with_name(f"{out.name}.{stamp}-{n}")
        return folder_lock.move_aside(out, target)


def save_resolved(sweep: Sweep) -> None:
    """A self-contained copy of the sweep (base config and space inline) for ``resume``,
    and the folder's seal over it (:mod:`sweeps.state.seal`)."""
    out = sweep.output_dir
    saved_sweep.save(sweep)
    unsealed = state_seal.seal(out)
    if unsealed:
        echo_stderr(f"warning: the results folder is not sealed ({unsealed}); `sweeps "
                "resume` of it will need --trust-state")


def load_resolved(folder: Path, project: Path | None = None) -> Sweep:
    """The sweep saved in a results folder (:func:`sweeps.state.saved_sweep.read`; its
    trials run in ``project`` when given), or exit 2 when the folder holds none."""
    _require_sweep(Path(folder).resolve())
    return saved_sweep.read(folder, project=project)


def _require_sweep(folder: Path) -> None:
    if not saved_sweep.exists(folder):
        owner = folder_lock.in_use(folder)
        if owner is not None:  # a run that has not written them yet
            raise folder_lock.FolderInUse(str(folder), f"in use by {owner}",
                                          "wait for it to finish (or stop it)")
        raise SpecError("DIR", f"{folder} holds no sweep to resume (no sweep.yaml and "
                        "sweep_state.json)", "give the results folder of a sweep, e.g. "
                        "results/direction-demo")


def run_sweep(sweep: Sweep, *, address: str | None = None, progress: bool = True,
              tracking_uri: str | None = None, check: bool = True,
              warm_from: Path | None = None) -> SweepOutcome:
    """Run ``sweep`` end to end and write everything under ``sweep.output_dir``, which it
    holds from start to end (a second command on it exits 2). ``warm_from``: an earlier
    sweep's results folder whose fitting trials seed the search (:mod:`sweeps.results.warm_start`),
    checked before anything is written and fitted to the space preflight leaves (a compile
    mode it dropped on a machine without a GPU drops the earlier trials that used it).
    ``search_space.lr.high: probe`` is set by the boundary probe after the preflight,
    before the sweep is saved and Ray starts (:func:`sweeps.commands.lr_range.probe_lr_high`)."""
    check_address(address)  # a wrong one would hang in Ray, after the folder was claimed
    warm = warm_start.load(warm_from, sweep) if warm_from is not None else None
    with folder_lock.claim(sweep.output_dir, "run"):
        moved = archive_previous(sweep.output_dir)
        if moved is not None:
            echo_stderr(f"note: the previous results of this sweep were moved to {moved}")
        state_check.refuse_symlinks(sweep.output_dir)
        try:
            if check:
                sweep = preflight(sweep)
            if sweep.lr_high_to_probe:
                sweep = probe_lr_high(sweep, quiet=not progress)
        except (PreflightFailed, ProbeCrashed) as exc:  # nothing ran: keep nothing
            back = put_back(sweep.output_dir, moved)
            if back:
                echo_stderr(f"note: {back.removeprefix('; ')}")
            if isinstance(exc, PreflightFailed):
                raise PreflightFailed(f"{exc.args[0].split(' (see ')[0]} (printed above; "
                                      "`sweeps preflight FILE` runs the checks alone and "
                                      "keeps them in preflight.md); fix them or run with "
                                      "--no-preflight") from None
            raise
        sweep.output_dir.mkdir(parents=True, exist_ok=True)
        save_resolved(sweep)
        if warm is not None:  # read again: preflight may have dropped choices of a knob
            warm = warm_start.load(warm_from, sweep)
            warm_start.seed_study(sweep, warm, study_storage(sweep))
            echo_stderr(warm.line())
        try:
            return _execute(sweep, address=address, progress=progress,
                            tracking_uri=tracking_uri, resume=False)
        except SpecError:  # bad input only trials could show: nothing of the run is kept
            discard_run(sweep.output_dir, moved)
            raise


def discard_run(out: Path, moved: Path | None) -> None:
    """Remove what a run that ended on bad input wrote (a trainer that never reports an
    objective is found only once trials ran), and put back the earlier results it had
    moved aside (``moved``), so the folder is as it was before the command."""
    ran = len(list((out / "trials").glob("*.jsonl")))
    back = put_back(out, moved)
    echo_stderr(f"note: this run's results folder was removed ({ran} trial(s) had run; "
                f"`sweeps try FILE` runs one and shows what it reports){back}")


def put_back(out: Path, moved: Path | None) -> str:
    """Remove ``out`` and move the earlier results ``moved`` aside back into it; what
    became of them, as the end of a note ("" when there were none)."""
    shutil.rmtree(out, ignore_errors=True)
    if moved is None or out.exists():
        return ""
    try:
        moved.rename(out)
    except OSError:
        return f"; the earlier results stay in {moved}"
    return f"; the earlier results are back in {out}"


def resume_sweep(folder: Path, *, address: str | None = None, progress: bool = True,
                 tracking_uri: str | None = None, trust_state: bool = False,
                 total_steps: int | None = None, project: Path | None = None,
                 tolerance: float | None = None) -> SweepOutcome:
    """Continue a sweep whose driver died: finished trials are kept, unfinished ones re-run.

    The folder's seal is checked first, touching nothing: sealed by this account for this
    very folder and writable by no other user (:mod:`sweeps.state.seal`; ``trust_state``
    vouches for it instead, and seals it once it resumed). Then the folder is held and
    every state file checked before anything runs (torn last lines of the journals cut
    off, any other damage exit 2). The folder may have been moved since its run.
    ``total_steps`` raises the sweep's step budget first (saved with the sweep): the
    candidates the budget left unsettled are settled with the steps it adds; ``project``:
    the folder its trials run in and import the trainer from, when the one it ran from
    is gone (:func:`sweeps.state.saved_sweep.read`); ``tolerance`` sets
    ``confirm.tolerance`` first (saved with the sweep), so the candidates are judged
    again against it."""
    folder = Path(folder).resolve()
    _require_sweep(folder)
    check_address(address)
    state_seal.check(folder, trust=trust_state)  # before anything in it is touched
    with folder_lock.claim(folder, "resume"):
        state_check.check_for_resume(folder, echo=echo_stderr)
        left = remove_left_behind(folder, ("trials", "stable", "stability"))
        if left:
            echo_stderr(f"note: removed {len(left)} temporary file(s) a killed write left "
                        f"(e.g. {left[0].relative_to(folder)})")
        sweep = load_resolved(folder, project)
        if project is not None:
            save_resolved(sweep)  # its trials run there from now on
        if total_steps is not None:
            sweep = with_total_steps(sweep, total_steps)
            save_resolved(sweep)  # and sealed again, over the new budget
        if tolerance is not None:
            sweep = with_tolerance(sweep, tolerance)
            save_resolved(sweep)
        if progress:
            ran = len(list((folder / "trials").glob("*.jsonl")))
            echo_stderr(f"resuming sweep '{sweep.name}' in {folder}: {ran} trial(s) recorded; "
                        "finished ones are kept, unfinished ones run again")
        logged_to = None
        if tracking_uri is None and not os.environ.get("MLFLOW_TRACKING_URI"):
            tracking_uri = earlier_tracking_uri(folder / TRACKING_NOTE)
            logged_to = _tracking_note(folder / TRACKING_NOTE)[0]
        outcome = _execute(sweep, address=address, progress=progress,
                           tracking_uri=tracking_uri, resume=True)
        if logged_to and tracking_uri and moved_store(logged_to, folder) == tracking_uri \
                and logged_to != tracking_uri:
            echo_stderr(f"note: this folder was logged to {logged_to}, its own MLflow store "
                        f"where it was then; logged to the store it carries now, {tracking_uri}")
        if trust_state:  # vouched for and resumed: this account's folder from now on
            state_seal.seal(folder)
        return outcome


def with_tolerance(sweep: Sweep, tolerance: float) -> Sweep:
    """``sweep`` with ``confirm.tolerance`` set to ``tolerance`` (above 0, else a
    SpecError naming ``--tolerance``)."""
    if not math.isfinite(tolerance) or tolerance <= 0:
        raise SpecError("--tolerance", f"{tolerance} is no gap a seed may have",
                        "give a share above 0, e.g. --tolerance 0.3 (30 % of the best "
                        "seed's improvement over the random guess)")
    confirm = sweep.spec.confirm.model_copy(update={"tolerance": tolerance})
    return replace(sweep, spec=sweep.spec.model_copy(update={"confirm": confirm}))


def with_total_steps(sweep: Sweep, total: int) -> Sweep:
    """``sweep`` with ``budget.total_steps`` raised to ``total``; a total no larger than
    the budget it had, or than the steps its trials already ran, is a SpecError."""
    from sweeps.record.journal import Journal

    budget = sweep.spec.budget
    if budget.total_steps is None:
        raise SpecError("--total-steps", f"this sweep is budgeted in trials (budget.trials: "
                        f"{budget.trials}), not steps: its search ran its trials and its "
                        "candidates were settled in full, so more steps would run nothing",
                        "run a new sweep with more trials (or a budget.total_steps), seeded "
                        "from this one: sweeps run FILE --warm-start "
                        f"{shell_word(sweep.output_dir)}")
    spent = 0
    for events in Journal(sweep.output_dir / "trials").read().values():
        steps = [p.get("step") for kind, p in events if kind == "metrics"]
        spent += max((s for s in steps if isinstance(s, (int, float))), default=0)
    floor = max(spent, budget.total_steps or 0, budget.max_steps)
    if total <= floor:
        raise SpecError("--total-steps", f"{total} is not above the {floor} steps the sweep "
                        f"already had ({spent} spent, budget.total_steps "
                        f"{budget.total_steps}, max_steps {budget.max_steps})",
                        f"give more than {floor}, e.g. {floor + budget.max_steps * 3}")
    raised = budget.model_copy(update={"total_steps": total})
    return replace(sweep, spec=sweep.spec.model_copy(update={"budget": raised}))


def rerun_again(book: TrialBook, set_aside: list[str],
                was: dict[str, tuple[str, int]]) -> list[str]:
    """Each re-run of the race (a fresh seed, a probe, the base config's) set aside as
    running when the driver died that did not come back under its own id, and what became
    of it: ``6dbc5048 (confirm:5b51c77c, seed 1) ran again from step 1 as 332b5e5f``."""
    lines = []
    for old in set_aside:
        role, seed = was[old]
        if role == SEARCH or old in book.trials:
            continue
        new = [t for t, rec in book.trials.items()
               if t not in was and rec.role == role and rec.seed == seed]
        lines.append(f"{old} ({role}, seed {seed}) "
                     + (f"ran again from step 1 as {new[0]}" if new else "did not run again"))
    return lines


def _execute(sweep: Sweep, *, address: str | None, progress: bool, tracking_uri: str | None,
             resume: bool) -> SweepOutcome:
    # Ray Tune's restored state binds to this folder, wherever it was; a folder deleted or
    # moved meanwhile stops the run (FolderGone)
    with books_of(sweep), watching(sweep.output_dir) as watch:
        book = open_book(sweep)
        roles = {t: (rec.role, rec.seed) for t, rec in book.trials.items()}
        set_aside = book.set_aside_unfinished() if resume else []
        with ray_running(address):
            run_search(sweep, book, progress=progress, resume=resume)
            replaced = [t for t in set_aside if t not in book.trials and roles[t][0] == SEARCH]
            if replaced:
                echo_stderr(
                    f"note: {len(replaced)} trial(s) running when the sweep stopped had "
                    "started after Ray Tune's last save of its state, so they did not come "
                    f"back and new samples took their place: {', '.join(replaced)} (what "
                    "they had run: trials/<id>.jsonl.interrupted)")
            inert = sweep_problem(book.trials.values(), trainer_metrics(sweep),
                                  sweep.spec.rules, sweep.objectives)
            if inert is not None:
                raise SpecError(inert.key, inert.why, inert.fix)
            if resume:
                fail_interrupted(sweep)
            search = [r for r in book.trials.values() if r.role == SEARCH]
            front = pareto_front(book, search, sweep.objectives)
            ordered = candidates(book, search, front, sweep.objectives,
                                 pruned=sweep.spec.confirm.seeds > 0)

            def rerun(runs: list[dict], name: str) -> None:
                run_configs(sweep, book, runs, name, progress=progress,
                            resume=resume and (sweep.output_dir / name).exists())

            chosen = confirmation.select(sweep, book, ordered, front, rerun)
            again = rerun_again(book, set_aside, roles)
            if again:
                echo_stderr(f"note: {len(again)} re-run(s) of the race running when the sweep "
                            f"stopped did not come back with Ray Tune's saved state: "
                            f"{'; '.join(again)} (what they had run: "
                            "trials/<id>.jsonl.interrupted)")
        watch.check()
        outcome = write_outputs(sweep, book, front, chosen, tracking_uri=tracking_uri)
    restored = saved_sweep.overwritten(sweep.output_dir)
    if restored:
        state_seal.seal(sweep.output_dir)
        echo_stderr(f"warning: {' and '.join(restored)} changed while the sweep ran (did "
                    "a trial write into its results folder?); written back as the sweep ran")
    return outcome


def fallback_lines(book: TrialBook) -> list[str]:
    """One warning per kind of eager fallback (the same reason in many trials is one line,
    with a count), instead of one line per trial."""
    by_kind: dict[str, list[str]] = {}
    for rec in book.trials.values():
        if rec.compile_fallback:
            by_kind.setdefault(fallback_warning(rec), []).append(rec.trial_id)
    return [f"{_which(ids)} {text}" for text, ids in by_kind.items()]


def _which(ids: list[str]) -> str:
    """``trial a`` or ``4 trials (a, b, c, …)``."""
    shown = ", ".join(ids[:3]) + (", …" if len(ids) > 3 else "")
    return f"trial {ids[0]}" if len(ids) == 1 else f"{len(ids)} trials ({shown})"


def warning_lines(book: TrialBook) -> list[str]:
    """One line per kind of warning the trials gave (how the trainer is wired, or a
    warning-level rule), with how many trials gave it and the first ones."""
    by_text: dict[str, list[str]] = {}
    for rec in book.trials.values():
        for given in rec.warnings:
            for part in given.split("; "):
                text = re.sub(r" at step \d+$", "", part)
                ids = by_text.setdefault(text, [])
                if rec.trial_id not in ids:
                    ids.append(rec.trial_id)
    return [f"{_which(ids)}: {text}" for text, ids in by_text.items()]


#: Relative difference of two step-1 losses of one config on one seed that says the trainer
#: does not seed from ``config["sweep"]["seed"]`` (a GPU's nondeterminism stays far below).
UNSEEDED_GAP = 1e-3


def unseeded_lines(book: TrialBook) -> list[str]:
    """A warning when a candidate and its LR probe, which run the same seed, started at
    different losses (both reported step 1, or 0): that loss comes before any update, so
    a trainer that seeds from the trial's seed starts both alike, and one that does not
    makes every per-seed result (and the hand-over's reproduction) a matter of chance."""
    for rec in book.trials.values():
        owner = owner_of(rec.role)
        cand = book.trials.get(owner) if owner and rec.role == probe_role(owner) else None
        if cand is None or cand.seed != rec.seed:
            continue
        la, lb = _start_loss(cand.history), _start_loss(rec.history)
        if la is None or lb is None or cand.history[0]["step"] != rec.history[0]["step"]:
            continue
        if abs(la - lb) > UNSEEDED_GAP * max(abs(la), abs(lb)):
            return [f"trial {cand.trial_id} and its LR probe {rec.trial_id} ran seed "
                    f"{rec.seed} and started at different losses ({la:.4g} and {lb:.4g}, "
                    "before any update): the trainer does not seed from the trial's seed; "
                    "call torch.manual_seed(config['sweep']['seed']) (and seed your data "
                    "order), else no per-seed result reproduces"]
    return []


def _start_loss(history: list[dict]) -> float | None:
    """The loss of a history's first report when that is step 1 (or 0), before any
    update, and finite; else None."""
    first = history[0] if history else {}
    loss = first.get("loss")
    if first.get("step") not in (0, 1) or not isinstance(loss, float) or \
            not math.isfinite(loss):
        return None
    return loss


def _tracking_note(note: Path) -> tuple[str | None, str | None]:
    """(the URI, the parent run) ``tracking.txt`` names: its ``MLflow:`` and ``parent
    run:`` lines (no parent run after a logging that failed); (None, None) without it."""
    try:
        lines = note.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None, None

    def field(prefix: str) -> str | None:
        return next((line.removeprefix(prefix).strip() for line in lines
                     if line.startswith(prefix)), None)

    return field("MLflow: "), field("parent run: ")


def earlier_tracking_uri(note: Path) -> str | None:
    """The tracking URI the sweep was logged to before (``tracking.txt``), so a resume
    without ``--tracking-uri`` logs to the same store; None when there is none, its
    logging failed (the note says to pass ``--tracking-uri``), or credentials of it were
    masked there (then the resume says to pass ``--tracking-uri`` again)."""
    uri, parent = _tracking_note(note)
    if parent is None:
        return None
    moved = moved_store(uri, note.parent)
    if moved != uri:  # said once the resume has run (:func:`resume_sweep`)
        return moved
    if uri and MASK in uri:
        echo_stderr(f"note: this sweep was logged to {uri} before; its credentials are not "
                    "kept on disk: pass --tracking-uri again (or set MLFLOW_TRACKING_URI) to log "
                    "there; logging to the default store instead")
        return None
    return uri or None


def logged_parent(note: Path, uri: str) -> str | None:
    """The parent run an earlier logging of this sweep to ``uri`` made (``tracking.txt``;
    a moved folder's own store counts as the one it carries now), else None."""
    logged, parent = _tracking_note(note)
    return parent if logged is not None and moved_store(logged, note.parent) == uri else None


def moved_store(uri: str | None, folder: Path) -> str | None:
    """``uri``, or, when it is the default store of a results folder at another path
    (``sqlite:///OLD/mlflow.db``) and ``folder`` carries its own ``mlflow.db``, that one:
    a moved or copied folder logs to the store that moved with it, not to the original's.

    Example:
        >>> moved_store("sqlite:////old/x/mlflow.db", Path("/nonexistent/x"))
        'sqlite:////old/x/mlflow.db'
    """
    if not uri or not uri.startswith("sqlite:///"):
        return uri
    path = Path(uri.removeprefix("sqlite:///"))
    here = folder.resolve()
    if path.name != MLFLOW_DB or path.parent == here or not (here / MLFLOW_DB).is_file():
        return uri
    return f"sqlite:///{here / MLFLOW_DB}"


def write_outputs(sweep: Sweep, book: TrialBook, front: list[TrialRecord],
                  chosen: confirmation.Selection, tracking_uri: str | None = None
                  ) -> SweepOutcome:
    """In order of value: trials.csv, per-trial histories, pareto.csv and stable/, the
    report, then MLflow. A tracking failure is a warning and a note (tracking.txt), never
    the end of the sweep: everything before it is written by then."""
    out = sweep.output_dir
    trials = trials_frame(sweep, book, chosen)
    warm = warm_start.rows(sweep, study_storage(sweep)) if (out / STUDY_FILE).exists() else []
    if warm:  # listed after this sweep's own trials; never candidates (role warm_start)
        trials = pd.concat([trials, pd.DataFrame(warm)], ignore_index=True)
    write_csv(out / "trials.csv", trials)
    write_histories(out / "trials", book)
    pareto, paths = write_front(sweep, book, chosen)
    notes = out / SELECTION_NOTES
    if chosen.notes:
        write_text(notes, "\n".join(chosen.notes) + "\n")
    elif notes.is_file():
        notes.unlink()  # a resumed sweep whose confirmation now went further
    report = write_report(out, sweep.name, [o.metric for o in sweep.objectives])
    tags = {c.trial_id: {"sweeps.selection": c.verdict,
                         "sweeps.selection_reason": (c.fragile_reason or "")[:500]}
            for c in chosen.candidates}
    for rank, conf in enumerate(chosen.handed_over, start=1):
        tags[conf.trial_id]["sweeps.pareto_rank"] = str(rank)
    full = resolve_tracking_uri(sweep, tracking_uri)
    uri, tracked, error = hide_credentials(full), None, None
    try:
        logged = log_sweep(sweep, book, tags, tracking_uri,
                           replaces=logged_parent(out / TRACKING_NOTE, uri))
        tracked = uri
        note = [f"MLflow: {uri}", f"experiment: {sweep.name}", f"parent run: {logged.run_id}"]
        note += [f"metric renamed for MLflow: {k!r} -> {v!r}"
                 for k, v in logged.renamed.items()]
    except Exception as exc:  # tracking never ends a sweep
        first = scrub((str(exc).strip().splitlines() or [""])[0][:300], full)
        error = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        echo_stderr(f"warning: MLflow tracking failed ({error}); every other output is written "
                f"(trials.csv, pareto.csv, stable/, report.html); see {out / TRACKING_NOTE}")
        note = [f"MLflow: {uri}", f"NOT LOGGED: {error}",
                "Every other output of the sweep is complete. To log it once the tracking "
                f"server is back: sweeps resume {shell_word(out)} --tracking-uri URI (runs "
                "nothing again, rewrites the outputs and logs them)"]
    write_text(out / TRACKING_NOTE, "\n".join(note) + "\n")
    warnings = [w for w in [chosen.base_warning(),
                            chosen.baseline_warning(sweep.quality_baseline)] if w]
    warnings += fallback_lines(book) + warning_lines(book) + unseeded_lines(book)
    return SweepOutcome(sweep, book, front, chosen, paths, trials, pareto, report, warnings,
                        tracking=tracked, tracking_error=error,
                        notes=[n for n in [cut_before_decay(book)] if n])
