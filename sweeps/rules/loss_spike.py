"""loss_spike: one report's loss jumps far above the running median of recent losses.

A single spike ends the trial: it is the first visible sign of the instability
that later turns into a blowup or NaN, and it makes the run's final quality a
matter of luck. Raise ``spike_ratio`` or disable the rule for a loss that is
legitimately spiky (tiny batches, a loss that approaches 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import median
from typing import Any

from sweeps.rules.settings import RuleSettings
from sweeps.rules.verdict import Verdict


def check(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> Verdict | None:
    """Fail when the newest loss exceeds ``spike_ratio`` x the median of the previous
    ``spike_window`` finite losses in the window (at least ``spike_min_history`` of them).
    The metric is ``loss``, or ``val_loss`` when no report in the window has a ``loss``.
    A median <= 0 is not judged.

    Example:
        >>> history = [{"step": s, "loss": 1.0} for s in range(10)]
        >>> history.append({"step": 10, "loss": 12.0})
        >>> check(history, RuleSettings()).summary()
        'loss_spike at step 10: metric=loss, loss=12, running_median=1, ratio=12, threshold=10'
    """
    if not history:
        return None
    n = len(history)
    first = max(0, n - settings.window)
    key = _metric(history, first)
    if key is None:
        return None
    value = _num(history[-1], key)
    if value is None or not math.isfinite(value):
        return None
    earlier: list[float] = []
    for i in range(n - 2, first - 1, -1):
        previous = _num(history[i], key)
        if previous is not None and math.isfinite(previous):
            earlier.append(previous)
            if len(earlier) == settings.spike_window:
                break
    if len(earlier) < settings.spike_min_history:
        return None
    med = median(earlier)
    if med <= 0 or value <= settings.spike_ratio * med:
        return None
    evidence = {
        "metric": key,
        "loss": value,
        "running_median": med,
        "ratio": value / med,
        "threshold": settings.spike_ratio,
    }
    return Verdict("loss_spike", _step(history[-1], n - 1), evidence)


def _metric(history: Sequence[Mapping[str, Any]], first: int) -> str | None:
    """``loss`` if the newest report has one; ``val_loss`` if it has one and no report in
    the window has a ``loss``; else None (this report is not judged)."""
    report = history[-1]
    if _num(report, "loss") is not None:
        return "loss"
    if _num(report, "val_loss") is None:
        return None
    if any(_num(history[i], "loss") is not None for i in range(first, len(history))):
        return None
    return "val_loss"


def _num(report: Mapping[str, Any], key: str) -> float | None:
    """``report[key]`` as a float (NaN kept); None when missing or not a number."""
    value = report.get(key)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return None


def _step(report: Mapping[str, Any], default: int) -> int:
    try:
        return int(report["step"])
    except (KeyError, TypeError, ValueError, RuntimeError, OverflowError):
        return default
