"""non_finite: a NaN or infinity in the loss, the grad norm or the validation loss.

Judges the newest report only (the rules run after every report), so it fires on
the very report that carries the first non-finite value: 0 steps late.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from sweeps.rules._history import newest_step, num
from sweeps.rules.settings import RuleSettings
from sweeps.rules.verdict import Verdict

#: Metrics whose non-finite value fails the trial.
LOSS_KEYS: tuple[str, ...] = ("loss", "val_loss")
GRAD_KEYS: tuple[str, ...] = ("grad_norm",)


def check(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> Verdict | None:
    """Fail when the newest report holds a NaN/inf loss, val_loss or grad_norm, or
    ``nonfinite_grads > 0``.

    Example:
        >>> nan = float("nan")
        >>> check([{"step": 0, "loss": 2.3}, {"step": 1, "loss": nan}], RuleSettings())
        Verdict(reason='non_finite', step=1, evidence={'metric': 'loss', 'value': 'nan'})
    """
    if not history:
        return None
    report = history[-1]
    keys = LOSS_KEYS if settings.allow_nonfinite_grads else LOSS_KEYS + GRAD_KEYS
    for key in keys:
        value = num(report, key)
        if value is not None and not math.isfinite(value):
            return _verdict(history, {"metric": key, "value": str(value)})
    if not settings.allow_nonfinite_grads:
        count = num(report, "nonfinite_grads")
        if count is not None and count > 0:
            shown = int(count) if math.isfinite(count) else str(count)
            return _verdict(history, {"metric": "nonfinite_grads", "value": shown})
    return None


def _verdict(history: Sequence[Mapping[str, Any]], evidence: dict[str, Any]) -> Verdict:
    return Verdict("non_finite", newest_step(history), evidence)
