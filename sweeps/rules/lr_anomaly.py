"""lr_anomaly: the LR actually in the optimizer does something no schedule should.

Five kinds, named in the evidence's ``kind``:

* ``invalid_lr``: the LR is negative or non-finite (e.g. a polynomial decay run
  past its end), at any step.
* ``zero_lr``: the LR is (near) 0 at a step >= ``warmup_steps``, when it dropped
  there abruptly or was never positive since the run started. An LR that decayed
  to 0 (cosine or linear to 0) is fine, and so is 0 at the very first report
  carrying an LR (a warmup starting at 0, e.g. ``LinearLR(start_factor=0)``).
* ``warm_restart``: after the LR started to decay (after warmup), it rose above
  ``lr_restart_factor`` x its lowest value since, by at least :data:`RESTART_FLOOR` of
  its peak, e.g. ``CosineAnnealingWarmRestarts``
  or ``CosineAnnealingLR`` stepped past ``T_max``. Skipped with ``allow_lr_restarts``.
* ``climbs_past_lr``: after warmup, the LR rose above ``lr_restart_factor`` x a
  reference: the larger of ``sampled_lr`` (the trial's lr knob) and the LR at the end of
  warmup (the first report carrying an LR at a step >= ``warmup_steps``), e.g. a
  cosine to an absolute ``min_lr`` above the sampled lr. OneCycleLR up to the sampled
  lr, and a trainer that scales the LR itself from the end of warmup on, are fine.
  Skipped without ``sampled_lr`` and with ``allow_lr_restarts``.
* ``vanished_lr``: after warmup, the LR fell below :data:`VANISHED` x its peak and has
  stayed there for longer than it took to fall from the peak: a schedule compounding on
  every step (``MultiplicativeLR`` where ``LambdaLR`` was meant, a per-epoch decay
  stepped per batch) that trains nothing from there on. A decay to 0 at the end of the
  run (cosine, linear) gets there only in its last steps, far sooner than it fell.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sweeps.rules._history import (
    finite_num,
    finite_values,
    newest_step,
    num,
    step_key,
    step_of,
)
from sweeps.rules.settings import RuleSettings
from sweeps.rules.verdict import Verdict

#: An LR below this is zero.
ZERO_LR = 1e-12
#: Relative changes smaller than this are float noise, not a decay or a restart.
NOISE = 1e-6
#: A restart must take the LR back up by at least this share of its peak: a rise from
#: 1e-8 to 4e-7 at the end of a OneCycleLR (the LR logged after the scheduler's last
#: step) is a rounding of the schedule's tail, not a restart; ``CosineAnnealingLR``
#: stepped past ``T_max`` climbs past it within 7 % of ``T_max``.
RESTART_FLOOR = 0.01
#: An LR below this share of its peak trains nothing (a cosine to 0 gets there only in
#: the last 0.06 % of its steps).
VANISHED = 1e-6
#: What makes an LR compound down to nothing, as the hints name it.
COMPOUNDING = ("a per-epoch decay such as StepLR or ExponentialLR stepped per batch, e.g. "
               "Lightning's interval 'step' for it; MultiplicativeLR where LambdaLR was meant")
#: Newest reports ``vanished_lr`` reads to find the LR's peak.
VANISHED_REPORTS = 5000
#: Reports spread over those that ``vanished_lr`` reads for its cheap first look when the
#: sweep samples no lr.
VANISHED_SAMPLES = 64


def check(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> Verdict | None:
    """Fail on an invalid LR, an abrupt or permanent zero LR after warmup, an
    unintended warm restart or an LR climbing past the sampled one (see the module
    docstring).

    Example:
        >>> lrs = [0.1, 0.05, 0.02, 0.01, 0.1]          # decay, then back up 10x
        >>> history = [{"step": s, "lr": lr} for s, lr in enumerate(lrs)]
        >>> check(history, RuleSettings()).evidence["kind"]
        'warm_restart'
    """
    if not history:
        return None
    n = len(history)
    lr = num(history[-1], "lr")
    if lr is None:
        return None
    now = newest_step(history)
    if not math.isfinite(lr) or lr < 0:
        return _verdict(now, {"kind": "invalid_lr", "lr": lr if lr < 0 else str(lr)})
    if now < settings.warmup_steps:
        return None
    first = max(0, n - settings.window)
    if lr < ZERO_LR:
        return _zero(history, first, lr, now, settings) or \
            _vanished(history, lr, now, settings)
    vanished = _vanished(history, lr, now, settings)
    if vanished is not None:
        return vanished
    if settings.allow_lr_restarts:
        return None
    return _restart(history, first, lr, now, settings) or _climb(history, lr, now, settings)


def _zero(
    history: Sequence[Mapping[str, Any]], first: int, lr: float, now: int, settings: RuleSettings
) -> Verdict | None:
    earlier = finite_values(history, "lr", first, len(history) - 1)
    if not earlier:
        return None
    peak, previous = max(earlier), earlier[-1]
    evidence: dict[str, Any] = {"kind": "zero_lr", "lr": lr, "previous_lr": previous}
    evidence.update(peak_lr=peak, warmup_steps=settings.warmup_steps)
    if previous < ZERO_LR:
        # Judged when it reached 0 -- unless it never left 0 since the run started.
        return _verdict(now, evidence) if peak < ZERO_LR and first == 0 else None
    decaying = len(earlier) >= 2 and previous < earlier[-2] and previous <= 0.5 * peak
    if decaying:
        return None
    top = max(finite_values(history, "lr", 0, len(history) - 1) or [peak])
    if previous < VANISHED * top:  # it crept down to 0, no abrupt drop: a compounding decay
        evidence["hint"] = (f"the LR fell from {top:.3g} to {lr:.3g} by step {now}: a "
                            f"schedule that compounds on every step ({COMPOUNDING}) trains "
                            "nothing from there")
    return _verdict(now, evidence)


def _vanished(
    history: Sequence[Mapping[str, Any]], lr: float, now: int, settings: RuleSettings
) -> Verdict | None:
    """``vanished_lr`` (see the module): below :data:`VANISHED` x the peak after warmup
    since step ``gone``, and for more steps than the fall from the peak took."""
    if lr >= VANISHED * 10 * _vanish_reference(history, settings):
        return None  # cheap on almost every report: the peak is seldom 10x the reference
    peak, peak_step, gone = 0.0, None, None
    # further back than the other kinds: a peak outside the window would make a long
    # decay to 0 look like a short fall
    for i in range(max(0, len(history) - VANISHED_REPORTS), len(history)):
        value, step = finite_num(history[i], "lr"), step_of(history[i], i)
        if value is None or step < settings.warmup_steps:
            continue
        if value > peak:
            peak, peak_step, gone = value, step, None
        elif value < VANISHED * peak:
            gone = step if gone is None else gone
        else:
            gone = None
    if gone is None or peak_step is None or now - gone <= max(gone - peak_step, 1):
        return None
    evidence: dict[str, Any] = {"kind": "vanished_lr", "lr": lr, "peak_lr": peak,
                                "peak_step": peak_step, "vanished_at_step": gone}
    evidence["hint"] = (f"the LR fell from {peak:.3g} to under {VANISHED:g}x that in "
                        f"{gone - peak_step} steps and stayed there {now - gone}: a schedule "
                        f"that compounds on every step ({COMPOUNDING}) trains nothing from "
                        "there")
    return _verdict(now, evidence)


def _vanish_reference(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> float:
    """What ``vanished_lr`` measures a peak against before it reads far back: the sampled
    lr, else the highest of the LR at the end of warmup, the window's LRs and
    :data:`VANISHED_SAMPLES` LRs spread over the reports it would read, in
    O(window + samples + log n) reads (a sweep without an lr knob, thousands of reports).
    """
    if settings.sampled_lr is not None:
        return settings.sampled_lr
    n = len(history)
    start = max(bisect.bisect_left(history, settings.warmup_steps, key=step_key),
                n - VANISHED_REPORTS)
    found = (finite_num(history[i], "lr") for i in range(start, n))
    seen = [next((v for v in found if v is not None), 0.0)]
    seen += finite_values(history, "lr", max(start, n - settings.window), n)
    stride = max(1, (n - start) // VANISHED_SAMPLES)
    seen += (v for i in range(start, n, stride) if (v := finite_num(history[i], "lr")))
    return max(seen)


def _restart(
    history: Sequence[Mapping[str, Any]], first: int, lr: float, now: int, settings: RuleSettings
) -> Verdict | None:
    n = len(history)
    previous = finite_values(history, "lr", max(first, n - 2), n - 1)
    if previous and lr <= previous[-1]:
        return None  # no rise on this report: a restart would have been seen on the rise
    peak, lowest, warmup = -math.inf, None, settings.warmup_steps
    for i in range(first, n - 1):
        value = finite_num(history[i], "lr")
        if value is None or step_of(history[i], i) < warmup:
            continue
        peak = max(peak, value)
        if lowest is not None:
            lowest = min(lowest, value)
        elif value < peak * (1 - NOISE):
            lowest = value
    if lowest is None or lr <= settings.lr_restart_factor * lowest or \
            lr - lowest <= RESTART_FLOOR * peak:
        return None
    evidence: dict[str, Any] = {"kind": "warm_restart", "lr": lr, "lowest_since_decay": lowest}
    evidence.update(peak_lr=peak, factor=settings.lr_restart_factor)
    if lowest > 0:
        evidence["ratio"] = lr / lowest
    evidence["hint"] = RESTART_HINT
    return _verdict(now, evidence)


#: Said with a warm_restart stop: the fix when the schedule restarts on purpose.
RESTART_HINT = ("if the schedule restarts on purpose (CosineAnnealingWarmRestarts, CyclicLR), "
                "set rules.allow_lr_restarts: true")


def _climb(
    history: Sequence[Mapping[str, Any]], lr: float, now: int, settings: RuleSettings
) -> Verdict | None:
    sampled, factor = settings.sampled_lr, settings.lr_restart_factor
    if sampled is None or lr <= factor * sampled:
        return None  # O(1) on almost every report
    # the first LR at a step >= warmup_steps (steps ascend); this report's, at the latest
    start = bisect.bisect_left(history, settings.warmup_steps, key=step_key)
    found = (finite_num(history[i], "lr") for i in range(start, len(history)))
    at_warmup = next((v for v in found if v is not None), lr)
    reference = max(sampled, at_warmup)
    if lr <= factor * reference:
        return None
    evidence: dict[str, Any] = {"kind": "climbs_past_lr", "lr": lr, "sampled_lr": sampled}
    evidence.update(reference=reference, ratio=lr / reference, step=now, factor=factor)
    return _verdict(now, evidence)


def still_warming(history: Sequence[Mapping[str, Any]],
                  settings: RuleSettings) -> dict[str, Any] | None:
    """Evidence that a run's warmup never ended, else None: at its end, at least twice its
    declared warmup past the start, its LR was under half the sampled lr and still rising
    (by more than :data:`WARMING_RISE` since twice the warmup), or had never risen at all
    (within :data:`WARMING_RISE` of the same value on every report: ``held``). A scheduler
    stepped per epoch where it counts steps gives either, by whether an epoch ended in the
    run; so does a warmup in other units. Said of a run that ended ok, not a stop: the run
    trained, at an LR it never meant. Needs ``warmup_steps`` (2 or more for ``held``) and
    ``sampled_lr``. Reports without an LR (validation's) are passed over.

    Example:
        >>> s = RuleSettings(warmup_steps=48, sampled_lr=0.25)
        >>> per_epoch = [{"step": k, "lr": 0.25 * (k // 40 + 1) / 48} for k in range(1, 201)]
        >>> still_warming(per_epoch, s)["share_of_lr"]
        0.125
        >>> long_epochs = [{"step": k, "lr": 0.25 / 48} for k in range(1, 201)]
        >>> still_warming(long_epochs, s)["held"]
        True
    """
    warm, sampled = settings.warmup_steps, settings.sampled_lr
    if not warm or sampled is None or not history:
        return None
    now = newest_step(history)
    late = bisect.bisect_left(history, 2 * warm, key=step_key)
    found = (finite_num(history[i], "lr") for i in range(late, len(history)))
    at_twice = next((v for v in found if v is not None), None)
    # the newest report with an LR: a validation report may carry none
    back = (finite_num(history[i], "lr") for i in range(len(history) - 1, late - 1, -1))
    last = next((v for v in back if v is not None), None)
    if at_twice is None or last is None or now < 2 * warm + 10 or not 0 < last < 0.5 * sampled:
        return None
    held = False
    if last <= at_twice * WARMING_RISE:  # not rising now: did it ever rise?
        lrs = [v for r in history if (v := finite_num(r, "lr")) is not None]
        held = warm >= 2 and min(lrs) > 0 and max(lrs) <= min(lrs) * WARMING_RISE
        if not held:
            return None
    return {"lr": last, "lr_at_twice_warmup": at_twice, "warmup_steps": warm, "step": now,
            "sampled_lr": sampled, "share_of_lr": round(last / sampled, 4), "held": held}


def warming_text(found: Mapping[str, Any]) -> str:
    """:func:`still_warming`'s evidence for people."""
    where = f"lr {found['lr']:.3g} at step {found['step']}, {found['share_of_lr']:.0%} of the " \
            f"sampled {found['sampled_lr']:.3g}"
    if found.get("held"):
        return (f"{where}, where it was on every report: a warmup of {found['warmup_steps']} "
                "steps never raised it")
    return (f"{where}, up from {found['lr_at_twice_warmup']:.3g} at step "
            f"{2 * found['warmup_steps']}, twice the warmup")


#: How much the LR must have risen since twice the warmup for :func:`still_warming`.
WARMING_RISE = 1.25


def _verdict(step: int, evidence: dict[str, Any]) -> Verdict:
    return Verdict("lr_anomaly", step, evidence)
