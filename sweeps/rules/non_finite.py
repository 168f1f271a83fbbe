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
            return _verdict(history, {"metric": key, "value": str(value),
                                      **(_scaler_hint(report) if key in GRAD_KEYS else {})})
    if not settings.allow_nonfinite_grads:
        count = num(report, "nonfinite_grads")
        if count is not None and count > 0:
            shown = int(count) if math.isfinite(count) else str(count)
            return _verdict(history, {"metric": "nonfinite_grads", "value": shown,
                                      **_scaler_hint(report)})
    return None


#: Said beside a non-finite gradient whose loss is finite.
SCALER_HINT = ("the loss is finite: if a GradScaler (fp16) skipped this step, set "
               "rules.allow_nonfinite_grads: true")


def _scaler_hint(report: Mapping[str, Any]) -> dict[str, str]:
    """A non-finite gradient beside a finite loss is what a GradScaler's skipped step
    looks like (its scale was too high; it lowers it and goes on): say how to allow it."""
    loss = num(report, "loss")
    return {"hint": SCALER_HINT} if loss is not None and math.isfinite(loss) else {}


def _verdict(history: Sequence[Mapping[str, Any]], evidence: dict[str, Any]) -> Verdict:
    return Verdict("non_finite", newest_step(history), evidence)
