"""collapse: the predictions stop varying (their std falls far below the target's std).

Mode collapse: the network predicts (nearly) one value for every input, often
with a flat loss. Judged only on reports carrying both ``pred_std`` and
``target_std`` (``Monitor.measure(pred=..., target=...)`` adds them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sweeps.rules._history import finite_num, newest_step, num, step_of, trend
from sweeps.rules.settings import RuleSettings
from sweeps.rules.verdict import Verdict

#: A collapsed-looking spread whose fitted rise over the patience window, less one standard
#: error, exceeds this share of its mean is growing (a model that starts near-constant,
#: e.g. from zero weights, and is learning), not collapsed.
GROWTH = 0.05


def check(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> Verdict | None:
    """Fail when ``pred_std / target_std < collapse_ratio`` on each of the last
    ``collapse_patience`` reports carrying both keys (in the window, all at steps
    >= ``collapse_min_step``), and the ratio is not clearly growing over the whole
    collapsed stretch (every consecutive such report back from the newest): its fitted
    rise (``_history.trend``) less one standard error is at most ``GROWTH`` of its
    mean. A model that starts near-constant (e.g. from zero weights) and is learning
    is slow, not collapsed. The newest report must carry the keys; reports with a
    non-finite std or ``target_std <= 0`` are skipped.

    Example:
        >>> history = [{"step": s, "pred_std": 0.01, "target_std": 1.0} for s in range(80)]
        >>> check(history, RuleSettings()).step  # not judged before step 50
        79
    """
    if not history:
        return None
    n = len(history)
    newest = _ratio(history[-1])
    if newest is None or newest >= settings.collapse_ratio:
        return None
    since, ratios = n - 1, []
    for i in range(n - 1, max(0, n - settings.window) - 1, -1):
        ratio = _ratio(history[i])
        if ratio is None:
            continue
        if ratio >= settings.collapse_ratio or step_of(history[i], i) < settings.collapse_min_step:
            break
        since = i
        ratios.append(ratio)
    if len(ratios) < settings.collapse_patience:
        return None
    ratios.reverse()
    mean = sum(ratios) / len(ratios)
    drop, noise = trend(ratios)
    if -drop - noise > GROWTH * mean:
        return None  # the spread is still growing out of a small start: slow, not collapsed
    report = history[-1]
    evidence = {
        "pred_std": num(report, "pred_std"),
        "target_std": num(report, "target_std"),
        "ratio": newest,
        "threshold": settings.collapse_ratio,
        "reports": len(ratios),
        "since_step": step_of(history[since], since),
        "growth": -drop / mean if mean else 0.0,
    }
    return Verdict("collapse", newest_step(history), evidence)


def _ratio(report: Mapping[str, Any]) -> float | None:
    """pred_std / target_std, or None when either is missing, non-finite or target <= 0."""
    pred, target = finite_num(report, "pred_std"), finite_num(report, "target_std")
    if pred is None or target is None:
        return None
    return pred / target if target > 0 else None
