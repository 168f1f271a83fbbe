"""Selection of the candidates for confirmation: a noise-aware Pareto front, then the rest.

A secondary objective only shapes the front where its differences exceed its
noise: trial A dominates trial B when A is no worse than B on every objective
beyond that objective's noise, and better on at least one beyond it. Quality
(the first objective) has no noise allowance. The noise of ``step_time`` is
measured from the trials themselves (how much one trial's own steady-state
step times scatter, at least 10 %); ``instability`` allows 0.1 (one loss spike,
or a peak grad-norm ratio 1.26x higher); any objective's ``noise`` setting in
the sweep file overrides these (a relative share for step_time, absolute else).
"""

from __future__ import annotations

import math
import statistics

from sweeps.protocol import OK, PRUNED
from sweeps.record import objectives as objs
from sweeps.record.book import TrialBook, TrialRecord
from sweeps.spec.loader import Objective

#: Smallest relative step-time difference that counts.
STEP_TIME_FLOOR = 0.10
#: Instability difference that counts (one loss spike).
INSTABILITY_NOISE = 0.1


def step_time_noise(records: list[TrialRecord]) -> float:
    """Relative scatter of steady-state step times: the median over trials of
    (90th - 10th percentile) / median of each trial's second-half step times."""
    scatter = []
    for rec in records:
        times = objs.series(rec.history, "step_time")
        half = sorted(times[len(times) // 2:])
        if len(half) >= 5 and half[len(half) // 2] > 0:
            lo, hi = half[len(half) // 10], half[(9 * len(half)) // 10]
            scatter.append((hi - lo) / half[len(half) // 2])
    return max(STEP_TIME_FLOOR, statistics.median(scatter)) if scatter else STEP_TIME_FLOOR


def noise_allowances(records: list[TrialRecord], objectives: list[Objective]) -> list[float]:
    """Per objective: the difference that counts (step_time: relative; others absolute)."""
    out = []
    for i, obj in enumerate(objectives):
        if obj.noise is not None:
            out.append(obj.noise)
        elif i == 0:
            out.append(0.0)
        elif obj.metric == "step_time":
            out.append(step_time_noise(records))
        elif obj.metric == "instability":
            out.append(INSTABILITY_NOISE)
        else:
            out.append(0.0)
    return out


def _better(a: float, b: float, noise: float, relative: bool) -> int:
    """1 if a beats b (smaller) beyond the noise, -1 if b beats a, 0 if within it."""
    margin = noise * max(abs(a), abs(b)) if relative else noise
    if a < b - margin:
        return 1
    if b < a - margin:
        return -1
    return 0


def pareto_front(book: TrialBook, records: list[TrialRecord],
                 objectives: list[Objective]) -> list[TrialRecord]:
    """Trials among ``records`` that finished ``ok`` and no other trial dominates beyond the
    objectives' noise, best quality first. Trials missing an objective value are left out.
    With one objective the front is the single best trial."""
    sign = [1.0 if o.mode == "min" else -1.0 for o in objectives]
    candidates = []
    for rec in records:
        if rec.status != OK:
            continue
        values = book.objective_values(rec, objectives)
        if any(v is None for v in values):
            continue
        candidates.append((rec, [s * float(v) for s, v in zip(sign, values, strict=True)]))
    ok = [rec for rec, _ in candidates]
    noise = noise_allowances(ok, objectives)
    relative = [o.metric == "step_time" for o in objectives]

    def dominates(a: list[float], b: list[float]) -> bool:
        cmp = [_better(x, y, n, r) for x, y, n, r in zip(a, b, noise, relative, strict=True)]
        return all(c >= 0 for c in cmp) and any(c > 0 for c in cmp)

    front = [(rec, v) for rec, v in candidates
             if not any(dominates(w, v) for other, w in candidates if other is not rec)]
    front.sort(key=lambda rv: rv[1][0])
    return [rec for rec, _ in front]


def candidates(book: TrialBook, records: list[TrialRecord], front: list[TrialRecord],
               objectives: list[Objective], pruned: bool = False) -> list[TrialRecord]:
    """The order candidates are confirmed in: the front, then every other ``ok`` trial, each
    by quality on its search seed; with ``pruned``, then the trials the scheduler stopped
    early that the rules found nothing wrong with, by their last quality.

    A scheduler such as ASHA keeps what is best on the search seed, so when that is a lucky
    seed the configs that hold everywhere may all have been pruned; confirmation runs
    them to full length on fresh seeds (their short search run does not count).

    A trial whose quality is no better than the random guess (its gain over the quality
    baseline under :data:`MIN_GAIN` of the best trial's) is no candidate, on the front or
    off it: fresh seeds of a config that learnt nothing are steps spent to find it
    ``poor``, and one on the front for its low instability (a LR too small to move the
    loss is the steadiest of all) was handed over at val_mse 1.01 against a guess of 1."""
    quality = objectives[0]
    sign = 1.0 if quality.mode == "min" else -1.0
    ids = {r.trial_id for r in front}
    floor = guess_floor(book, records, quality)

    def learnt(rec: TrialRecord) -> bool:
        value = objs.metric_value(rec.history, quality.metric)
        return floor is None or value is None or not math.isfinite(value) or \
            sign * value < floor

    front = [r for r in front if learnt(r)]
    rest, cut = [], []
    for rec in records:
        value = objs.metric_value(rec.history, quality.metric)
        if rec.trial_id in ids or value is None or not math.isfinite(value):
            continue
        if floor is not None and sign * value >= floor:
            continue
        if rec.status == OK:
            rest.append((sign * value, rec))
        elif pruned and rec.status == PRUNED and rec.diagnosis is None:
            cut.append((sign * value, rec))
    rest.sort(key=lambda vr: vr[0])
    cut.sort(key=lambda vr: vr[0])
    return list(front) + [rec for _, rec in rest] + [rec for _, rec in cut]


#: A candidate must have gained at least this share of the best trial's gain over the
#: random guess (see :func:`candidates`).
MIN_GAIN = 0.1


def guess_floor(book: TrialBook, records: list[TrialRecord],
                quality: Objective) -> float | None:
    """The signed quality (smaller is better) at or past which a trial learnt nothing: the
    edge of the random-guess band (``rules.flat_tolerance`` x |baseline| better than the
    guess), or the guess plus :data:`MIN_GAIN` of the best ``ok`` trial's gain over it
    when that asks more; None without a quality baseline. Until a trial has left the
    band no trial is past the floor: a config at the random guess gets no fresh seed,
    even when it is the only one that finished."""
    baseline = book.sweep.baseline_of(quality)
    if baseline is None:
        return None
    sign = 1.0 if quality.mode == "min" else -1.0
    values = [sign * v for r in records if r.status == OK
              for v in [objs.metric_value(r.history, quality.metric)]
              if v is not None and math.isfinite(v)]
    guess = sign * baseline
    band = guess - book.sweep.spec.rules.flat_tolerance * abs(baseline)
    if not values or min(values) >= band:
        return band
    return min(band, guess - MIN_GAIN * (guess - min(values)))
