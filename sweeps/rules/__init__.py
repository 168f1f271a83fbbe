"""Instability rules: pure functions of a trial's metric history.

Each rule is ``check(history, settings) -> Verdict | None`` in its own module, where
``history`` is every metric dict the trainer reported so far, oldest first. The same
code runs inside the trial (after every report) and in the driver's Ray Tune stopper.
A rule looks only at the newest ``settings.window`` reports (plus, for divergence, the
first few losses of the run), so each call costs O(window), and a rule that lacks the
metrics it needs returns None. See ``docs/rules.md``.

Example:
    >>> history = [{"step": 0, "loss": 2.3}, {"step": 1, "loss": float("nan")}]
    >>> evaluate(history).summary()
    'non_finite at step 1: metric=loss, value=nan'
    >>> evaluate(history[:1]) is None
    True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sweeps.rules import (
    collapse,
    dead_gradient,
    divergence,
    flat_at_baseline,
    grad_blowup,
    loss_spike,
    lr_anomaly,
    non_finite,
)
from sweeps.rules._history import newest_step, step_of
from sweeps.rules.settings import CHECK_NAMES, RULE_NAMES, WARNING_NAMES, RuleSettings
from sweeps.rules.verdict import REASONS, Verdict

History = Sequence[Mapping[str, Any]]
Rule = Callable[[History, RuleSettings], Verdict | None]
WarningCheck = Callable[[History, RuleSettings], dict[str, Any] | None]

#: Failure rules by name (= verdict reason), in priority order: the first that fires wins.
RULES: dict[str, Rule] = {
    "non_finite": non_finite.check,
    "grad_blowup": grad_blowup.check,
    "divergence": divergence.check,
    "flat_at_baseline": flat_at_baseline.check,
    "loss_spike": loss_spike.check,
    "collapse": collapse.check,
    "lr_anomaly": lr_anomaly.check,
}
#: Warning-level checks by name: reported, never stop a trial, off unless enabled.
WARNINGS: dict[str, WarningCheck] = {
    "dead_gradient": dead_gradient.check,
    "frequent_clipping": grad_blowup.check_clipping,
}

_DEFAULTS = RuleSettings()


def evaluate(history: History, settings: RuleSettings | None = None) -> Verdict | None:
    """The verdict of the first enabled rule that fires on ``history``, or None.

    Call it after every report: the verdict's step is the newest report's step.

    Example:
        >>> history = [{"step": s, "grad_norm": 1.0} for s in range(10)]
        >>> evaluate(history + [{"step": 10, "grad_norm": 4.2e8}]).reason
        'grad_blowup'
    """
    settings = settings or _DEFAULTS
    if not history:
        return None
    for name in settings.active_rules():
        verdict = RULES[name](history, settings)
        if verdict is not None:
            return verdict
    return None


#: Fewest steps and reports a history needs before :func:`diagnose` judges it.
DIAGNOSE_MIN_STEPS, DIAGNOSE_MIN_REPORTS = 20, 10


def diagnose(history: History, settings: RuleSettings | None = None) -> Verdict | None:
    """What the rules see in a history that ended before their windows closed (a trial the
    scheduler pruned): :func:`evaluate` with every patience shortened to what the history
    covers, and collapse judged from the end of warmup. A diagnosis, not a stop: it says
    why a pruned trial trailed (e.g. flat at the baseline since step 0).

    Example:
        >>> flat = [{"step": s, "loss": 1.5708} for s in range(60)]
        >>> diagnose(flat, RuleSettings(baseline_loss=1.5708)).reason
        'flat_at_baseline'
    """
    settings = settings or _DEFAULTS
    history = _ending_judged(history)
    verdict = evaluate(history, settings)
    if verdict is not None or len(history) < DIAGNOSE_MIN_REPORTS:
        return verdict
    steps = newest_step(history) - max(step_of(history[0], 0), settings.warmup_steps)
    if steps < DIAGNOSE_MIN_STEPS:
        return _flat_through_warmup(history, settings)
    short = settings.model_copy(update={
        "flat_patience": min(settings.flat_patience, steps),
        "collapse_patience": min(settings.collapse_patience, len(history) // 2),
        "collapse_min_step": min(settings.collapse_min_step, settings.warmup_steps),
    })
    return evaluate(history, short) or _flat_in_second_half(history, settings, steps)


def _ending_judged(history: History) -> History:
    """``history`` ending on a report the rules judge: the validation-only reports after
    its last training ``loss`` (Lightning's and Hugging Face's evaluations, which a
    scheduler prunes on) folded into that report, so a run cut at an evaluation is judged
    on its training loss with what the evaluation said (its quality, its step).

    Example:
        >>> _ending_judged([{"step": 9, "loss": 1.2}, {"step": 9, "val_acc": 0.3}])
        [{'step': 9, 'loss': 1.2, 'val_acc': 0.3}]
    """
    last = next((i for i in range(len(history) - 1, -1, -1)
                 if history[i].get("loss") is not None), None)
    if last is None or last == len(history) - 1:
        return history
    folded = dict(history[last])
    for report in history[last + 1:]:
        folded.update({k: v for k, v in report.items() if k != "loss"})
    return [*history[:last], folded]


def _flat_in_second_half(history: History, settings: RuleSettings,
                         steps: int) -> Verdict | None:
    """A run that moved and then went back to the baseline, to sit there for the second
    half of the ``steps`` it ran after warmup (at least :data:`DIAGNOSE_MIN_STEPS`):
    ``flat_at_baseline`` over that half. A network that learnt, spiked and came back
    to the random guess for good trails for a reason (a BERT classifier at 0.53 by step
    25, a loss spike at step 33, then at ln 3 for the 60 steps to its cut).

    Example:
        >>> moved = [{"step": s, "loss": 1.0 if s < 25 else 1.5708} for s in range(1, 97)]
        >>> diagnose(moved, RuleSettings(baseline_loss=1.5708)).evidence["flat_since_step"]
        49
    """
    if not settings.is_enabled("flat_at_baseline") or steps < 2 * DIAGNOSE_MIN_STEPS:
        return None
    half = settings.model_copy(update={"flat_patience": min(settings.flat_patience,
                                                            steps // 2)})
    return flat_at_baseline.check(history, half)


def _flat_through_warmup(history: History, settings: RuleSettings) -> Verdict | None:
    """A run cut short inside (or just past) a warmup that covered most of it, whose loss
    sat at the baseline from its first report: ``flat_at_baseline`` with the warmup counted
    in (evidence ``through_warmup``). The LR rose and nothing moved: still a diagnosis.

    Example:
        >>> flat = [{"step": s, "loss": 1.5708} for s in range(1, 51)]
        >>> settings = RuleSettings(baseline_loss=1.5708, warmup_steps=44)
        >>> diagnose(flat, settings).evidence["through_warmup"]
        True
    """
    span = newest_step(history) - step_of(history[0], 0)
    if settings.warmup_steps <= 0 or span < DIAGNOSE_MIN_STEPS:
        return None
    whole = settings.model_copy(update={"warmup_steps": 0, "flat_patience": span})
    verdict = flat_at_baseline.check(history, whole)
    if verdict is None:
        return None
    return Verdict(verdict.reason, verdict.step, {**verdict.evidence, "through_warmup": True})


def warnings(history: History, settings: RuleSettings | None = None) -> list[dict[str, Any]]:
    """The enabled warning-level checks that start to hold at the newest report, as
    ``{"warning": name, "step": step, "evidence": {...}}`` dicts. Each warning comes
    once, on the report where it begins; warnings never stop a trial.

    Example:
        >>> settings = RuleSettings(enabled=["dead_gradient"])
        >>> history = [{"step": s, "dead_params": 1} for s in range(50)]
        >>> [w["warning"] for w in warnings(history, settings)]
        ['dead_gradient']
    """
    settings = settings or _DEFAULTS
    if not history:
        return []
    found = (WARNINGS[name](history, settings) for name in settings.active_warnings())
    return [w for w in found if w is not None]


__all__ = [
    "CHECK_NAMES",
    "REASONS",
    "RULES",
    "RULE_NAMES",
    "RuleSettings",
    "Verdict",
    "WARNINGS",
    "WARNING_NAMES",
    "diagnose",
    "evaluate",
    "warnings",
]
