"""Confirmation of the Pareto front: extra seeds and an LR probe per member."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sweeps import objectives
from sweeps.book import TrialBook, TrialRecord
from sweeps.spec import Sweep
from sweeps.trainable import LR_SCALE_KEY, ROLE_KEY, SEED_KEY


@dataclass
class Confirmation:
    """What the re-runs of one front member showed."""

    trial_id: str
    seeds: list[int] = field(default_factory=list)
    seed_status: list[str] = field(default_factory=list)
    seed_reasons: list[str] = field(default_factory=list)
    probe_status: str | None = None
    probe_reason: str | None = None
    lr_sensitivity: float | None = None

    @property
    def seeds_passed(self) -> int:
        return sum(s == "ok" for s in self.seed_status)

    @property
    def confirmed(self) -> bool:
        """Stable on every confirmation seed (the probe informs, it does not veto)."""
        return self.seeds_passed == len(self.seeds)


def plan(sweep: Sweep, front: list[TrialRecord]) -> list[dict[str, Any]]:
    """Re-run configs: each member on ``confirm.seeds`` new seeds and once at LR × probe."""
    conf = sweep.spec.confirm
    runs: list[dict[str, Any]] = []
    for rec in front:
        for k in range(conf.seeds):
            runs.append({**rec.values, SEED_KEY: sweep.spec.seed + 1 + k,
                         ROLE_KEY: f"confirm:{rec.trial_id}"})
        if conf.lr_probe > 0 and "lr" in rec.values:
            runs.append({**rec.values, SEED_KEY: rec.seed, LR_SCALE_KEY: conf.lr_probe,
                         ROLE_KEY: f"probe:{rec.trial_id}"})
    for run in runs:  # the probe scales lr inside the trial; keep the member's own value here
        run.setdefault(LR_SCALE_KEY, None)
    return runs


def collect(sweep: Sweep, book: TrialBook, front: list[TrialRecord]) -> dict[str, Confirmation]:
    """Confirmation results per front member, from the re-runs recorded in ``book``."""
    quality = sweep.objectives[0].metric
    out: dict[str, Confirmation] = {}
    for rec in front:
        conf = Confirmation(rec.trial_id)
        for run in book.trials.values():
            if run.role == f"confirm:{rec.trial_id}":
                conf.seeds.append(run.seed)
                conf.seed_status.append(run.status)
                if run.reason:
                    conf.seed_reasons.append(f"seed {run.seed}: {run.reason} @ {run.stop_step}")
            elif run.role == f"probe:{rec.trial_id}":
                conf.probe_status, conf.probe_reason = run.status, run.reason
                conf.lr_sensitivity = _sensitivity(rec, run, quality)
        out[rec.trial_id] = conf
    return out


def _sensitivity(member: TrialRecord, probe: TrialRecord, metric: str) -> float:
    """Relative change of quality at LR × probe; infinite when the probe went unstable."""
    if probe.status != "ok":
        return math.inf
    base = objectives.metric_value(member.history, metric)
    new = objectives.metric_value(probe.history, metric)
    if base is None or new is None or base == 0:
        return math.nan
    return (new - base) / abs(base)
