"""collapse: the predictions stop varying (their std falls far below the target's std).

Mode collapse: the network predicts (nearly) one value for every input, often
with a flat loss. Judged only on reports carrying both ``pred_std`` and
``target_std`` (``Monitor.measure(pred=..., target=...)`` adds them).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeps.rules._history import finite_num, newest_step, num, step_of, trend
from sweeps.rules.settings import RuleSettings
from sweeps.rules.verdict import Verdict

#: A collapsed-looking spread whose fitted rise over the patience window, less one standard
#: error, exceeds this share of its mean is growing (a model that starts near-constant,
#: e.g. from zero weights, and is learning), not collapsed.
GROWTH = 0.05
#: A loss whose fitted drop over the collapsed stretch, less one standard error, exceeds
#: this share of its mean is still falling. With ``baseline_loss`` set and the loss
#: already clearly below it, the outputs carry information and the model is learning
#: (slowly, through a narrow spread of outputs), not collapsed. (A loss falling towards
#: the baseline is a collapsed model learning the mean, and is judged.)
LOSS_FALLING = 0.05
#: A collapsed stretch whose spread is not shrinking and whose gradient is alive (its
#: median grad norm at least :data:`LIVE_GRADIENT` of the run's first reports') is a
#: plateau: networks stall on such saddles with near-constant outputs and leave them
#: (raw-input direction MLPs at lr 0.016-0.028 sat at a ratio of 0.006-0.011 from step 10
#: and escaped at steps 90-130, ending at val_loss 0.34). A plateau fires only after
#: this many times ``collapse_patience`` reports; a spread still shrinking (weight decay
#: pulling a regressor to its mean) or a vanished gradient fires at the patience.
PLATEAU_PATIENCE = 5
#: The grad norm of a live collapsed stretch, as a share of the median of the run's first
#: :data:`FIRST_REPORTS` grad norms. Measured: escaped plateaus 0.22-0.29, collapses that
#: stayed 0.03-0.08 (a dead net at lr 0.6; Adam + heavy L2 on the regression trainer).
LIVE_GRADIENT = 0.15
#: A collapsed spread whose fitted drop over the stretch, less one standard error, exceeds
#: this share of its mean is still shrinking: something drives it to a constant (weight
#: decay on the regression trainer: 36-99 %; escaped plateaus drifted 4-12 %).
SHRINKING = 0.25
#: A collapsed stretch whose every ratio is below this gives one output for every input
#: (the units before the output layer dead, the gradient left moving the output's bias
#: alone): no plateau, since nothing that varies with the input is left to leave it by. A
#: Hydra-configured MLP (AdamW, lr 1.66) sat at a spread of exactly 0 from step 43 to 150 with its
#: grad norm alive, and ended at the random guess.
ONE_OUTPUT = 1e-6
#: Reports that set the run's starting grad-norm level.
FIRST_REPORTS = 5


def check(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> Verdict | None:
    """Fail when ``pred_std / target_std < collapse_ratio`` on each of the last
    ``collapse_patience`` reports carrying both keys (in the window, all at steps
    >= ``collapse_min_step``), and the ratio is not clearly growing over the whole
    collapsed stretch (every consecutive such report back from the newest): its fitted
    rise (``_history.trend``) less one standard error is at most ``GROWTH`` of its
    mean, the stretch is no plateau (:data:`PLATEAU_PATIENCE`) or has lasted that long,
    and the training loss is not clearly falling below ``baseline_loss`` over
    that stretch (its fitted drop less one standard error more than ``LOSS_FALLING`` of
    its mean, the newest loss below the flat band around the baseline). A model that
    starts near-constant (e.g. from zero weights) and is learning is slow, not
    collapsed. The newest report must carry the keys; reports with a non-finite std or
    ``target_std <= 0`` are skipped.

    Example:
        >>> history = [{"step": s, "pred_std": 0.01, "target_std": 1.0} for s in range(80)]
        >>> check(history, RuleSettings()).step  # not judged before step 50
        79
    """
    stretch = _Stretch.of(history, settings)
    if stretch is None or stretch.growing or stretch.waiting:
        return None  # growing out of a small start: slow; or a plateau given longer
    falling = _loss_falling(history[stretch.since:])
    if falling is not None and falling > LOSS_FALLING and _below_baseline(history, settings):
        return None  # the loss falls, below the random guess: learning slowly
    report = history[-1]
    evidence = {
        "pred_std": num(report, "pred_std"),
        "target_std": num(report, "target_std"),
        "ratio": stretch.ratios[-1],
        "threshold": settings.collapse_ratio,
        "reports": len(stretch.ratios),
        "since_step": step_of(history[stretch.since], stretch.since),
        "growth": stretch.growth,
        "loss_falling": falling,
        "gradient": stretch.gradient,
        "plateau": stretch.plateau,
    }
    return Verdict("collapse", newest_step(history), evidence)


def on_plateau(history: Sequence[Mapping[str, Any]], settings: RuleSettings,
               end: int | None = None) -> bool:
    """Whether the outputs sit collapsed on a plateau (a spread neither shrinking nor
    growing, a live gradient: see :data:`PLATEAU_PATIENCE`), judged on the collapsed
    reports so far (at least 3 past ``collapse_min_step``, not yet the patience) of
    ``history[:end]`` (the whole history by default; no copy is made).

    Example:
        >>> flat = [{"step": s, "pred_std": 0.01, "target_std": 1.0,
        ...          "grad_norm": 1.0 if s < 10 else 0.3} for s in range(90)]
        >>> on_plateau(flat, RuleSettings())
        True
    """
    stretch = _Stretch.of(history, settings, least=3, end=end)
    return stretch is not None and stretch.plateau and not stretch.growing


def plateau_since(history: Sequence[Mapping[str, Any]], settings: RuleSettings,
                  step: int) -> bool:
    """Whether the outputs sat on a plateau (:func:`on_plateau`) at a collapsed report at
    or after ``step``, looked at every ``collapse_patience`` reports back from the newest
    collapsed one: ``flat_at_baseline`` and ``grad_blowup`` leave such a run to this rule,
    which waits the plateau out and then names it. A run leaving a plateau spreads its
    outputs and takes its gradient back to its own level before its loss moves.

    Example:
        >>> stuck = [{"step": s, "pred_std": 0.01, "target_std": 1.0,
        ...           "grad_norm": 1.0 if s < 10 else 0.3} for s in range(90)]
        >>> left = stuck + [{"step": 90, "pred_std": 0.5, "target_std": 1.0}]
        >>> plateau_since(left, RuleSettings(), 40), plateau_since(left, RuleSettings(), 90)
        (True, False)
    """
    n = len(history)
    stride, i = max(1, settings.collapse_patience), n - 1
    while i >= max(0, n - settings.window) and step_of(history[i], i) >= step:
        ratio = spread_ratio(history[i])
        if ratio is None or ratio >= settings.collapse_ratio:
            i -= 1
            continue
        if on_plateau(history, settings, end=i + 1):
            return True
        i -= stride
    return False


@dataclass(frozen=True)
class _Stretch:
    """The newest collapsed stretch: every consecutive report back from the newest with
    the ratio below ``collapse_ratio`` at a step >= ``collapse_min_step`` (within
    ``window``), at least ``least`` of them (default ``collapse_patience``); of
    ``history[:end]`` when ``end`` is given."""

    since: int
    ratios: list[float]
    growth: float  # the fitted rise as a share of the ratio's mean
    growing: bool  # the rise, less one standard error, above GROWTH of the mean
    plateau: bool  # not shrinking, with a live gradient
    waiting: bool  # a plateau shorter than plateau_patience()
    gradient: float | None

    @classmethod
    def of(cls, history: Sequence[Mapping[str, Any]], settings: RuleSettings,
           least: int | None = None, end: int | None = None) -> _Stretch | None:
        n = len(history) if end is None else end
        newest = spread_ratio(history[n - 1]) if n > 0 else None
        if newest is None or newest >= settings.collapse_ratio:
            return None
        since, ratios = n - 1, []
        for i in range(n - 1, max(0, n - settings.window) - 1, -1):
            ratio = spread_ratio(history[i])
            if ratio is None:
                continue
            if ratio >= settings.collapse_ratio or \
                    step_of(history[i], i) < settings.collapse_min_step:
                break
            since = i
            ratios.append(ratio)
        if len(ratios) < (settings.collapse_patience if least is None else least):
            return None
        ratios.reverse()
        mean = sum(ratios) / len(ratios)
        drop, noise = trend(ratios)
        gradient = _gradient_level(history, since, n)
        plateau = drop - noise <= SHRINKING * mean and gradient is not None and \
            gradient >= LIVE_GRADIENT and max(ratios) >= ONE_OUTPUT
        return cls(since, ratios, -drop / mean if mean else 0.0, -drop - noise > GROWTH * mean,
                   plateau, plateau and len(ratios) < plateau_patience(settings), gradient)


def plateau_patience(settings: RuleSettings) -> int:
    """Collapsed reports a plateau needs: :data:`PLATEAU_PATIENCE` x ``collapse_patience``,
    at most ``window`` (the stretch is counted within it)."""
    return min(PLATEAU_PATIENCE * settings.collapse_patience, settings.window)


def starting_grad_norm(history: Sequence[Mapping[str, Any]]) -> float | None:
    """The median of the run's first :data:`FIRST_REPORTS` finite grad norms (None
    without any)."""
    first: list[float] = []
    for report in history:
        value = finite_num(report, "grad_norm")
        if value is not None:
            first.append(value)
            if len(first) == FIRST_REPORTS:
                break
    return statistics.median(first) if first else None


def _gradient_level(history: Sequence[Mapping[str, Any]], since: int,
                    end: int) -> float | None:
    """The median grad norm of ``history[since:end]`` over :func:`starting_grad_norm`;
    None without grad norms or with a zero start."""
    start = starting_grad_norm(history)
    stretch = [v for i in range(since, end) for v in [finite_num(history[i], "grad_norm")]
               if v is not None]
    if not start or not stretch:
        return None
    return statistics.median(stretch) / start


def _below_baseline(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> bool:
    """Whether the newest training loss is below ``baseline_loss`` by more than the flat
    band (``flat_tolerance`` x baseline); False without a baseline."""
    baseline, loss = settings.baseline_loss, finite_num(history[-1], "loss")
    if baseline is None or loss is None:
        return False
    return loss < baseline - settings.flat_tolerance * abs(baseline)


def _loss_falling(stretch: Sequence[Mapping[str, Any]]) -> float | None:
    """How surely the training loss falls over ``stretch``: its fitted drop less one
    standard error, as a share of its mean magnitude (None with fewer than 5 losses)."""
    losses = [v for r in stretch for v in [finite_num(r, "loss")] if v is not None]
    scale = sum(abs(v) for v in losses) / len(losses) if losses else 0.0
    if len(losses) < 5 or scale == 0:
        return None
    drop, noise = trend(losses)
    return (drop - noise) / scale


def spread_ratio(report: Mapping[str, Any]) -> float | None:
    """pred_std / target_std, or None when either is missing, non-finite or target <= 0.

    Example:
        >>> spread_ratio({"pred_std": 0.5, "target_std": 2.0}), spread_ratio({"pred_std": 1})
        (0.25, None)
    """
    pred, target = finite_num(report, "pred_std"), finite_num(report, "target_std")
    if pred is None or target is None:
        return None
    return pred / target if target > 0 else None
