"""Instability rules: pure functions of a trial's metric history.

Each rule is ``check(history, settings) -> Verdict | None`` in its own module, where
``history`` is every metric dict the trainer reported so far, oldest first. The same
code runs inside the trial (after every report) and in the driver's Ray Tune stopper.
A rule looks only at the newest ``settings.window`` reports (plus, for divergence, the
first few losses of the run), so each call costs O(window), and a rule that lacks the
metrics it needs returns None. See ``docs/rules.md``.

Example:
    >>> history = [{"step": 0, "loss": 2.3}, {"step": 1, "loss": float("nan")}]
    >>> evaluate(history).summary()
    'non_finite at step 1: metric=loss, value=nan'
    >>> evaluate(history[:1]) is None
    True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sweeps.rules import (
    collapse,
    dead_gradient,
    divergence,
    flat_at_baseline,
    grad_blowup,
    loss_spike,
    lr_anomaly,
    non_finite,
)
from sweeps.rules.settings import CHECK_NAMES, RULE_NAMES, WARNING_NAMES, RuleSettings
from sweeps.rules.verdict import REASONS, Verdict

History = Sequence[Mapping[str, Any]]
Rule = Callable[[History, RuleSettings], Verdict | None]
WarningCheck = Callable[[History, RuleSettings], dict[str, Any] | None]

#: Failure rules by name (= verdict reason), in priority order: the first that fires wins.
RULES: dict[str, Rule] = {
    "non_finite": non_finite.check,
    "grad_blowup": grad_blowup.check,
    "divergence": divergence.check,
    "flat_at_baseline": flat_at_baseline.check,
    "loss_spike": loss_spike.check,
    "collapse": collapse.check,
    "lr_anomaly": lr_anomaly.check,
}
#: Warning-level checks by name: reported, never stop a trial, off unless enabled.
WARNINGS: dict[str, WarningCheck] = {
    "dead_gradient": dead_gradient.check,
    "frequent_clipping": grad_blowup.check_clipping,
}

_DEFAULTS = RuleSettings()


def evaluate(history: History, settings: RuleSettings | None = None) -> Verdict | None:
    """The verdict of the first enabled rule that fires on ``history``, or None.

    Call it after every report: the verdict's step is the newest report's step.

    Example:
        >>> history = [{"step": s, "grad_norm": 1.0} for s in range(10)]
        >>> evaluate(history + [{"step": 10, "grad_norm": 4.2e8}]).reason
        'grad_blowup'
    """
    settings = settings or _DEFAULTS
    if not history:
        return None
    for name in settings.active_rules():
        verdict = RULES[name](history, settings)
        if verdict is not None:
            return verdict
    return None


def warnings(history: History, settings: RuleSettings | None = None) -> list[dict[str, Any]]:
    """The enabled warning-level checks that start to hold at the newest report, as
    ``{"warning": name, "step": step, "evidence": {...}}`` dicts. Each warning comes
    once, on the report where it begins; warnings never stop a trial.

    Example:
        >>> settings = RuleSettings(enabled=["dead_gradient"])
        >>> history = [{"step": s, "dead_params": 1} for s in range(50)]
        >>> [w["warning"] for w in warnings(history, settings)]
        ['dead_gradient']
    """
    settings = settings or _DEFAULTS
    if not history:
        return []
    found = (WARNINGS[name](history, settings) for name in settings.active_warnings())
    return [w for w in found if w is not None]


__all__ = [
    "CHECK_NAMES",
    "REASONS",
    "RULES",
    "RULE_NAMES",
    "RuleSettings",
    "Verdict",
    "WARNINGS",
    "WARNING_NAMES",
    "evaluate",
    "warnings",
]
