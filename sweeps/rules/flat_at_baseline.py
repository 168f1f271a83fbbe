"""flat_at_baseline: the loss sits at the random-prediction level for a whole patience window.

The optimisation is stuck (LR too low, dead network, labels not reaching the loss):
an angular loss flat at pi/2, an MSE flat at the target variance. Off unless
``baseline_loss`` is set.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

from sweeps.rules.settings import RuleSettings
from sweeps.rules.verdict import Verdict


def check(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> Verdict | None:
    """Fail when the smoothed loss stayed within ``flat_tolerance`` x ``baseline_loss`` of
    the baseline at every report of the last ``flat_patience`` steps.

    The metric is ``loss``, or ``val_loss`` when no report in the window has a ``loss``.
    The smoothed loss at a report is the mean of the last ``smoothing`` finite values up
    to it. The stretch runs from the newest report back to the last report at or before
    step ``newest - flat_patience`` (whose value stands for the loss at that step); it
    must exist, and must not start before ``warmup_steps``. So a loss flat from step 0
    fails at step ``flat_patience`` exactly. Stretches longer than ``window`` reports
    are thinned to about ``window`` evenly spaced reports.

    Example:
        >>> history = [{"step": s, "loss": 1.5708} for s in range(101)]
        >>> check(history, RuleSettings(baseline_loss=1.5708)).step
        100
    """
    baseline = settings.baseline_loss
    if baseline is None or not history:
        return None
    n = len(history)
    first = max(0, n - settings.window)
    key = _metric(history, first)
    value = None if key is None else _num(history[-1], key)
    if key is None or value is None or not math.isfinite(value):
        return None
    span, band = settings.smoothing, settings.flat_tolerance * baseline
    newest = _newest(history, key, first, span)
    if not newest or abs(sum(newest) / len(newest) - baseline) > band:
        return None
    now = _step(history[-1], n - 1)
    start = now - settings.flat_patience
    if start < settings.warmup_steps:
        return None
    anchor = bisect_right(history, start, key=_stepf) - 1
    if anchor < 0:
        return None
    stride = max(1, math.ceil((n - anchor) / settings.window))
    series, checked, since = _stretch(history, key, anchor, stride, span)
    if since is None or since > start:
        return None
    smoothed = [
        sum(series[max(0, i - span + 1) : i + 1]) / min(span, i + 1)
        for i in range(len(series) - checked, len(series))
    ]
    worst = max(abs(s - baseline) for s in smoothed)
    if worst > band:
        return None
    evidence = {
        "metric": key,
        "smoothed_loss": smoothed[-1],
        "baseline": baseline,
        "max_relative_deviation": worst / baseline,
        "tolerance": settings.flat_tolerance,
        "flat_since_step": since,
        "patience_steps": settings.flat_patience,
    }
    return Verdict("flat_at_baseline", now, evidence)


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


def _stretch(
    history: Sequence[Mapping[str, Any]], key: str, anchor: int, stride: int, span: int
) -> tuple[list[float], int, int | None]:
    """Finite values of every ``stride``-th report from the newest down to the anchor,
    then of the stretch's first report (the last one with a value at or before
    ``anchor``), then up to ``span`` - 1 earlier ones for smoothing; returned oldest
    first, with how many belong to the stretch and the step of its first report (None
    when no value is found near the anchor)."""
    inside: list[float] = []
    before: list[float] = []
    since: int | None = None
    i = len(history) - 1
    while i > anchor:
        value = _num(history[i], key)
        if value is not None and math.isfinite(value):
            inside.append(value)
        i -= stride
    lowest = max(0, anchor - 2 * span * stride)
    for i in range(anchor, lowest - 1, -1):
        value = _num(history[i], key)
        if value is not None and math.isfinite(value):
            inside.append(value)
            since = _step(history[i], i)
            break
    if since is not None:
        for j in range(i - stride, lowest - 1, -stride):
            if len(before) == span - 1:
                break
            value = _num(history[j], key)
            if value is not None and math.isfinite(value):
                before.append(value)
    inside.reverse()
    before.reverse()
    return before + inside, len(inside), since


def _newest(history: Sequence[Mapping[str, Any]], key: str, first: int, span: int) -> list[float]:
    """Up to ``span`` newest finite values of ``key`` at indices >= ``first``."""
    out: list[float] = []
    for i in range(len(history) - 1, first - 1, -1):
        value = _num(history[i], key)
        if value is not None and math.isfinite(value):
            out.append(value)
            if len(out) == span:
                break
    return out


def _stepf(report: Mapping[str, Any]) -> float:
    value = _num(report, "step")
    return value if value is not None and not math.isnan(value) else -math.inf


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
