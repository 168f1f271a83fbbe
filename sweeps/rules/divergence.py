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
#: Fewest finite losses a climb is judged on (windows shrink to fit fewer than the settings').
MIN_REPORTS = 6
#: With ``baseline_loss`` set, the share of the run's gain below the random guess a climb
#: must give back: a bump that leaves the run far better than guessing is not divergence.
GIVE_BACK = 0.5


def check(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> Verdict | None:
    """Fail on an explosion at once, or on a loss that climbs and keeps climbing.

    **Explosion** (no history needed): the newest loss is at least ``explosion_factor``
    x ``baseline_loss`` (when set), or x the run's first loss (when positive) within the
    run's first ``MIN_REPORTS`` losses; within those, on two losses in a row (a one-step
    jump that the next loss takes back is the run's first updates, not divergence).

    **Climb:** the smoothed loss (mean of the last ``smoothing`` finite losses) is

    * rising: higher than ``divergence_patience`` reports ago, and higher than on the
      report before on at least 3/4 of those reports; with fewer reports than
      ``smoothing + divergence_patience`` (at least 6), both shrink in proportion, so a
      run that doubles its loss within a few reports is stopped then;
    * over ``divergence_ratio`` x the reference: the lowest of the smallest smoothed
      loss in the window, the smoothed loss at the start of the run and
      ``baseline_loss`` when set; with ``baseline_loss`` set, also over halfway
      (``GIVE_BACK``) from the window's lowest smoothed loss back to the baseline, so a
      bump of a run that learnt well (0.2 -> 0.6 against a random guess of 1.57, which
      the LR schedule takes back) is not read as divergence. A loss that has fallen to
      or below zero (a negative log-likelihood) is judged by what it gave back instead:
      it fails once it has risen ``divergence_ratio - 1`` times its fall from the run's
      start above its lowest point;
    * above the reference by more than ``NOISE_Z`` (8) standard deviations of the
      smoothed loss's noise (estimated from successive differences in the window), so
      a very noisy loss is not read as a climb.

    With ``allow_lr_restarts``, no climb is judged within ``smoothing +
    divergence_patience`` reports after the LR rose past warmup (:func:`restarted_lately`).

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
    if started_off_scale(history, settings):
        settings = settings.model_copy(update={"baseline_loss": None})
    exploded = _explosion(history, newest, settings)
    if exploded is not None:
        return exploded
    if settings.allow_lr_restarts and restarted_lately(history, settings):
        return None  # the bump an intended restart brings; a climb that goes on is judged
    first = max(0, n - settings.window)
    span, patience = _windows(len(newest_finite(history, "loss", first, n)), settings)
    if span == 0:
        return None
    recent = newest_finite(history, "loss", first, span + patience)[::-1]
    smoothed = _rolling_mean(recent, span)
    now, before = smoothed[-1], smoothed[0]
    rises = sum(1 for a, b in zip(smoothed[:-1], smoothed[1:], strict=True) if b > a)
    if now <= before or rises < RISING_SHARE * patience:
        return None
    values = newest_finite(history, "loss", first, n)[::-1]
    noise = _noise(values) / math.sqrt(span)
    start = _first_mean(history, min(n, settings.window), span)
    low = min(_rolling_mean(values, span))
    limit, reference, kind = _limit(low, start, settings)
    if limit is None or now <= limit or now - reference <= NOISE_Z * noise:
        return None
    evidence = {
        "smoothed_loss": now,
        "reference": reference,
        "reference_kind": kind,
        "limit": limit,
        "ratio": now / reference if reference > 0 else None,
        "threshold": settings.divergence_ratio,
        "noise": noise,
        "rising_reports": rises,
        "patience": patience,
    }
    return Verdict("divergence", newest_step(history), evidence)


def started_off_scale(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> bool:
    """Whether the run's first loss was already ``explosion_factor`` x ``baseline_loss``:
    a loss on another scale than the guess (summed over the batch), which nothing is
    judged against here; an explosion is then measured from the run's own start.

    Example:
        >>> s = RuleSettings(baseline_loss=1.6)
        >>> started_off_scale([{"step": 1, "loss": 103.0}], s), started_off_scale(
        ...     [{"step": 1, "loss": 1.7}, {"step": 2, "loss": 103.0}], s)
        (True, False)
    """
    baseline, factor = settings.baseline_loss, settings.explosion_factor
    if baseline is None or baseline <= 0 or factor is None:
        return False
    first = next((v for r in history[:MIN_REPORTS]
                  if (v := finite_num(r, "loss")) is not None), None)
    return first is not None and first >= factor * baseline


def restarted_lately(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> bool:
    """Whether the reported LR rose after warmup within the newest ``smoothing +
    divergence_patience`` reports: with ``allow_lr_restarts`` (a warm-restart or cyclic
    schedule) the loss may climb for a while after it, and a climb is judged only once a
    whole window lies past the restart.

    Example:
        >>> lrs = [0.1 * (1 - t / 50) for t in range(50)] + [0.1] * 5
        >>> h = [{"step": t + 1, "lr": lr, "loss": 1.0} for t, lr in enumerate(lrs)]
        >>> restarted_lately(h, RuleSettings()), restarted_lately(h[:50], RuleSettings())
        (True, False)
    """
    reach = settings.smoothing + settings.divergence_patience
    lrs = [(step, lr) for report in history[-(reach + 1):]
           if (step := finite_num(report, "step")) is not None
           and (lr := finite_num(report, "lr")) is not None]
    return any(b > a * (1 + 1e-9) and step > settings.warmup_steps
               for (_, a), (step, b) in zip(lrs[:-1], lrs[1:], strict=False))


def _windows(available: int, settings: RuleSettings) -> tuple[int, int]:
    """(smoothing, patience) for ``available`` finite losses: the settings', or both
    shrunk in proportion for a short history (0, 0 below ``MIN_REPORTS``)."""
    span, patience = settings.smoothing, settings.divergence_patience
    if available >= span + patience:
        return span, patience
    if available < MIN_REPORTS:
        return 0, 0
    short_span = max(1, round(available * span / (span + patience)))
    return short_span, max(2, available - short_span)


def _limit(low: float, start: float | None,
           settings: RuleSettings) -> tuple[float | None, float, str]:
    """(the smoothed loss above which the run diverges, its reference, the reference's
    kind). Positive references: ``divergence_ratio`` x the lowest of them, and with a
    baseline above the run's lowest point at least halfway back to it; a loss that fell
    to or below zero: its lowest point plus ``divergence_ratio - 1`` times its fall from
    the start."""
    ratio = settings.divergence_ratio
    if low <= 0:
        if start is None or start <= low:
            return None, low, "window_min"
        return low + (ratio - 1) * (start - low), low, "fall_from_start"
    baseline = settings.baseline_loss
    references = {"window_min": low, "run_start": start, "baseline": baseline}
    usable = {k: v for k, v in references.items() if v is not None and v > 0}
    kind = min(usable, key=usable.__getitem__)
    limit = ratio * usable[kind]
    if baseline is not None and low < baseline:
        limit = max(limit, low + GIVE_BACK * (baseline - low))
    return limit, usable[kind], kind


def _explosion(history: Sequence[Mapping[str, Any]], newest: float,
               settings: RuleSettings) -> Verdict | None:
    """The newest loss ``explosion_factor`` x the baseline, or x the run's first loss while
    the run is younger than ``MIN_REPORTS`` losses (later the climb test and loss_spike,
    which judge against the recent history, take over).

    Within the run's first ``MIN_REPORTS`` losses the explosion must show on two losses
    in a row: the first updates of a run with no warmup (Adam's first step moves every
    weight by about the LR) can throw the loss up for one step, and a run whose next
    loss is back below the limit recovers from it and trains on; a run that really
    exploded is still above it (or non-finite, which ``nan_inf`` stops) one report later.
    """
    factor = settings.explosion_factor
    if factor is None:
        return None
    early = newest_finite(history, "loss", 0, MIN_REPORTS + 1)
    young = len(early) <= MIN_REPORTS
    first = early[-1] if 1 < len(early) <= MIN_REPORTS else None
    before = early[1] if young and len(early) > 1 else None
    references = {"baseline": settings.baseline_loss, "run_start": first}
    for kind, reference in references.items():
        if reference is None or reference <= 0 or newest < factor * reference:
            continue
        if young and (before is None or before < factor * reference):
            continue  # a one-step jump early on: judged again on the next report
        return Verdict("divergence", newest_step(history), {
            "loss": newest, "reference": reference, "reference_kind": kind,
            "ratio": newest / reference, "threshold": factor, "kind": "explosion"})
    return None


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
