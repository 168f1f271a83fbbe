"""Objective values of a trial, computed from its metric history.

Quality is the last reported value of the objective's metric (the value a run
of this length ends with). ``instability`` is a score from the run itself:
``log10`` of the peak grad-norm ratio (the largest grad norm over the median of
the 20 reports before it, so a norm that shrinks as the loss converges scores
0) plus 0.1 per loss spike (a report whose loss exceeds 3x the median of the
50 before it). ``step_time`` is the steady-state median over the second half of
the run, so compilation does not count against a compile mode; ``compile_s``
(as the trainer reports it) is kept apart, and ``startup_s`` is the first
step's time above the steady state (imports, data, compilation).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

#: Instability given to a trial that a rule stopped or that crashed.
FAILED_INSTABILITY = 10.0
SPIKE_FACTOR = 3.0
#: What the sampler is told for an instability below it: log10(2), a grad norm that
#: never jumped past twice its running median, and no loss spike: steady. Below it the
#: scores are noise (the stable regression trials read 0.13-0.24, the lowest at the
#: lowest LRs), and multi-objective TPE kept the steadier-by-noise low-LR configs in its
#: good group beside the best ones (docs/benchmarks.md, "instability told from a floor").
STEADY_INSTABILITY = math.log10(2.0)


def told(metric: str, value: float) -> float:
    """The value the sampler is told for ``metric``: an ``instability`` below
    :data:`STEADY_INSTABILITY` as that floor (steady is steady), anything else as it is.

    Example:
        >>> round(told("instability", 0.13), 4), told("instability", 1.2), told("val_loss", 0.1)
        (0.301, 1.2, 0.1)
    """
    return max(value, STEADY_INSTABILITY) if metric == "instability" else value


def _finite(values: Sequence[Any]) -> list[float]:
    return [float(v) for v in values
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


def series(history: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    """Finite values of ``key`` across the history, in order."""
    return _finite([h.get(key) for h in history])


def instability(history: Sequence[Mapping[str, Any]]) -> float:
    """Score ≥ 0; larger is less stable. See the module docstring."""
    grads = series(history, "grad_norm")
    peak = 1.0
    for i in range(5, len(grads)):
        ref = statistics.median(grads[max(0, i - 20):i])
        if ref > 0:
            peak = max(peak, grads[i] / ref)
    score = math.log10(peak)
    losses = series(history, "loss")
    spikes = 0
    for i in range(5, len(losses)):
        ref = statistics.median(losses[max(0, i - 50):i])
        if ref > 0 and losses[i] > SPIKE_FACTOR * ref:
            spikes += 1
    return score + 0.1 * spikes


def steady_step_time(history: Sequence[Mapping[str, Any]]) -> float | None:
    """Median step time over the second half of the run."""
    times = series(history, "step_time")
    if not times:
        return None
    return statistics.median(times[len(times) // 2:])


def compile_seconds(history: Sequence[Mapping[str, Any]]) -> float | None:
    """``compile_s`` as the trainer reported it (its first report)."""
    reported = series(history, "compile_s")
    return reported[0] if reported else None


def startup_seconds(history: Sequence[Mapping[str, Any]]) -> float | None:
    """The first step's time above the steady-state step time."""
    times = series(history, "step_time")
    steady = steady_step_time(history)
    if not times or steady is None:
        return None
    return max(0.0, times[0] - steady)


def metric_value(history: Sequence[Mapping[str, Any]], metric: str) -> float | None:
    """The value of one objective metric for a finished history (None if never reported)."""
    if metric == "instability":
        return instability(history)
    if metric == "step_time":
        return steady_step_time(history)
    if metric == "compile_s":
        return compile_seconds(history)
    values = series(history, metric)
    return values[-1] if values else None


def gap_scale(best: float, mode: str, baseline: float | None) -> float:
    """What a quality gap is measured against: ``best``'s improvement over the random-guess
    value ``baseline`` when it beats it (below it for ``min``, above it for ``max``), else
    ``|best|``."""
    if baseline is not None and (best < baseline if mode == "min" else best > baseline):
        return abs(baseline - best)
    return abs(best)


def quality_gap(value: float, best: float, mode: str, baseline: float | None = None) -> float:
    """How much worse ``value`` is than ``best``, as a share of :func:`gap_scale` (0 = as
    good). Near a loss of zero a share of ``|best|`` magnifies seed noise; a share of the
    improvement over the random guess does not."""
    worse = value - best if mode == "min" else best - value
    if worse == 0:
        return 0.0
    scale = gap_scale(best, mode, baseline)
    return worse / scale if scale else math.copysign(math.inf, worse)


def summary(history: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Final value of every numeric metric, plus peaks and minima that matter."""
    out: dict[str, float] = {}
    keys: dict[str, None] = {}
    for h in history:
        keys.update(dict.fromkeys(h))
    for key in keys:
        if key == "step":
            continue
        vals = [h.get(key) for h in history if key in h]
        nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if not nums:
            continue
        out[f"final_{key}"] = float(nums[-1])
        finite = _finite(nums)
        if key in ("grad_norm", "loss", "lr") and finite:
            out[f"peak_{key}"] = max(finite)
        if key in ("loss", "val_loss") and finite:
            out[f"min_{key}"] = min(finite)
    steady = steady_step_time(history)
    if steady is not None:
        out["step_time"] = steady
    for key, value in (("compile_s", compile_seconds(history)),
                       ("startup_s", startup_seconds(history))):
        if value is not None:
            out[key] = value
    out["instability"] = instability(history)
    return out
