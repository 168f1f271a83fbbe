"""ASHA against an LR schedule that decays to the run's end: a note when it cut configs
with a higher LR that were close behind the best.

ASHA compares trials at its rungs, part way through the run. Under a cosine or linear
decay to zero, a higher LR trails there (the decay has not yet brought its loss down)
and often ends best: a Lightning user's pendulum model swept with ASHA handed over a
config at 0.0135, while the high-LR cosine configs ASHA had cut reached 0.0126 when run
to their end. Plain Ray Tune + ASHA has the same bias; the sweep cannot know the ending
of a cut trial, but it can see the pattern and say so.
"""

from __future__ import annotations

from typing import Any

from sweeps.protocol import LOSS_AT_GUESS, OK, PRUNED, SEARCH
from sweeps.record import objectives
from sweeps.record.book import TrialBook, TrialRecord
from sweeps.rules._history import finite_num

#: The best trial's LR at its end, as a share of its peak, at most: the schedule decays.
DECAYED = 0.3
#: A cut trial's LR at its cut, as a share of its own peak, at least: its decay had
#: barely begun.
UNDECAYED = 0.5
#: A cut trial's quality at its cut behind the best trial's at the same step, at most
#: (:func:`~sweeps.record.objectives.quality_gap`): near enough to end ahead of it.
CLOSE = 0.25


def _lrs(rec: TrialRecord) -> list[tuple[int, float]]:
    return [(int(r.get("step", i)), v) for i, r in enumerate(rec.history)
            if (v := finite_num(r, "lr")) is not None]


def cut_before_decay(book: TrialBook) -> str | None:
    """The note, or None: with ASHA on and an ``lr`` knob, the best ``ok`` search
    trial's LR decayed to :data:`DECAYED` of its peak or less by its end, and ASHA cut
    (with no diagnosis of the rules) search trials sampled at a higher lr while their
    LR was still :data:`UNDECAYED` of its peak or more and their quality within
    :data:`CLOSE` of the best trial's at the same step."""
    sweep = book.sweep
    if sweep.spec.budget.scheduler != "asha" or "lr" not in sweep.space:
        return None
    first = sweep.objectives[0]
    search = [r for r in book.trials.values() if r.role == SEARCH]
    ok = [(q, r) for r in search if r.status == OK
          and (q := objectives.metric_value(r.history, first.metric)) is not None]
    if not ok:
        return None
    best = min(ok, key=lambda p: p[0] if first.mode == "min" else -p[0])[1]
    if any(w.startswith(LOSS_AT_GUESS) for w in best.warnings):
        return None  # nothing learnt: no LR ended better
    lrs = _lrs(best)
    if not lrs or not lrs[-1][1] <= DECAYED * max(v for _, v in lrs):
        return None
    baseline = sweep.quality_baseline
    kinds = _text_knobs(sweep.space, best)
    cut = [r for r in search if r.status == PRUNED and not r.flagged and
           all(r.values.get(k) == v for k, v in kinds.items()) and
           _number(r.values.get("lr")) > _number(best.values.get("lr")) and
           (own := _lrs(r)) and own[-1][1] >= UNDECAYED * max(v for _, v in own) and
           _close(r, best, first.metric, first.mode, baseline)]
    if not cut:
        return None
    ids = ", ".join(r.trial_id for r in cut[:3]) + (", …" if len(cut) > 3 else "")
    close = f"within {CLOSE:.0%} of it at the same step"
    shares = [own[-1][1] / max(v for _, v in own) for r in cut if (own := _lrs(r))]
    at = sorted({r.last_step for r in cut})
    return (f"ASHA cut {len(cut)} trial(s) ({ids}) sampled at a higher lr than the best "
            f"search trial's by its search run ({best.trial_id}, lr "
            f"{_number(best.values.get('lr')):.3g}) and {close}, at step(s) "
            f"{', '.join(map(str, at[:4]))}, where their LR was still at "
            f"{min(shares):.0%}-{max(shares):.0%} of its peak; the best trial's decayed to "
            f"{lrs[-1][1] / max(v for _, v in lrs):.0%} of its peak by its end. Under a "
            "schedule that decays to the end a higher LR trails at a rung and may end "
            "better: `budget.scheduler: none` (or a `budget.grace_steps` past most of the "
            "decay) lets such trials finish; `sweeps try FILE --set lr=...` runs one to "
            "its end")


def _text_knobs(space: dict[str, Any], best: TrialRecord) -> dict[str, Any]:
    """The best trial's values of the knobs that pick a kind of run by name (an optimizer,
    a Hydra config group's option): an lr is compared only within one kind (SGD's 0.03 is
    no higher LR than AdamW's 0.009)."""
    from sweeps.spec.space import Categorical

    return {k: best.values.get(k) for k, knob in space.items()
            if isinstance(knob, Categorical) and len(knob.choices) > 1
            and all(isinstance(c, str) for c in knob.choices)}


def _close(cut: TrialRecord, best: TrialRecord, metric: str, mode: str,
           baseline: float | None) -> bool:
    """Whether ``cut`` was within :data:`CLOSE` of ``best`` at its last report of
    ``metric`` (``best`` at that step or before): near enough that the end of its decay
    could have put it ahead."""
    mine = [(int(r.get("step", 0)), v) for r in cut.history
            if (v := finite_num(r, metric)) is not None]
    if not mine:
        return False
    step, value = mine[-1]
    theirs = [v for r in best.history if int(r.get("step", 0)) <= step
              and (v := finite_num(r, metric)) is not None]
    return bool(theirs) and objectives.quality_gap(value, theirs[-1], mode, baseline) <= CLOSE


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")

