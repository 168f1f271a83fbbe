"""The verdict a rule returns, and the closed set of failure reasons."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The failure rules, in priority order (the first one that fires names the failure):
#: each is a module of ``sweeps.rules`` and a key of ``sweeps.rules.RULES``.
RULE_REASONS: tuple[str, ...] = (
    "non_finite",
    "grad_blowup",
    "divergence",
    "flat_at_baseline",
    "loss_spike",
    "collapse",
    "lr_anomaly",
)
#: Reasons of a trial that crashed rather than went unstable: an exception, a dead or
#: hung worker, a metric that is not a number, the trainer exiting the process.
CRASH_REASONS: tuple[str, ...] = (
    "compile_error",
    "oom",
    "hung",
    "bad_metric",
    "trainer_exit",
    "crash",
)
#: Every reason a trial can fail for. Closed: code and docs name only these.
REASONS: tuple[str, ...] = RULE_REASONS + CRASH_REASONS


@dataclass(frozen=True)
class Verdict:
    """Why a trial is unstable: the reason, the step it was seen at, and the evidence.

    Example:
        >>> Verdict("non_finite", 12, {"metric": "loss", "value": "nan"}).summary()
        'non_finite at step 12: metric=loss, value=nan'
    """

    reason: str
    step: int
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"unknown failure reason {self.reason!r}; known: {REASONS}")

    def summary(self) -> str:
        """One line a person can read: reason, step and evidence."""
        ev = ", ".join(f"{k}={_fmt(v)}" for k, v in self.evidence.items())
        return f"{self.reason} at step {self.step}" + (f": {ev}" if ev else "")

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "step": self.step, "evidence": dict(self.evidence)}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
