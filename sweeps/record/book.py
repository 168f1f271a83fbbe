"""Driver-side record of every trial: history, outcome, objective values. No Ray here.

Ray Tune's hooks (:mod:`sweeps.tune.callbacks`, the schedulers in :mod:`sweeps.tune.schedulers`, the
searcher) read and write one :class:`TrialBook` per results folder, handed out by
:func:`open_book` inside a :func:`books_of` block. Only the driver writes files and
tracking data.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sweeps import rules
from sweeps.protocol import (
    COMPILE_KEY,
    CRASH,
    EVIDENCE_KEY,
    FAILED,
    FINAL_KEY,
    FLAT_PATIENCE_KEY,
    GPU_PEAK_KEY,
    LR_SCALE_KEY,
    OK,
    PRUNED,
    REASON_KEY,
    RESULT_PREFIX,
    ROLE_KEY,
    RUNNING,
    SEARCH,
    SEED_KEY,
    STATUS_KEY,
    STOP_STEP_KEY,
    TRACEBACK_KEY,
    UNSTABLE,
    WARNING_KEY,
    confirm_role,
)
from sweeps.record import objectives
from sweeps.record.journal import Journal, JournalDamaged
from sweeps.record.worker_logs import worker_log_path
from sweeps.rules import ended_ok
from sweeps.rules.verdict import Verdict
from sweeps.spec.loader import Objective, Sweep
from sweeps.trial.compile import eager_fallback
from sweeps.trial.run import flat_config, trial_settings, trial_values

#: Keys Ray Tune adds to results; they are not the trainer's metrics.
_TUNE_KEYS = frozenset({
    "timestamp", "checkpoint_dir_name", "should_checkpoint", "done", "training_iteration",
    "trial_id", "date", "time_this_iter_s", "time_total_s", "pid", "hostname", "node_ip",
    "time_since_restore", "iterations_since_restore", "config", "experiment_tag",
    "__duplicate__"})


@dataclass
class TrialRecord:
    """One trial as the driver saw it."""

    trial_id: str
    values: dict[str, Any]
    seed: int
    role: str = SEARCH
    lr_scale: float = 1.0
    #: flat_at_baseline's patience for this re-run (FLAT_PATIENCE_KEY), else None
    flat_patience: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    status: str = RUNNING
    reason: str | None = None
    stop_step: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    retries: int = 0
    last_seen: float = field(default_factory=time.monotonic)
    finished: bool = False
    diagnosis: dict[str, Any] | None = None
    #: compile evidence (sweeps.trial.compile.compile_evidence)
    compile: dict[str, Any] | None = None
    gpu_peak_mb: float | None = None  # peak GPU memory (MiB); None without CUDA
    #: Retried and not reported since: its next report rewinds the history to that step.
    resuming: bool = field(default=False, repr=False, compare=False)

    def set_failure(self, status: str, verdict: Verdict) -> None:
        self.status, self.reason = status, verdict.reason
        self.stop_step, self.evidence = verdict.step, dict(verdict.evidence)

    @property
    def last_step(self) -> int:
        return last_step(self.history)

    @property
    def failed(self) -> bool:
        return self.status in FAILED

    @property
    def flagged(self) -> bool:
        """Failed, or pruned with a diagnosis of the rules: a region the sampler avoids."""
        return self.failed or self.diagnosis is not None

    @property
    def compile_fallback(self) -> str | None:
        """Why a trial labelled compiled ran eagerly (its step time is no compiled speed),
        or None: eager by label, ran compiled, crashed, or no evidence came back."""
        if self.compile is None or self.status == CRASH:
            return None
        return eager_fallback(self.values.get("compile"), self.compile)

    def diagnosis_text(self) -> str:
        """``flat_at_baseline at step 75 (since step 0)``, or "" without a diagnosis."""
        d = self.diagnosis
        if not d:
            return ""
        evidence = d.get("evidence") or {}
        since = evidence.get("flat_since_step", evidence.get("since_step"))
        return f"{d['reason']} at step {d['step']}" + \
            (f" (since step {since})" if since is not None else "")


#: The books handed out inside the :func:`books_of` block, by folder; empty outside it.
_BOOKS: dict[str, TrialBook] = {}
#: The sweep of the open block, by name: a book unpickled from Ray Tune's state binds to it.
_RUNNING: dict[str, Sweep] = {}


@contextmanager
def books_of(sweep: Sweep) -> Iterator[None]:
    """The block in which ``sweep``'s books are open.

    Inside it :func:`open_book` hands out one book per folder, and Ray Tune's restored
    state (the searcher, stopper, schedulers and callbacks are pickled into it) binds to
    those same books and to ``sweep``'s results folder, wherever the folder was when the
    state was saved. On leaving it every journal is closed and the books are forgotten
    (their files stay on disk). One block at a time per process.
    """
    if _RUNNING:
        raise RuntimeError(f"the books of sweep {next(iter(_RUNNING))!r} are open already")
    _RUNNING[sweep.name] = sweep
    try:
        yield
    finally:
        for book in _BOOKS.values():
            book.journal.close_all()
        _BOOKS.clear()
        _RUNNING.clear()


def _reopen_book(sweep: Sweep, folder: str) -> TrialBook:
    """Unpickling a book: the sweep of the open block if it has that name (a results
    folder that was moved or copied resumes where it is now), else the saved one."""
    return open_book(_RUNNING.get(sweep.name, sweep), folder)


def open_book(sweep: Sweep, folder: str = "trials") -> TrialBook:
    """The one book of this sweep's ``folder`` in the open :func:`books_of` block, read
    back from its journal if it has one.

    The searcher, the stopper and the callbacks are pickled into Ray Tune's
    experiment state; on restore they all come back to this same book.
    ``folder`` (under the results folder) holds the journal and histories.
    """
    if not _RUNNING:
        raise RuntimeError("open_book is called inside `with books_of(sweep):`")
    key = str(sweep.output_dir / folder)
    book = _BOOKS.get(key)
    if book is None:
        book = _BOOKS[key] = TrialBook(sweep, folder)
        book.load()
    return book


class TrialBook:
    """All trials of one sweep, keyed by Ray trial id. Get it with :func:`open_book`."""

    def __init__(self, sweep: Sweep, folder: str = "trials") -> None:
        self.sweep = sweep
        self.folder = folder
        self.trials: dict[str, TrialRecord] = {}
        self.journal = Journal(sweep.output_dir / folder)
        self._worker_errors: dict[str, dict[str, Any]] = {}
        self._listeners: list[Callable[[TrialRecord], None]] = []

    def __reduce__(self):
        return (_reopen_book, (self.sweep, self.folder))

    def load(self) -> None:
        """Read the trials of an earlier run of this sweep back from the journal, in the
        order they started (as the run that wrote them held them: the first search trial
        with the base config's values is the base config's, and a tie is ranked the same)."""
        loaded: list[tuple[float, str, TrialRecord]] = []
        for trial_id, events in self.journal.read().items():
            rec = None
            for line, (kind, payload) in enumerate(events, start=1):  # one event per line
                try:
                    rec = _load_event(trial_id, rec, kind, payload)
                except (KeyError, TypeError, ValueError) as exc:
                    raise JournalDamaged(self.journal.folder / f"{trial_id}.jsonl", line,
                                         f"the {kind!r} event does not hold what sweeps "
                                         f"wrote ({type(exc).__name__}: {exc})") from None
            if rec is not None:
                started = events[0][1].get("started") if events[0][0] == "trial" else None
                loaded.append((float(started) if isinstance(started, (int, float))
                               else math.inf, trial_id, rec))
        for _, trial_id, rec in sorted(loaded, key=lambda t: t[:2]):
            self.trials[trial_id] = rec

    def set_aside_unfinished(self) -> list[str]:
        """Forget trials that were running when the driver died (their journal is kept as
        ``<id>.jsonl.interrupted``); Ray Tune restarts them (and their reports come back
        with their first new one: :meth:`_carry_set_aside`) or the searcher replaces them."""
        gone = [t for t, rec in self.trials.items() if not rec.finished]
        for trial_id in gone:
            del self.trials[trial_id]
            self.journal.close(trial_id)
            path = self.journal.folder / f"{trial_id}.jsonl"
            if path.exists():
                path.rename(path.with_name(path.name + ".interrupted"))
        return gone

    def _get(self, trial_id: str, config: Mapping[str, Any] | None) -> TrialRecord:
        rec = self.trials.get(trial_id)
        if rec is None:
            config = flat_config(dict(config or {}))
            rec = TrialRecord(trial_id=trial_id, values=trial_values(self.sweep, config),
                              seed=int(config.get(SEED_KEY, self.sweep.spec.seed)),
                              role=str(config.get(ROLE_KEY, SEARCH)),
                              lr_scale=float(config.get(LR_SCALE_KEY) or 1.0),
                              flat_patience=config.get(FLAT_PATIENCE_KEY))
            self.trials[trial_id] = rec
            self.journal.write(trial_id, "trial", {"values": rec.values, "seed": rec.seed,
                                                   "role": rec.role, "lr_scale": rec.lr_scale,
                                                   "flat_patience": rec.flat_patience,
                                                   "started": round(time.time(), 6)})
            self._carry_set_aside(rec)
        return rec

    def _carry_set_aside(self, rec: TrialRecord) -> None:
        """A trial Ray Tune restarts after ``sweeps resume`` keeps what it reported before
        the driver died: those reports go back into its history (and journal), and its
        first new report rewinds to where it resumed (a checkpoint, or step 1), as after a
        worker's retry."""
        reports = [payload for kind, payload in self.journal.read_set_aside(rec.trial_id)
                   if kind == "metrics"]
        if not reports:
            return
        for report in reports:
            _append(rec, report)
            self.journal.write(rec.trial_id, "metrics", report)
        rec.resuming = True
        self.journal.write(rec.trial_id, "retry", {"retries": rec.retries})

    def _save_outcome(self, rec: TrialRecord) -> None:
        self.journal.write(rec.trial_id, "outcome", {
            "status": rec.status, "reason": rec.reason, "stop_step": rec.stop_step,
            "evidence": rec.evidence, "error": rec.error, "warnings": rec.warnings,
            "finished": rec.finished, "diagnosis": rec.diagnosis, "compile": rec.compile,
            "gpu_peak_mb": rec.gpu_peak_mb})

    def record(self, trial_id: str, result: Mapping[str, Any]) -> TrialRecord:
        """Take one result; judge it with the rules unless the trial already judged itself."""
        rec = self._get(trial_id, result.get("config"))
        if result.get(COMPILE_KEY) and not rec.finished:
            rec.compile = _compile_evidence(result[COMPILE_KEY])
        if isinstance(result.get(GPU_PEAK_KEY), (int, float)) and not rec.finished:
            rec.gpu_peak_mb = max(float(result[GPU_PEAK_KEY]), rec.gpu_peak_mb or 0.0)
        if rec.finished or rec.failed:
            return rec
        metrics = {k: v for k, v in result.items()
                   if k not in _TUNE_KEYS and not k.startswith(RESULT_PREFIX)}
        rec.last_seen = time.monotonic()
        status = result.get(STATUS_KEY, RUNNING)
        if result.get(WARNING_KEY) and not result.get(FINAL_KEY):
            rec.warnings.append(str(result[WARNING_KEY]))
        if not result.get(FINAL_KEY):
            _append(rec, metrics)
            self.journal.write(trial_id, "metrics", metrics)
        if status in FAILED:
            evidence = result.get(EVIDENCE_KEY) or "{}"
            try:
                evidence = json.loads(evidence) if isinstance(evidence, str) else dict(evidence)
            except (ValueError, TypeError):
                evidence = {"raw": str(evidence)}
            rec.set_failure(status, Verdict(result.get(REASON_KEY) or "crash",
                                            int(result.get(STOP_STEP_KEY) or 0), evidence))
            rec.error = result.get(TRACEBACK_KEY)
            self._save_outcome(rec)
        elif status == OK:
            rec.status = OK
            if rec.lr_scale == 1.0:  # not an LR probe (it ends once the rules could tell)
                settings = trial_settings(self.sweep, rec.values, rec.flat_patience)
                rec.warnings.extend(ended_ok.warnings_of(
                    rec.history, settings, self.sweep.objectives[0].metric))
            self._save_outcome(rec)
        else:
            verdict = rules.evaluate(rec.history, trial_settings(self.sweep, rec.values,
                                                                 rec.flat_patience))
            if verdict is not None:
                rec.set_failure(UNSTABLE, verdict)
                self._save_outcome(rec)
        return rec

    def worker_failed(self, trial_id: str, error: str, log: str | None) -> None:
        """What Ray said when the trial's worker failed, for the trial's evidence when it is
        closed (a trial already closed with the bare fact gets these details)."""
        detail = worker_failure(error, log)
        output = worker_log_path(self.sweep.output_dir / self.folder, trial_id)
        if output.is_file():  # kept by WorkerLogs, which Ray Tune calls first
            detail["output"] = str(output)
        self._worker_errors[trial_id] = detail
        rec = self.trials.get(trial_id)
        if rec is not None and rec.finished and rec.evidence.get("error") == WORKER_FAILED:
            rec.evidence = detail
            self._save_outcome(rec)

    def mark_retry(self, trial_id: str) -> None:
        """The trial's worker died and Ray Tune restarts it from its last checkpoint."""
        rec = self.trials.get(trial_id)
        if rec is not None:
            rec.retries += 1
            rec.resuming = True
            self.journal.write(trial_id, "retry", {"retries": rec.retries})

    def mark_hung(self, trial_id: str, config: Mapping[str, Any] | None, silent_s: float,
                  timeout: float) -> TrialRecord:
        """The trial went ``silent_s`` seconds without reporting: stop it as ``hung``."""
        rec = self._get(trial_id, config)
        if not rec.failed and not rec.finished:
            rec.set_failure(CRASH, Verdict("hung", rec.last_step, {
                "silent_s": round(silent_s, 1), "timeout_s": timeout}))
            self._save_outcome(rec)
        return rec

    def on_finish(self, listener: Callable[[TrialRecord], None]) -> None:
        """Call ``listener(record)`` each time :meth:`finish` closes a trial (once saved)."""
        if listener not in self._listeners:
            self._listeners.append(listener)

    def finish(self, trial_id: str, result: Mapping[str, Any] | None, error: bool) -> TrialRecord:
        """Close a trial: a trial that ended neither ok nor failed was pruned (or errored).

        Called by one owner, Ray Tune's ``TrialEvents`` callback; what else needs a
        finished trial (the searcher telling Optuna) listens with :meth:`on_finish`."""
        rec = self._get(trial_id, (result or {}).get("config"))
        if rec.finished:
            return rec
        if result and not rec.finished and result.get(FINAL_KEY) and not rec.failed:
            self.record(trial_id, result)
        if rec.status == RUNNING:
            if error:
                rec.set_failure(CRASH, Verdict("crash", rec.last_step, dict(
                    self._worker_errors.get(trial_id) or {"error": WORKER_FAILED})))
            else:
                rec.status = PRUNED
                verdict = rules.diagnose(rec.history, trial_settings(
                    self.sweep, rec.values, rec.flat_patience))
                rec.diagnosis = verdict.to_dict() if verdict is not None else None
        rec.finished = True
        self._save_outcome(rec)
        self.journal.close(trial_id)
        for listener in list(self._listeners):
            listener(rec)
        return rec

    def steps_spent(self, role: str | None = SEARCH) -> int:
        """Training steps the trials of ``role`` (None: every trial, the re-runs included)
        have run so far (each its last step)."""
        return sum(rec.last_step for rec in self.trials.values()
                   if role is None or rec.role == role)

    def objective_values(self, rec: TrialRecord, objs: list[Objective]) -> list[float | None]:
        """Raw objective values of a trial (None where a metric was never reported, and
        for the step time of a trial labelled compiled that ran eagerly)."""
        return [None if o.metric == "step_time" and rec.compile_fallback
                else objectives.metric_value(rec.history, o.metric) for o in objs]

    def penalised_values(self, rec: TrialRecord, objs: list[Objective]) -> list[float]:
        """Values to tell the sampler: a failed trial is worse than any finished one."""
        raw = self.objective_values(rec, objs)
        out: list[float] = []
        for i, (obj, value) in enumerate(zip(objs, raw, strict=True)):
            if obj.metric == "instability" and rec.flagged:
                out.append(max(objectives.FAILED_INSTABILITY, value or 0.0))
                continue
            if rec.flagged or value is None:
                out.append(self.worst_value(obj, i, value))
            else:
                out.append(value)
        return out

    def seed_means(self, rec: TrialRecord, objs: list[Objective]) -> list[float | None]:
        """Each objective's mean over ``rec`` and its re-runs on fresh seeds that ended ok
        (None where none reported it): a raced config's values, every objective over the
        same seeds."""
        role = confirm_role(rec.trial_id)
        runs = [rec, *(r for r in self.trials.values() if r.role == role and r.status == OK)]
        per_run = [self.objective_values(r, objs) for r in runs]
        out: list[float | None] = []
        for i in range(len(objs)):
            values = [v for row in per_run if (v := row[i]) is not None and math.isfinite(v)]
            out.append(math.fsum(values) / len(values) if values else None)
        return out

    def worst_value(self, obj: Objective, index: int, own: float | None) -> float:
        """What a failed trial is told on objective ``index``: the worst value seen, or the
        objective's random guess when that is worse (the first objective's
        ``baseline``, else ``rules.baseline_loss``; another's declared ``baseline``)."""
        seen = [v for r in self.trials.values() if r.status == OK
                for v in [objectives.metric_value(r.history, obj.metric)] if v is not None]
        if own is not None:
            seen.append(own)
        baseline = self.sweep.quality_baseline if index == 0 else obj.baseline
        if baseline is not None:
            seen.append(baseline)
        if not seen:
            return 1e6 if obj.mode == "min" else -1e6
        return max(seen) if obj.mode == "min" else min(seen)


