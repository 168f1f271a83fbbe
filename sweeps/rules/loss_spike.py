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
from typing import Any

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
    scale = max(abs(med), max(earlier) - min(earlier))
    if scale <= 0:
        return None
    ratio = 1.0 + (value - med) / scale  # = loss / median for a settled positive loss
    if ratio <= settings.spike_ratio:
        return None
    evidence = {
        "metric": key,
        "loss": value,
        "running_median": med,
        "scale": scale,
        "ratio": ratio,
        "threshold": settings.spike_ratio,
    }
    return Verdict("loss_spike", newest_step(history), evidence)
