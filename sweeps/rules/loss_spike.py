"""loss_spike: one report's loss jumps far above the running median of recent losses.

A single spike ends the trial: it is the first visible sign of the instability
that later turns into a blowup or NaN, and it makes the run's final quality a
matter of luck. Raise ``spike_ratio`` or disable the rule for a loss that is
legitimately spiky (tiny batches, a loss that approaches 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import median
from typing import Any

from sweeps.rules._history import finite_num, judged_metric, newest_finite, newest_step
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
    key = judged_metric(history, first)
    if key is None:
        return None
    value = finite_num(history[-1], key)
    if value is None:
        return None
    earlier = newest_finite(history, key, first, settings.spike_window, stop=n - 1)
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
    return Verdict("loss_spike", newest_step(history), evidence)