def _load_event(trial_id: str, rec: TrialRecord | None, kind: str,
                payload: dict[str, Any]) -> TrialRecord | None:
    """Apply one journal event to the trial's record (a ``trial`` event starts it)."""
    if kind == "trial":
        rec = TrialRecord(trial_id=trial_id, values=dict(payload.get("values") or {}),
                          seed=int(payload.get("seed", 0)),
                          role=str(payload.get("role", SEARCH)),
                          lr_scale=float(payload.get("lr_scale", 1.0)),
                          flat_patience=payload.get("flat_patience"))
    elif rec is not None and kind == "metrics":
        _append(rec, payload)
    elif rec is not None and kind == "retry":
        rec.retries = int(payload.get("retries", rec.retries + 1))
        rec.resuming = True
    elif rec is not None and kind == "outcome":
        rec.status, rec.reason = str(payload["status"]), payload.get("reason")
        rec.stop_step = payload.get("stop_step")
        rec.evidence = dict(payload.get("evidence") or {})
        rec.error = payload.get("error")
        rec.warnings = list(payload.get("warnings") or [])
        rec.finished = bool(payload.get("finished"))
        rec.diagnosis = payload.get("diagnosis")
        rec.compile = payload.get("compile")
        rec.gpu_peak_mb = payload.get("gpu_peak_mb")
    return rec


