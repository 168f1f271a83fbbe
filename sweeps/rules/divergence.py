"""divergence: the training loss climbs well above its reference level and keeps climbing.

Catches slow exponential growth that stays finite (gradient descent with the LR
past 2/lambda_max multiplies the loss by a constant > 1 each step) long before it
overflows. Judges the training ``loss`` only: a rising ``val_loss`` is as often
overfitting as instability.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from sweeps.rules._history import finite_num, newest_finite, newest_step
from sweeps.rules.settings import RuleSettings
from sweeps.rules.verdict import Verdict

#: Share of the last ``divergence_patience`` reports on which the smoothed loss must rise.
RISING_SHARE = 0.75
#: The rise must also exceed this many standard deviations of the smoothed loss's noise.
NOISE_Z = 8.0


def check(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> Verdict | None:
    """Fail when the smoothed loss (mean of the last ``smoothing`` finite losses) is

    * rising: higher than ``divergence_patience`` reports ago, and higher than on the
      report before on at least 3/4 of those reports; and
    * over ``divergence_ratio`` x the reference: the lowest of the smallest smoothed
      loss in the window, the smoothed loss at the start of the run (its first
      ``smoothing`` losses) and ``baseline_loss`` when set. References <= 0 are ignored;
    * above the reference by more than ``NOISE_Z`` (8) standard deviations of the
      smoothed loss's noise (estimated from successive differences in the window), so
      a very noisy loss is not read as a climb.

    The newest report must carry a finite ``loss``; NaN losses are skipped.

    Example:
        >>> history = [{"step": t, "loss": 1.02**t} for t in range(100)]
        >>> next(t for t in range(100) if check(history[: t + 1], RuleSettings()))
        55
    """
    n = len(history)
    newest = finite_num(history[-1], "loss") if n else None
    if newest is None:
        return None
    span, patience = settings.smoothing, settings.divergence_patience
    first = max(0, n - settings.window)
    recent = newest_finite(history, "loss", first, span + patience)[::-1]
    if len(recent) < span + patience:
        return None
    smoothed = _rolling_mean(recent, span)
    now, before = smoothed[-1], smoothed[0]
    rises = sum(1 for a, b in zip(smoothed[:-1], smoothed[1:], strict=True) if b > a)
    if now <= before or rises < RISING_SHARE * patience:
        return None
    values = newest_finite(history, "loss", first, n)[::-1]
    noise = _noise(values) / math.sqrt(span)
    references = {
        "window_min": min(_rolling_mean(values, span)),
        "run_start": _first_mean(history, min(n, settings.window), span),
        "baseline": settings.baseline_loss,
    }
    usable = {k: v for k, v in references.items() if v is not None and v > 0}
    if not usable:
        return None
    kind = min(usable, key=usable.__getitem__)
    reference = usable[kind]
    if now <= settings.divergence_ratio * reference or now - reference <= NOISE_Z * noise:
        return None
    evidence = {
        "smoothed_loss": now,
        "reference": reference,
        "reference_kind": kind,
        "ratio": now / reference,
        "threshold": settings.divergence_ratio,
        "noise": noise,
        "rising_reports": rises,
        "patience": patience,
    }
    return Verdict("divergence", newest_step(history), evidence)


def _first_mean(history: Sequence[Mapping[str, Any]], stop: int, span: int) -> float | None:
    """Mean of the first ``span`` finite losses in ``history[:stop]``; None if fewer."""
    values: list[float] = []
    for i in range(stop):
        value = finite_num(history[i], "loss")
        if value is not None:
            values.append(value)
            if len(values) == span:
                return sum(values) / span
    return None


def _noise(values: list[float]) -> float:
    """Per-report noise: standard deviation of successive differences / sqrt(2)."""
    diffs = [b - a for a, b in zip(values[:-1], values[1:], strict=True)]
    if len(diffs) < 2:
        return 0.0
    mean = sum(diffs) / len(diffs)
    return math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / 2)


def _rolling_mean(values: list[float], span: int) -> list[float]:
    """Means of every run of ``span`` consecutive values (summed afresh: no drift)."""
    return [sum(values[i : i + span]) / span for i in range(len(values) - span + 1)]
