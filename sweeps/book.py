"""Driver-side record of every trial: history, outcome, objective values.

Ray Tune hands each result to the :class:`RuleStopper` (which also re-runs
the rules, so a trainer that swallowed the in-trial stop is still stopped) and
the end of each trial to the searcher and callbacks; all of them read and write
one :class:`TrialBook`. Only the driver writes files and tracking data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ray.tune import Stopper

from sweeps import objectives, rules
from sweeps.reporter import EVIDENCE, FINAL, REASON, STATUS, STOP_STEP, TRACEBACK, WARNING
from sweeps.rules.verdict import Verdict
from sweeps.spec import Objective, Sweep
from sweeps.trainable import (
    LR_SCALE_KEY,
    ROLE_KEY,
    SEED_KEY,
    flat_config,
    trial_settings,
    trial_values,
)

#: Keys Ray Tune adds to results; they are not the trainer's metrics.
_TUNE_KEYS = frozenset({
    "timestamp", "checkpoint_dir_name", "should_checkpoint", "done", "training_iteration",
    "trial_id", "date", "time_this_iter_s", "time_total_s", "pid", "hostname", "node_ip",
    "time_since_restore", "iterations_since_restore", "config", "experiment_tag",
    "__duplicate__"})

STATUSES = ("ok", "unstable", "crash", "pruned")


@dataclass
class TrialRecord:
    """One trial as the driver saw it."""

    trial_id: str
    values: dict[str, Any]
    seed: int
    role: str = "search"
    lr_scale: float = 1.0
    history: list[dict[str, Any]] = field(default_factory=list)
    status: str = "running"
    reason: str | None = None
    stop_step: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    finished: bool = False

    def set_failure(self, status: str, verdict: Verdict) -> None:
        self.status, self.reason = status, verdict.reason
        self.stop_step, self.evidence = verdict.step, dict(verdict.evidence)

    @property
    def failed(self) -> bool:
        return self.status in ("unstable", "crash")


class TrialBook:
    """All trials of one sweep, keyed by Ray trial id."""

    def __init__(self, sweep: Sweep) -> None:
        self.sweep = sweep
        self.trials: dict[str, TrialRecord] = {}

    def _get(self, trial_id: str, config: Mapping[str, Any] | None) -> TrialRecord:
        rec = self.trials.get(trial_id)
        if rec is None:
            config = flat_config(dict(config or {}))
            rec = TrialRecord(trial_id=trial_id, values=trial_values(self.sweep, config),
                              seed=int(config.get(SEED_KEY, self.sweep.spec.seed)),
                              role=str(config.get(ROLE_KEY, "search")),
                              lr_scale=float(config.get(LR_SCALE_KEY) or 1.0))
            self.trials[trial_id] = rec
        return rec

    def record(self, trial_id: str, result: Mapping[str, Any]) -> TrialRecord:
        """Take one result; judge it with the rules unless the trial already judged itself."""
        rec = self._get(trial_id, result.get("config"))
        if rec.finished or rec.failed:
            return rec
        metrics = {k: v for k, v in result.items()
                   if k not in _TUNE_KEYS and not k.startswith("sweeps/")}
        status = result.get(STATUS, "running")
        if result.get(WARNING) and not result.get(FINAL):
            rec.warnings.append(str(result[WARNING]))
        if not result.get(FINAL):
            rec.history.append(metrics)
        if status in ("unstable", "crash"):
            evidence = result.get(EVIDENCE) or "{}"
            try:
                evidence = json.loads(evidence) if isinstance(evidence, str) else dict(evidence)
            except (ValueError, TypeError):
                evidence = {"raw": str(evidence)}
            rec.set_failure(status, Verdict(result.get(REASON) or "crash",
                                            int(result.get(STOP_STEP) or 0), evidence))
            rec.error = result.get(TRACEBACK)
        elif status == "ok":
            rec.status = "ok"
        else:
            verdict = rules.evaluate(rec.history, trial_settings(self.sweep, rec.values))
            if verdict is not None:
                rec.set_failure("unstable", verdict)
        return rec

    def finish(self, trial_id: str, result: Mapping[str, Any] | None, error: bool) -> TrialRecord:
        """Close a trial: a trial that ended neither ok nor failed was pruned (or errored)."""
        rec = self._get(trial_id, (result or {}).get("config"))
        if rec.finished:
            return rec
        if result and not rec.finished and result.get(FINAL) and not rec.failed:
            self.record(trial_id, result)
        if rec.status == "running":
            if error:
                step = rec.history[-1].get("step", 0) if rec.history else 0
                rec.set_failure("crash", Verdict("crash", int(step), {
                    "error": "the trial's worker failed (see Ray's error file)"}))
            else:
                rec.status = "pruned"
        rec.finished = True
        return rec

    def objective_values(self, rec: TrialRecord, objs: list[Objective]) -> list[float | None]:
        """Raw objective values of a trial (None where a metric was never reported)."""
        return [objectives.metric_value(rec.history, o.metric) for o in objs]

    def penalised_values(self, rec: TrialRecord, objs: list[Objective]) -> list[float]:
        """Values to tell the sampler: a failed trial is worse than any finished one."""
        raw = self.objective_values(rec, objs)
        out: list[float] = []
        for i, (obj, value) in enumerate(zip(objs, raw, strict=True)):
            if obj.metric == "instability" and rec.failed:
                out.append(max(objectives.FAILED_INSTABILITY, value or 0.0))
                continue
            if rec.failed or value is None:
                out.append(self._worst(obj, i, value))
            else:
                out.append(value)
        return out

    def _worst(self, obj: Objective, index: int, own: float | None) -> float:
        seen = [v for r in self.trials.values() if r.status == "ok"
                for v in [objectives.metric_value(r.history, obj.metric)] if v is not None]
        if own is not None:
            seen.append(own)
        baseline = self.sweep.spec.rules.baseline_loss
        if index == 0 and baseline is not None:
            seen.append(baseline)
        if not seen:
            return 1e6 if obj.mode == "min" else -1e6
        return max(seen) if obj.mode == "min" else min(seen)


class RuleStopper(Stopper):
    """Ray Tune stopper running the same rules on the driver as in the trial."""

    def __init__(self, book: TrialBook) -> None:
        self.book = book

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return self.book.record(trial_id, result).failed

    def stop_all(self) -> bool:
        return False