#: Evidence of a trial whose worker failed when Ray said nothing more.
WORKER_FAILED = "the trial's worker failed"
_PID = re.compile(r"\bpid: (\d+)")
_IP = re.compile(r"\bip: ([0-9a-fA-F.:]+)")
_DETAIL = re.compile(r"Worker exit detail: ([^.]*\.)")


def worker_failure(error: str, log: str | None) -> dict[str, Any]:
    """Evidence for a trial whose Ray worker failed: Ray's words, the process and the log.

    A worker process that died (a segfault, the kernel's OOM killer, a signal) shows as
    ``ActorDiedError`` with its pid; ``log`` is the error file Ray Tune wrote for the trial.
    """
    out: dict[str, Any] = {}
    pid, ip, detail = _PID.search(error), _IP.search(error), _DETAIL.search(error)
    if "ActorDiedError" in error or "worker process has died" in error:
        where = f" (pid {pid.group(1)}" + (f" on {ip.group(1)}" if ip else "") + ")" if pid \
            else ""
        out["error"] = f"the trial's worker process died{where}" + (
            f": {detail.group(1)}" if detail else "")
        out["hint"] = ("a segfault, the kernel's OOM killer or a signal ends a process "
                       "without a Python traceback; look for the pid in `dmesg` and in "
                       "Ray's worker logs")
    else:
        lines = [line for line in error.strip().splitlines() if line.strip()]
        out["error"] = f"{WORKER_FAILED}: {lines[-1][:300]}" if lines else WORKER_FAILED
    if log:
        out["log"] = log
    return out


