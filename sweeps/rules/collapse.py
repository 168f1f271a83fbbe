"""collapse: the predictions stop varying (their std falls far below the target's std).

Mode collapse: the network predicts (nearly) one value for every input, often
with a flat loss. Judged only on reports carrying both ``pred_std`` and
``target_std`` (``Monitor.measure(pred=..., target=...)`` adds them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sweeps.rules._history import finite_num, newest_step, num, step_of
from sweeps.rules.settings import RuleSettings
from sweeps.rules.verdict import Verdict


def check(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> Verdict | None:
    """Fail when ``pred_std / target_std < collapse_ratio`` on each of the last
    ``collapse_patience`` reports carrying both keys (in the window, all at steps
    >= ``collapse_min_step``). The newest report must carry them; reports with a
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
    count, since = 0, n - 1
    for i in range(n - 1, max(0, n - settings.window) - 1, -1):
        ratio = _ratio(history[i])
        if ratio is None:
            continue
        if ratio >= settings.collapse_ratio or step_of(history[i], i) < settings.collapse_min_step:
            return None
        count, since = count + 1, i
        if count == settings.collapse_patience:
            break
    if count < settings.collapse_patience:
        return None
    report = history[-1]
    evidence = {
        "pred_std": num(report, "pred_std"),
        "target_std": num(report, "target_std"),
        "ratio": newest,
        "threshold": settings.collapse_ratio,
        "reports": count,
        "since_step": step_of(history[since], since),
    }
    return Verdict("collapse", newest_step(history), evidence)


def _ratio(report: Mapping[str, Any]) -> float | None:
    """pred_std / target_std, or None when either is missing, non-finite or target <= 0."""
    pred, target = finite_num(report, "pred_std"), finite_num(report, "target_std")
    if pred is None or target is None:
        return None
    return pred / target if target > 0 else None
