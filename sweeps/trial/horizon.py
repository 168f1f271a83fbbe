"""When a run that asks only "is it stable?" has its answer: the rules' windows closed
and nothing is brewing.

The race's LR probe (a candidate at ``lr × confirm.lr_probe``) and the boundary probe
(``sweeps stability --probe``) want a verdict, not a quality. A run no rule stopped
*holds* once it is past the peak of its LR (the end of warmup) by every window the active
rules need before they can fire, past half of its steps, and quiet (:func:`quiet`): its
loss is not at the random guess, its
smoothed loss has not given back more than :data:`GIVEBACK` of its improvement nor
risen past :data:`RISE` × its lowest, and its grad norm has not grown past
:data:`NORM_GROWTH` × its level since warmup. A run that
is diverging slowly (on the linreg test trainer lr 0.8 loses a tenth of its progress by
step 40 and diverges at step 49 of 60) is not quiet, and runs on to a verdict or its end.

The hold is counted in reports as well as steps (a trainer that reports every 10 steps
needs 10× the steps to fill a 20-report window), so a sparse reporter holds later.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from sweeps.rules import collapse, flat_at_baseline
from sweeps.rules._history import History, finite_values, newest_finite
from sweeps.rules.settings import RuleSettings

#: A held run has run at least this share of its steps, whatever its windows.
HOLD_SHARE = 0.5
#: Not quiet: the smoothed loss gave back more than this share of its improvement
#: (from its first smoothed value to its lowest).
GIVEBACK = 0.1
#: Not quiet: the smoothed loss is above this many times its lowest (a positive loss).
RISE = 1.5
#: Not quiet: the median grad norm of the last ``smoothing`` reports is above this many
#: times the median since warmup.
NORM_GROWTH = 2.0


def _active(settings: RuleSettings, reported: Collection[str] | None) -> set[str]:
    """The active rules that can fire on a run reporting ``reported`` (None: any metric)."""
    active = set(settings.active_rules())
    if reported is not None and not {"pred_std", "target_std"} <= set(reported):
        active.discard("collapse")  # it judges pred_std against target_std only
    return active


def settle_reports(settings: RuleSettings, reported: Collection[str] | None = None) -> int:
    """Reports after warmup the active rules need before each of them could have fired
    (``reported``: the metrics the run reports; None counts every rule)."""
    active = _active(settings, reported)
    need = [settings.blowup_min_history + 1]
    if "divergence" in active:
        need.append(settings.smoothing + settings.divergence_patience)
    if "loss_spike" in active:
        need.append(max(settings.spike_window, settings.spike_min_history) + 1)
    if "collapse" in active:
        need.append(settings.collapse_patience)
    if "flat_at_baseline" in active and settings.baseline_loss is not None:
        need.append(settings.smoothing)
    return max(need)


def settle_step(settings: RuleSettings, reported: Collection[str] | None = None) -> int:
    """The step by which the active rules could have fired on a one-report-per-step run:
    the end of warmup plus the longest window in steps (``flat_patience`` counts steps,
    collapse starts at ``collapse_min_step``)."""
    warmup = settings.warmup_steps
    steps = [warmup + settle_reports(settings, reported)]
    active = _active(settings, reported)
    if "flat_at_baseline" in active and settings.baseline_loss is not None:
        steps.append(warmup + settings.flat_patience)
    if "collapse" in active:
        steps.append(max(settings.collapse_min_step, warmup) + settings.collapse_patience)
    return max(steps)


def hold_step(settings: RuleSettings, max_steps: int,
              reported: Collection[str] | None = None) -> int:
    """The step from which a run no rule stopped holds: :func:`settle_step`, at least
    :data:`HOLD_SHARE` of ``max_steps``, at most ``max_steps``."""
    return min(max_steps, max(settle_step(settings, reported),
                              math.ceil(HOLD_SHARE * max_steps)))


def quiet(history: History, settings: RuleSettings) -> bool:
    """Whether nothing is brewing in ``history`` (see the module): the smoothed loss kept
    all but :data:`GIVEBACK` of its improvement, the grad norm did not grow, the newest
    outputs are not collapsed (a plateau the ``collapse`` rule gives longer), and the
    loss is not at the random guess (a flat stretch ``flat_at_baseline`` may yet call)."""
    if _collapsed_now(history, settings):
        return False
    n = settings.smoothing
    losses = finite_values(history, "loss", 0, len(history))
    if _at_guess_now(history, losses, settings):
        return False
    if len(losses) >= n:
        smooth = [math.fsum(losses[i - n:i]) / n for i in range(n, len(losses) + 1)]
        best = min(smooth)
        gained = smooth[0] - best
        if smooth[-1] - best > GIVEBACK * max(gained, 1e-12 * abs(best), 1e-300) or \
                (best > 0 and smooth[-1] > RISE * best):
            return False
    start = next((i for i, h in enumerate(history)
                  if h.get("step", 0) > settings.warmup_steps), len(history))
    norms = finite_values(history, "grad_norm", start, len(history))
    if len(norms) >= 2 * n:
        recent = sorted(norms[-n:])[n // 2]
        level = sorted(norms)[len(norms) // 2]
        if recent > NORM_GROWTH * level:
            return False
    return True


def _at_guess_now(history: History, losses: list[float], settings: RuleSettings) -> bool:
    """Whether the newest smoothed loss (of ``losses``, the run's finite losses; of
    ``val_loss`` when it reported none) sits in ``flat_at_baseline``'s random-guess band
    or above it (:func:`~sweeps.rules.flat_at_baseline.at_guess`), and the quality
    objective does not show learning (:func:`~sweeps.rules.flat_at_baseline.quality_learnt`):
    that rule counts its patience from when the loss went flat, so its window may not have
    closed at the hold step. Never with the rule off."""
    if settings.baseline_loss is None or not settings.is_enabled("flat_at_baseline"):
        return False
    n = settings.smoothing
    newest = losses[-n:] or newest_finite(history, "val_loss", 0, n)
    return bool(newest) and \
        flat_at_baseline.at_guess(math.fsum(newest) / len(newest), settings) and \
        not flat_at_baseline.quality_learnt(history, settings, strict=True)


def _collapsed_now(history: History, settings: RuleSettings) -> bool:
    """Whether the newest report carrying ``pred_std`` and ``target_std`` (among the
    newest ``window``) has a ratio below ``collapse_ratio``; never with the ``collapse``
    rule disabled (the user said collapsed outputs are not a failure of theirs)."""
    if not settings.is_enabled("collapse"):
        return False
    for report in reversed(history[-settings.window:]):
        ratio = collapse.spread_ratio(report)
        if ratio is not None:
            return ratio < settings.collapse_ratio
    return False


def holds_now(settings: RuleSettings, max_steps: int, history: History,
              reports_after_warmup: int, reported: Collection[str] | None = None) -> bool:
    """Whether a run no rule stopped, with ``reports_after_warmup`` reports since its warmup
    ended, has held at its newest report: past :func:`hold_step` and every window's
    reports, and :func:`quiet`; the random guess the class labels show counts as a
    declared ``baseline_loss`` (:func:`~sweeps.rules.flat_at_baseline.label_guess`)."""
    settings = flat_at_baseline.label_guess(history, settings)
    step = int(history[-1].get("step", 0)) if history else 0
    return step >= hold_step(settings, max_steps, reported) and \
        reports_after_warmup >= settle_reports(settings, reported) and \
        quiet(history, settings)