def _compile_evidence(value: Any) -> dict[str, Any] | None:
    """The ``sweeps/compile`` value of a result as a dict (None if unreadable)."""
    try:
        out = json.loads(value) if isinstance(value, str) else dict(value)
    except (ValueError, TypeError):
        return None
    return out if isinstance(out, dict) else None


def last_step(history: list[dict[str, Any]]) -> int:
    """The ``step`` of the newest report (0 for none or a non-numeric step)."""
    step = history[-1].get("step", 0) if history else 0
    return int(step) if isinstance(step, (int, float)) else 0


def _append(rec: TrialRecord, metrics: dict[str, Any]) -> None:
    """Add a report. A trial restarted from scratch or a checkpoint rewinds its history:
    its first report after a retry replaces every report at that step or later (the dead
    attempt may have reported the very step it resumes at; two reports at one step are
    otherwise kept, as a trainer may report its validation apart), and any report at an
    earlier step than the last does too."""
    history, step = rec.history, metrics.get("step")
    last = history[-1].get("step") if history else None
    numeric = isinstance(step, (int, float)) and isinstance(last, (int, float))
    if numeric and (step < last or (rec.resuming and step <= last)):
        while history and isinstance(history[-1].get("step"), (int, float)) and \
                history[-1]["step"] >= step:
            history.pop()
    rec.resuming = False
    history.append(metrics)
