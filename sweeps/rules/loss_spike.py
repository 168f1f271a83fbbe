"""loss_spike: one report's loss jumps far above the running median of recent losses.

A single spike ends the trial: it is the first visible sign of the instability
that later turns into a blowup or NaN, and it makes the run's final quality a
matter of luck. The jump is measured in units of the loss's own scale, so a
loss that sits near or below zero (a negative log-likelihood such as a vMF or
Gaussian NLL) is judged as fairly as one far above it. Raise ``spike_ratio`` or
disable the rule for a loss that is legitimately spiky (tiny batches).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import median
from typing import Any, NamedTuple

from sweeps.rules._history import finite_num, judged_metric, newest_finite, newest_step
from sweeps.rules.settings import RuleSettings
from sweeps.rules.verdict import Verdict


def check(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> Verdict | None:
    """Fail when the newest loss is more than ``spike_ratio - 1`` scales above the median
    of the previous ``spike_window`` finite losses in the window (at least
    ``spike_min_history`` of them). The scale is ``|median|``, or the range of those
    losses when that is larger, so for a positive, settled loss the test is
    ``loss > spike_ratio x median``; a noisy loss around zero needs a jump many times
    its own range. The metric is ``loss``, or ``val_loss`` when no report in the window
    has a ``loss``. A scale of 0 (a constant zero loss) is not judged.

    Example:
        >>> history = [{"step": s, "loss": 1.0} for s in range(10)]
        >>> history.append({"step": 10, "loss": 12.0})
        >>> verdict = check(history, RuleSettings())
        >>> verdict.reason, verdict.step, verdict.evidence["ratio"]
        ('loss_spike', 10, 12.0)
    """
    if not history:
        return None
    key = judged_metric(history, max(0, len(history) - settings.window))
    measured = jump(history, key, settings) if key is not None else None
    if measured is None or measured.ratio <= settings.spike_ratio:
        return None
    evidence = {
        "metric": key,
        "loss": measured.value,
        "running_median": measured.median,
        "scale": measured.scale,
        "ratio": measured.ratio,
        "threshold": settings.spike_ratio,
    }
    return Verdict("loss_spike", newest_step(history), evidence)


class Jump(NamedTuple):
    """The newest value of a metric against the median of its previous values."""

    value: float
    median: float
    scale: float
    ratio: float  #: 1 + (value - median) / scale: value / median for a settled positive loss


def jump(history: Sequence[Mapping[str, Any]], key: str, settings: RuleSettings) -> Jump | None:
    """The newest report's ``key`` measured against the median of the previous
    ``spike_window`` finite values in the window, in units of their scale (``|median|``,
    or their range when larger); None without a finite newest value, with fewer than
    ``spike_min_history`` earlier ones, or a scale of 0.

    Example:
        >>> history = [{"loss": 1.0} for _ in range(10)] + [{"loss": 3.0}]
        >>> jump(history, "loss", RuleSettings()).ratio
        3.0
    """
    value = finite_num(history[-1], key) if history else None
    if value is None:
        return None
    n = len(history)
    earlier = newest_finite(history, key, max(0, n - settings.window), settings.spike_window,
                            stop=n - 1)
    if len(earlier) < settings.spike_min_history:
        return None
    med = median(earlier)
    scale = max(abs(med), max(earlier) - min(earlier))
    if scale <= 0:
        return None
    return Jump(value, med, scale, 1.0 + (value - med) / scale)
