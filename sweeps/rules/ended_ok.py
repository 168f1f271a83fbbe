"""What is said of a run that ended ok: warnings, not stops.

A run no rule stopped may still have learnt nothing (its loss sat at the random guess),
lost what it learnt at its very end, trained at an LR its warmup never reached, or had
its quality objective read before its last step. The trial book records these with the
trial (trials.csv, the summary, the hand-over's header) and ``sweeps try`` prints them,
in the same words.

Example:
    >>> from sweeps.rules.settings import RuleSettings
    >>> history = [{"step": 175, "loss": 0.4, "val_loss": 0.5}, {"step": 190, "loss": 0.4}]
    >>> [w[:40] for w in warnings_of(history, RuleSettings(), "val_loss")]
    ['stale_quality: val_loss was last reporte']
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from sweeps.protocol import (
    BACK_AT_GUESS,
    LOSS_AT_GUESS,
    LOSS_OFF_SCALE,
    LR_STILL_WARMING,
    STALE_QUALITY,
)
from sweeps.rules import flat_at_baseline, lr_anomaly
from sweeps.rules.settings import RuleSettings


def warnings_of(history: Sequence[Mapping[str, Any]], settings: RuleSettings,
                metric: str) -> list[str]:
    """The warnings of a run that ended ok, each starting with its name (``LOSS_AT_GUESS``
    and the others in :mod:`sweeps.protocol`); ``metric`` is the quality objective's."""
    out: list[str] = []
    sat = flat_at_baseline.sat_at_guess(history, settings)
    if sat is not None and sat["mean_smoothed_loss"] > OFF_SCALE * sat["baseline"] > 0:
        out.append(f"{LOSS_OFF_SCALE} (smoothed loss {sat['mean_smoothed_loss']:.4g} from step "
                   f"{sat['from_step']} to {sat['to_step']}, "
                   f"{sat['mean_smoothed_loss'] / sat['baseline']:.0f}x the random guess "
                   f"{sat['baseline']:g}; a loss summed over a batch of N is N times its mean)")
    elif sat is not None:
        out.append(f"{LOSS_AT_GUESS} (smoothed loss {sat['mean_smoothed_loss']:.4g} from step "
                   f"{sat['from_step']} to {sat['to_step']}, the random guess "
                   f"{sat['baseline']:g})")
    elif (off := off_scale(history, settings)) is not None:
        out.append(f"{LOSS_OFF_SCALE} (median loss {off['median']:.4g} over steps "
                   f"{off['from_step']}-{off['to_step']}, {off['median'] / off['baseline']:.0f}x "
                   f"the random guess {off['baseline']:g}; a loss summed over a batch of N is "
                   "N times its mean)")
    elif (back := flat_at_baseline.back_at_guess(history, settings)) is not None:
        out.append(f"{BACK_AT_GUESS} (from step {back['from_step']} to {back['to_step']}; its "
                   f"smoothed loss had reached {back['lowest']:.4g} at step "
                   f"{back['lowest_at_step']}, the random guess {back['baseline']:g})")
    stale = stale_quality(history, metric)
    if stale:
        out.append(stale)
    warming = lr_anomaly.still_warming(history, settings)
    if warming is not None:
        out.append(f"{LR_STILL_WARMING} ({lr_anomaly.warming_text(warming)})")
    return out


#: A training loss whose mean from its warmup on is over this many times the random guess
#: is on another scale than the guess (a loss at the guess is within a few tenths of it;
#: an untrained model's is seldom twice it), not sitting at it.
OFF_SCALE = 4.0


#: Training losses the second half of a run must carry before :func:`off_scale` tells.
OFF_SCALE_REPORTS = 3


def off_scale(history: Sequence[Mapping[str, Any]], settings: RuleSettings
              ) -> dict[str, Any] | None:
    """The median training loss over the second half of a run that ended ok, when it is
    over :data:`OFF_SCALE` times the random guess (``rules.baseline_loss``, or the labels'
    guess): a loss on another scale than the guess (summed over the batch), however short
    the run and whether or not it still fell; else None.

    Example:
        >>> s = RuleSettings(baseline_loss=1.0)
        >>> off_scale([{"step": k, "loss": 6000.0 - 10 * k} for k in range(1, 101)], s)["median"]
        5250.0
        >>> off_scale([{"step": k, "loss": 1.0 - k / 200} for k in range(1, 101)], s)
    """
    settings = flat_at_baseline.label_guess(history, settings)
    baseline = settings.baseline_loss
    last = history[-1].get("step") if history else None
    if not baseline or baseline <= 0 or not isinstance(last, (int, float)):
        return None
    late = [(int(h["step"]), float(h["loss"])) for h in history
            if isinstance(h.get("step"), (int, float)) and h["step"] >= last / 2
            and isinstance(h.get("loss"), (int, float)) and not isinstance(h["loss"], bool)
            and math.isfinite(h["loss"])]
    if len(late) < OFF_SCALE_REPORTS:
        return None
    median = statistics.median(v for _, v in late)
    if median <= OFF_SCALE * baseline:
        return None
    return {"median": median, "baseline": baseline, "from_step": late[0][0],
            "to_step": late[-1][0]}


def stale_quality(history: Sequence[Mapping[str, Any]], metric: str) -> str | None:
    """Said of a run whose quality ``metric`` was last reported before its last step (an
    evaluation every 25 steps in a 190-step run: the objective is step 175's), else None.

    Example:
        >>> stale_quality([{"step": 175, "val_loss": 0.5}, {"step": 190, "loss": 0.4}],
        ...               "val_loss")[:65]
        'stale_quality: val_loss was last reported at step 175 of 190, so '
    """
    at = [r.get("step") for r in history if isinstance(r.get(metric), (int, float))]
    last = history[-1].get("step") if history else None
    if not at or not isinstance(at[-1], int) or not isinstance(last, int) or at[-1] >= last:
        return None
    return (f"{STALE_QUALITY}: {metric} was last reported at step {at[-1]} of {last}, so that "
            "is the value judged; report it at the last step too")
