"""Value-reading helpers shared by the rule modules (private to ``sweeps.rules``).

A report is one metric dict; a history is every report so far, oldest first. Values
may be missing, non-numeric or non-finite, so each helper says what it does with them:

* ``num`` keeps NaN and inf; ``finite_num`` and the collectors drop them.
* ``step_of`` falls back to a default index; ``step_key`` sorts a bad step first.

Example:
    >>> history = [{"step": 0, "loss": 2.0}, {"step": 1, "loss": float("nan")}]
    >>> num(history[-1], "loss"), finite_num(history[-1], "loss"), newest_step(history)
    (nan, None, 1)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Report = Mapping[str, Any]
History = Sequence[Report]


def num(report: Report, key: str) -> float | None:
    """``report[key]`` as a float (NaN kept); None when missing or not a number."""
    value = report.get(key)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return None


def finite_num(report: Report, key: str) -> float | None:
    """``report[key]`` as a float; None when missing, not a number, NaN or infinite."""
    value = num(report, key)
    return value if value is not None and math.isfinite(value) else None


def step_of(report: Report, default: int) -> int:
    """``report["step"]`` as an int; ``default`` when missing, NaN, inf or not a number.

    Example:
        >>> step_of({"step": 7.0}, 3), step_of({"step": float("nan")}, 3), step_of({}, 3)
        (7, 3, 3)
    """
    try:
        return int(report["step"])
    except (KeyError, TypeError, ValueError, RuntimeError, OverflowError):
        return default


def newest_step(history: History) -> int:
    """The step of the newest report (its index when it has no usable step)."""
    return step_of(history[-1], len(history) - 1)


def step_key(report: Report) -> float:
    """``report["step"]`` as a float for sorting/bisecting: inf kept, missing or NaN is -inf.

    Example:
        >>> step_key({"step": 4}), step_key({"step": float("nan")}), step_key({})
        (4.0, -inf, -inf)
    """
    value = num(report, "step")
    return value if value is not None and not math.isnan(value) else -math.inf


def tail(history: History, start: int, stop: int) -> Sequence[Report]:
    """``history[start:stop]`` without walking the whole history (any Sequence)."""
    try:
        return history[start:stop]
    except TypeError:  # a Sequence without slicing, e.g. a deque
        return [history[i] for i in range(start, stop)]


def finite_values(history: History, key: str, start: int, stop: int) -> list[float]:
    """The finite values of ``key`` in ``history[start:stop]``, oldest first.

    Same result as ``finite_num`` on each report, but a hot loop: kept lean.

    Example:
        >>> reports = [{"x": 1}, {"x": float("inf")}, {}, {"x": "2.5"}, {"x": "a"}]
        >>> finite_values(reports, "x", 0, 5)
        [1.0, 2.5]
    """
    return _finite(tail(history, start, stop), key)


def _finite(reports: Iterable[Report], key: str) -> list[float]:
    out = []
    for report in reports:
        value = report.get(key)
        if value.__class__ is not float:
            if value is None:
                continue
            try:
                value = float(value)
            except (TypeError, ValueError, RuntimeError, OverflowError):
                continue
        if value - value == 0.0:  # finite: inf - inf and nan - nan are nan
            out.append(value)
    return out


def newest_finite(
    history: History, key: str, first: int, count: int, stop: int | None = None
) -> list[float]:
    """Up to ``count`` newest finite values of ``key`` at indices ``first <= i < stop``
    (``stop`` defaults to ``len(history)``), newest first.

    Example:
        >>> reports = [{"x": 1}, {"x": 2}, {"x": float("nan")}, {"x": 3}]
        >>> newest_finite(reports, "x", 0, 2), newest_finite(reports, "x", 0, 5, stop=3)
        ([3.0, 2.0], [2.0, 1.0])
    """
    out: list[float] = []
    i = (len(history) if stop is None else stop) - 1
    while i >= first and len(out) < count:
        value = finite_num(history[i], key)
        if value is not None:
            out.append(value)
        i -= 1
    return out


def judged_metric(history: History, first: int) -> str | None:
    """``loss`` if the newest report has one; ``val_loss`` if it has one and no report in
    the window (indices >= ``first``) has a ``loss``; else None (this report is not
    judged). A NaN counts as having the value.

    Example:
        >>> judged_metric([{"loss": 1.0}, {"val_loss": 2.0}], 0) is None
        True
        >>> judged_metric([{"loss": 1.0}, {"val_loss": 2.0}], 1)
        'val_loss'
    """
    report = history[-1]
    if num(report, "loss") is not None:
        return "loss"
    if num(report, "val_loss") is None:
        return None
    if any(num(history[i], "loss") is not None for i in range(first, len(history))):
        return None
    return "val_loss"


def trend(values: Sequence[float]) -> tuple[float, float]:
    """(drop, its standard error): how far a least-squares line through ``values`` (in
    report order) falls from the first to the last, and the uncertainty of that from the
    scatter around the line. Values beyond 4 robust standard deviations (MAD) of the
    median are clipped first, so one wild report neither makes nor hides a trend."""
    m = len(values)
    if m < 3:
        return 0.0, math.inf
    mid = statistics.median(values)
    spread = 4 * 1.4826 * statistics.median(abs(v - mid) for v in values)
    values = [min(max(v, mid - spread), mid + spread) for v in values]
    mean_x, mean_y = (m - 1) / 2, sum(values) / m
    sxx = sum((i - mean_x) ** 2 for i in range(m))
    slope = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values)) / sxx
    residual = sum((v - mean_y - slope * (i - mean_x)) ** 2 for i, v in enumerate(values))
    se_slope = math.sqrt(residual / (m - 2) / sxx)
    return -slope * (m - 1), se_slope * (m - 1)
