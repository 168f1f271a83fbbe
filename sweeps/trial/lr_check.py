"""Does the trainer's LR follow the ``lr`` knob? Checked on the search trials as they end.

A ``write_back`` path the trainer never reads makes a whole sweep tune nothing. Where
the trainer reports ``lr`` (``sweeps.Monitor`` does), the search trials show it: the
reported peak LR scales with the sampled ``lr`` (a warmup or decay schedule scales it
by the same factor in every trial). When trials whose sampled ``lr`` spans ten times or
more all report the same peak, the knob does not reach the optimizer.
"""

from __future__ import annotations

from collections.abc import Iterable

from sweeps.protocol import SEARCH
from sweeps.record import objectives
from sweeps.record.book import TrialRecord

#: Sampled LRs must span at least this factor before the check can tell.
MIN_SPAN = 10.0
#: Reported peaks within this relative band count as "the same LR".
SAME_PEAK = 0.1
MIN_TRIALS = 3


def peaks(records: Iterable[TrialRecord]) -> list[tuple[float, float]]:
    """``(sampled lr, reported peak lr)`` of every finished search trial that has both."""
    out = []
    for rec in records:
        sampled = rec.values.get("lr")
        reported = objectives.series(rec.history, "lr")
        if rec.role != SEARCH or not rec.finished or not reported or \
                not isinstance(sampled, (int, float)) or sampled <= 0 or max(reported) <= 0:
            continue
        out.append((float(sampled) * rec.lr_scale, max(reported)))
    return out


def lr_ignored(records: Iterable[TrialRecord]) -> str | None:
    """Why the trainer's LR does not follow the ``lr`` knob, or None (see the module doc)."""
    pairs = peaks(records)
    if len(pairs) < MIN_TRIALS:
        return None
    sampled = [s for s, _ in pairs]
    reported = [r for _, r in pairs]
    if max(sampled) / min(sampled) < MIN_SPAN:
        return None
    if max(reported) > min(reported) * (1 + SAME_PEAK):
        return None
    return (f"{len(pairs)} search trials sampled lr from {min(sampled):.3g} to "
            f"{max(sampled):.3g}, and every one reported the same optimizer LR (peak "
            f"{max(reported):.3g}): the trainer does not read the lr knob's write_back path")
