"""flat_at_baseline: the loss sits at the random-prediction level for a whole patience window,
making no progress.

The optimisation is stuck (LR too low, dead network, labels not reaching the loss):
an angular loss flat at pi/2, an MSE flat at the target variance. Off unless
``baseline_loss`` is set.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sweeps.rules import collapse
from sweeps.rules._history import (
    finite_num,
    judged_metric,
    newest_finite,
    newest_step,
    step_key,
    step_of,
    trend,
)
from sweeps.rules.settings import RuleSettings
from sweeps.rules.verdict import Verdict

#: Newest reports :func:`label_guess` looks back over for the labels' random guess.
LABEL_LOOKBACK = 50


def reads_as_accuracy(metric: str | None) -> bool:
    """Whether a quality metric's name reads as an accuracy (``val_acc``, ``accuracy``,
    ``top1``), whose random guess with unequal classes is the most frequent class's share;
    a metric of no name is taken as one. A macro-F1 or an AUC has a guess of its own (the
    majority guess's macro-F1 is far below its accuracy), so its declared ``baseline``
    stands.

    Example:
        >>> [reads_as_accuracy(m) for m in ("val_acc", "eval_accuracy", "top1", "eval_macro_f1")]
        [True, True, True, False]
    """
    return metric is None or re.search(r"acc|top_?1\b", metric.lower()) is not None


def label_guess(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> RuleSettings:
    """``settings`` with the random guess the trainer's class labels show, where it is
    nearer the truth than the declared one: ``label_entropy`` (the cross-entropy of
    predicting the label frequencies, from ``Monitor.measure(target=labels)``) as
    ``baseline_loss`` when it is lower or none was declared, and ``label_majority``
    (the most frequent label's share) as a maximised quality's baseline in [0, 1] when it
    is higher and the quality is an accuracy (:func:`reads_as_accuracy`). With 5 classes
    at 40/25/15/12/8 %, a model that learnt only the frequencies sits at a cross-entropy
    of 1.454 and an accuracy of 0.40, far from
    ln 5 = 1.609 and 1 / 5: by the declared values it had learnt, and labels shuffled
    apart from the inputs were handed over as confirmed.

    Example:
        >>> s = label_guess([{"step": 1, "label_entropy": 1.454, "label_majority": 0.4}],
        ...                 RuleSettings(baseline_loss=1.609, quality_mode="max",
        ...                              quality_baseline=0.2))
        >>> s.baseline_loss, s.quality_baseline
        (1.454, 0.4)
    """
    first = max(0, len(history) - LABEL_LOOKBACK)
    entropy = newest_finite(history, "label_entropy", first, 1)
    majority = newest_finite(history, "label_majority", first, 1)
    update: dict[str, float] = {}
    declared = settings.baseline_loss
    if entropy and entropy[0] > 0 and (declared is None or entropy[0] < declared):
        update["baseline_loss"] = entropy[0]
    quality = settings.quality_baseline
    if majority and settings.quality_mode == "max" and quality is not None and \
            reads_as_accuracy(settings.quality_metric) and 0 <= quality < majority[0] <= 1:
        update["quality_baseline"] = majority[0]
    return settings.model_copy(update=update) if update else settings


def check(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> Verdict | None:
    """Fail when the smoothed loss stayed within ``flat_tolerance`` x ``baseline_loss`` of
    the baseline, or above it (no better than guessing: ``above_baseline`` in the
    evidence), at every report of the last ``flat_patience`` steps *and* made no real
    progress there: the drop of a least-squares line through the stretch's losses, plus
    one standard error of it, is below ``flat_min_progress`` x ``baseline_loss`` (so the
    loss is fairly surely not falling by that much per window; a slow learner still
    inside the band is left to the scheduler). When the smoothed loss ends above the
    guess, the line goes through :func:`beyond_guess` of the losses: coming down onto
    the guess from above is no progress past it. On a noisy loss a stuck run can take a
    few more steps to be called, a chance downward trend in its window.

    The metric is ``loss``, or ``val_loss`` when no report in the window has a ``loss``.
    The smoothed loss at a report is the mean of the last ``smoothing`` finite values up
    to it. The stretch runs from the newest report back to the last report at or before
    step ``newest - flat_patience`` (whose value stands for the loss at that step); it
    must exist, and must not start before ``warmup_steps``, nor where the reported LR
    still rises (:func:`lr_warming`: a warmup no knob describes). So a loss flat from step 0
    fails at step ``flat_patience`` exactly. Stretches longer than ``window`` reports
    are thinned to about ``window`` evenly spaced reports. A run whose outputs sat
    collapsed on a plateau inside the window (:func:`sweeps.rules.collapse.plateau_since`)
    is left to the ``collapse`` rule, which gives a plateau longer: a run leaving one
    spreads its outputs before its loss moves. A run whose smoothed loss had been below
    the band before the stretch carries ``went_back`` (with ``lowest_before`` and
    ``lowest_at_step``): it learnt and lost it, which the stability grid and the LR
    probe count as a failure, not as too slow. A run whose quality objective, as last
    reported, is clearly better than its declared random-guess value
    (:func:`quality_learnt`) learns though its loss sits in the band: no verdict.

    Example:
        >>> history = [{"step": s, "loss": 1.5708} for s in range(101)]
        >>> check(history, RuleSettings(baseline_loss=1.5708)).step
        100
    """
    if not history:
        return None
    settings = label_guess(history, settings)
    baseline = settings.baseline_loss
    if baseline is None:
        return None
    n = len(history)
    first = max(0, n - settings.window)
    key = judged_metric(history, first)
    if key is None or finite_num(history[-1], key) is None:
        return None
    span, band = settings.smoothing, settings.flat_tolerance * baseline
    newest = newest_finite(history, key, first, span)
    if not newest or not at_guess(sum(newest) / len(newest), settings):
        return None  # below the band: better than guessing
    now = newest_step(history)
    start = now - settings.flat_patience
    if start < settings.warmup_steps:
        return None
    anchor = bisect_right(history, start, key=step_key) - 1
    if anchor < 0 or lr_warming(history, anchor):
        return None
    stride = max(1, math.ceil((n - anchor) / settings.window))
    series, checked, since = _stretch(history, key, anchor, stride, span)
    if since is None or since > start:
        return None
    smoothed = [
        sum(series[max(0, i - span + 1) : i + 1]) / min(span, i + 1)
        for i in range(len(series) - checked, len(series))
    ]
    if not all(at_guess(s, settings) for s in smoothed):
        return None  # it was better than guessing in the window
    below, above = baseline - min(smoothed), max(smoothed) - baseline
    stretch = series[len(series) - checked:]
    if smoothed[-1] > baseline:  # above the guess: see beyond_guess
        stretch = beyond_guess(stretch, baseline, band)
    drop, noise = trend(stretch)
    if drop + noise >= settings.flat_min_progress * baseline:
        return None  # still in the band, but learning: slow, not stuck
    if settings.is_enabled("collapse") and collapse.plateau_since(history, settings, start):
        return None  # outputs collapsed on a plateau in the window: the collapse rule's
    if quality_learnt(history, settings):
        return None  # the quality objective is clearly better than its random guess
    lowest = _lowest_before(history, key, anchor, span)
    went_back = lowest is not None and not at_guess(lowest[0], settings)
    evidence = {
        "metric": key,
        "smoothed_loss": smoothed[-1],
        **({"went_back": True, "lowest_before": lowest[0], "lowest_at_step": lowest[1]}
           if went_back and lowest is not None else {}),
        "baseline": baseline,
        # how far under the guess it got (at most the tolerance), and over it (no limit)
        "max_below_baseline": max(0.0, below / baseline),
        "tolerance": settings.flat_tolerance,
        **({"max_above_baseline": above / baseline} if above > 0 else {}),
        **({"above_baseline": True} if smoothed[-1] > baseline + band else {}),
        "flat_since_step": since,
        "patience_steps": settings.flat_patience,
        "progress": drop / baseline,
        "progress_noise": noise / baseline,
    }
    return Verdict("flat_at_baseline", now, evidence)


def beyond_guess(values: Sequence[float], baseline: float, band: float) -> list[float]:
    """Losses on the scale of progress past the random guess, for a run whose smoothed
    loss ends above the guess: a loss in the band's upper half (above the guess by at
    most ``band``) counts as the guess itself, and one above the band as its height over
    the band's top. A loss that comes down from above the guess to it has learnt nothing
    yet (a classifier's cross-entropy falling from 1.16 to ln 3 = 1.0986 while its
    accuracy stays at chance), and the noise of per-step losses around the guess does
    not hide that it stays there; a loss falling from far above still falls.

    Example:
        >>> beyond_guess([0.9, 1.0, 1.04, 1.05, 1.5], 1.0, 0.05)
        [0.9, 1.0, 1.0, 1.0, 1.45]
    """
    return [v if v <= baseline else baseline + max(0.0, v - baseline - band) for v in values]


def _lowest_before(history: Sequence[Mapping[str, Any]], key: str, anchor: int,
                   span: int) -> tuple[float, int] | None:
    """The lowest smoothed loss before the stretch (reports up to ``anchor``), and its step:
    below the band, the run had learnt and went back to the random guess (an LR that
    destroyed what it learnt: instability, not slowness)."""
    window: deque[float] = deque(maxlen=span)
    low: tuple[float, int] | None = None
    for i, report in enumerate(history[:anchor]):
        value = finite_num(report, key)
        if value is None:
            continue
        window.append(value)
        smoothed = sum(window) / len(window)
        if low is None or smoothed < low[0]:
            low = (smoothed, step_of(report, i))
    return low


def at_guess(loss: float, settings: RuleSettings) -> bool:
    """Whether a smoothed loss lies in the random-guess band (within ``flat_tolerance`` x
    ``baseline_loss`` of it) or above it; ``baseline_loss`` must be set.

    Example:
        >>> s = RuleSettings(baseline_loss=1.0)
        >>> at_guess(0.96, s), at_guess(1.3, s), at_guess(0.9, s)
        (True, True, False)
    """
    baseline = float(settings.baseline_loss)  # type: ignore[arg-type]  # callers check it
    return baseline - loss <= settings.flat_tolerance * baseline


#: Newest quality values :func:`quality_learnt` averages: one evaluation on a small
#: validation set moves by more than the margin (a 4-class model at chance read 0.244,
#: 0.237, 0.237, then 0.264 against a margin of 0.0125 above 0.25).
QUALITY_SMOOTHING = 3

#: The margin past the random guess that counts as learnt for a decision that must not
#: be fooled by one lucky evaluation (``strict``: an LR probe that holds early), in
#: ``flat_tolerance`` x |baseline|, for the mean of :data:`QUALITY_SMOOTHING` values;
#: fewer values need more (x sqrt(QUALITY_SMOOTHING / n)). One read of a 10-class
#: accuracy on 1 024 images at chance varies by +-0.009, nearly twice flat_tolerance x
#: 0.1: a dead network read 0.112 and 0.100, past the plain margin, and its probe "held".
QUALITY_MARGIN = 2.0


def quality_learnt(history: Sequence[Mapping[str, Any]], settings: RuleSettings,
                   strict: bool = False) -> bool:
    """Whether the quality objective, the mean of its newest :data:`QUALITY_SMOOTHING`
    reported values, is better than its declared random-guess value
    (``quality_baseline``) by more than ``flat_tolerance`` x its size (``strict``: by
    :data:`QUALITY_MARGIN` times that, more with fewer values): a classifier whose
    accuracy is well above chance while its cross-entropy still sits near ln(classes)
    (small, well-ordered logits) is learning. The flat rule asks leniently (a false
    "learnt" only delays its verdict); a probe that would hold on it asks strictly.

    Example:
        >>> s = RuleSettings(baseline_loss=0.6931, quality_metric="acc", quality_mode="max",
        ...                  quality_baseline=0.5)
        >>> quality_learnt([{"step": 9, "loss": 0.69, "acc": 0.9}], s)
        True
        >>> quality_learnt([{"step": 9, "loss": 0.69, "acc": 0.51}], s)
        False
        >>> quality_learnt([{"acc": 0.49}, {"acc": 0.48}, {"acc": 0.55}], s)  # one lucky read
        False
        >>> chance = RuleSettings(baseline_loss=2.3026, quality_metric="acc",
        ...                       quality_mode="max", quality_baseline=0.1)
        >>> reads = [{"acc": 0.1123}, {"acc": 0.0996}]  # a dead network
        >>> quality_learnt(reads, chance), quality_learnt(reads, chance, strict=True)
        (True, False)
    """
    metric, guess = settings.quality_metric, settings.quality_baseline
    if metric is None or guess is None:
        return False
    newest = newest_finite(history, metric, 0, QUALITY_SMOOTHING)
    if not newest:
        return False
    value = sum(newest) / len(newest)
    margin = settings.flat_tolerance * abs(guess)
    if strict:
        margin *= QUALITY_MARGIN * math.sqrt(QUALITY_SMOOTHING / len(newest))
    return value > guess + margin if settings.quality_mode == "max" else value < guess - margin


def _smoothed_after_warmup(history: Sequence[Mapping[str, Any]],
                           settings: RuleSettings) -> Iterator[tuple[int, float]]:
    """(step, smoothed training ``loss``) after ``warmup_steps``: the mean of the last
    ``smoothing`` finite values, from the first report where there are that many."""
    span = max(1, settings.smoothing)
    window: deque[float] = deque(maxlen=span)
    for i, report in enumerate(history):
        value, step = finite_num(report, "loss"), step_of(report, i)
        if value is None or step <= settings.warmup_steps:
            continue
        window.append(value)
        if len(window) == span:
            yield step, sum(window) / span


def sat_at_guess(history: Sequence[Mapping[str, Any]],
                 settings: RuleSettings) -> dict[str, Any] | None:
    """Evidence that a run's smoothed training ``loss`` never left the random-guess band
    (:func:`at_guess`) after its warmup, over at least ``flat_patience`` steps, else None.
    Said of a run that ended without a verdict: the flat rule let it be because its
    quality objective read better than its declared baseline (an embedding's kNN accuracy
    as initialised, far above 1 / classes) or its loss still crept down, yet by its loss
    it learnt nothing.

    Example:
        >>> s = RuleSettings(baseline_loss=4.844, smoothing=5, flat_patience=50)
        >>> flat = [{"step": k, "loss": 4.84 + 0.01 * (k % 3)} for k in range(1, 201)]
        >>> sat_at_guess(flat, s)["to_step"]
        200
        >>> sat_at_guess([{"step": k, "loss": 4.84 - k / 50} for k in range(1, 201)], s)
    """
    settings = label_guess(history, settings)
    if settings.baseline_loss is None:
        return None
    first = last = None
    total = 0.0
    count = 0
    for step, smoothed in _smoothed_after_warmup(history, settings):
        if not at_guess(smoothed, settings):
            return None
        first = step if first is None else first
        last, total, count = step, total + smoothed, count + 1
    if first is None or last is None or last - first < settings.flat_patience:
        return None
    return {"baseline": settings.baseline_loss, "mean_smoothed_loss": total / count,
            "from_step": first, "to_step": last}


def lr_warming(history: Sequence[Mapping[str, Any]], anchor: int) -> bool:
    """Whether the LR the reports carry rises from report ``anchor`` on before it ever
    falls: a warmup no knob describes (OneCycleLR's ``pct_start``, a scheduler's own
    ramp) covers part of the stretch, which then says nothing yet of the LR that was
    chosen. A fall first (a decay, or a warm restart after one) is no warmup."""
    before: float | None = None
    for i in range(anchor, len(history)):
        lr = finite_num(history[i], "lr")
        if lr is None:
            continue
        if before is not None and lr > before * (1 + 1e-9):
            return True
        if before is not None and lr < before * (1 - 1e-9):
            return False
        before = lr
    return False


#: How many ``flat_tolerance`` bands under the guess a run's smoothed loss must have
#: been for :func:`back_at_guess` to say it learnt.
LEARNT_BANDS = 2


def back_at_guess(history: Sequence[Mapping[str, Any]],
                  settings: RuleSettings) -> dict[str, Any] | None:
    """Evidence that a run learnt and then went back to the random guess, where it ended:
    its smoothed training ``loss`` (the mean of ``smoothing`` reports, as the flat rule
    smooths it) fell below the band (:func:`at_guess`) after its warmup, and its last
    smoothed values (a quarter of ``smoothing``, at least 2: a mean over ``smoothing``
    reports is in the band once most of them are) lie in the band or above it; else
    None. Learnt means below the guess by :data:`LEARNT_BANDS` bands: a loss at the
    guess dips just under the band's edge and back by noise alone. Said of a run
    that ended without a verdict: back at the guess for less than ``flat_patience``
    steps, the flat rule had no window to call it (``went_back``) before the run ended.

    Example:
        >>> s = RuleSettings(baseline_loss=1.0, smoothing=5)
        >>> lost = [{"step": k, "loss": 0.3 if k < 120 else 1.0} for k in range(1, 151)]
        >>> back_at_guess(lost, s)["from_step"], back_at_guess(lost, s)["lowest"]
        (124, 0.3)
        >>> back_at_guess([{"step": k, "loss": 0.3} for k in range(1, 151)], s)
    """
    settings = label_guess(history, settings)
    if settings.baseline_loss is None:
        return None
    lowest: tuple[float, int] | None = None
    since: int | None = None  # first step of the stretch in the band that reaches the end
    in_band = last = 0
    for step, smoothed in _smoothed_after_warmup(history, settings):
        last = step
        if at_guess(smoothed, settings):
            since, in_band = (step, 1) if in_band == 0 else (since, in_band + 1)
            continue
        in_band = 0
        if lowest is None or smoothed < lowest[0]:
            lowest = (smoothed, step)
    baseline = float(settings.baseline_loss)
    learnt = lowest is not None and \
        baseline - lowest[0] > LEARNT_BANDS * settings.flat_tolerance * baseline
    if not learnt or since is None or in_band < max(2, settings.smoothing // 4):
        return None  # never clearly below the band: noise around its edge is no going back
    assert lowest is not None
    return {"baseline": settings.baseline_loss, "lowest": round(lowest[0], 6),
            "lowest_at_step": lowest[1], "from_step": since, "to_step": last}


def left_band_at(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> int | None:
    """The step at which a run that sat at the random guess left it for good: the first
    report after one inside the band where the smoothed loss lies below it; None when it
    never sat in the band, never left it downwards, or there is no baseline.

    A transformer classifier under AdamW at a low LR sits at ln 3 for 100 steps before it
    learns, and on another seed for 130: a fresh seed of a config whose own run left the
    band at step S is given ``2 S`` steps there before ``flat_at_baseline`` calls it stuck
    (:data:`sweeps.protocol.FLAT_PATIENCE_KEY`)."""
    baseline = settings.baseline_loss
    if baseline is None:
        return None
    key = "loss" if any(finite_num(h, "loss") is not None for h in history) else "val_loss"
    band, span = settings.flat_tolerance * baseline, settings.smoothing
    window: deque[float] = deque(maxlen=span)
    total, seen = 0.0, False
    for i, report in enumerate(history):
        value = finite_num(report, key)
        if value is None:
            continue
        if len(window) == span:
            total -= window[0]
        window.append(value)
        total += value
        smoothed = total / len(window)
        if abs(smoothed - baseline) <= band:
            seen = True
        elif seen and smoothed < baseline - band:
            return step_of(report, i)
    return None


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
        value = finite_num(history[i], key)
        if value is not None:
            inside.append(value)
        i -= stride
    lowest = max(0, anchor - 2 * span * stride)
    for i in range(anchor, lowest - 1, -1):
        value = finite_num(history[i], key)
        if value is not None:
            inside.append(value)
            since = step_of(history[i], i)
            break
    if since is not None:
        for j in range(i - stride, lowest - 1, -stride):
            if len(before) == span - 1:
                break
            value = finite_num(history[j], key)
            if value is not None:
                before.append(value)
    inside.reverse()
    before.reverse()
    return before + inside, len(inside), since
