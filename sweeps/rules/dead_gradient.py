"""dead_gradient (warning): some parameter tensors get no gradient, report after report.

Frozen-by-accident layers, unused heads, dead ReLUs feeding a whole tensor. It is a
warning, not a failure: the trial goes on, and the warning goes into its record.
Off unless named in ``enabled``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from sweeps.rules._history import newest_step, num, step_of
from sweeps.rules.settings import RuleSettings


def check(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> dict[str, Any] | None:
    """Warn when ``dead_params > 0`` on exactly the last ``dead_patience`` consecutive
    reports carrying it (so the warning comes once, on the report where it starts to
    hold; a new streak warns again).

    Example:
        >>> history = [{"step": s, "dead_params": 2} for s in range(50)]
        >>> check(history, RuleSettings())
        {'warning': 'dead_gradient', 'step': 49, 'evidence': {'dead_params': 2, 'reports': 50, 'since_step': 0}}
    """  # noqa: E501
    if not history:
        return None
    n = len(history)
    newest = num(history[-1], "dead_params")
    if newest is None or not newest > 0:
        return None
    streak, since = 0, n - 1
    for i in range(n - 1, max(0, n - settings.window) - 1, -1):
        value = num(history[i], "dead_params")
        if value is None:
            continue
        if not value > 0:
            break
        streak, since = streak + 1, i
        if streak > settings.dead_patience:
            return None  # warned when the streak reached the patience
    if streak < settings.dead_patience:
        return None
    evidence = {
        "dead_params": int(newest) if math.isfinite(newest) else str(newest),
        "reports": streak,
        "since_step": step_of(history[since], since),
    }
    return {"warning": "dead_gradient", "step": newest_step(history), "evidence": evidence}
