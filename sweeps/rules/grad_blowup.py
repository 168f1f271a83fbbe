"""grad_blowup: the grad norm jumps far above its running median, or past an absolute cap.

Also home of the warning-level ``frequent_clipping`` check (the grad norm is over
the clip threshold on most steps), since both judge the pre-clipping grad norm.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import median
from typing import Any

from sweeps.rules import collapse, loss_spike
from sweeps.rules._history import finite_num, finite_values, newest_step, step_of
from sweeps.rules.settings import RuleSettings
from sweeps.rules.verdict import Verdict


def check(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> Verdict | None:
    """Fail when the newest ``grad_norm`` is over ``grad_norm_cap``, or over
    ``blowup_ratio`` x the median of the earlier finite grad norms in the window
    (at least ``blowup_min_history`` of them). A median of 0 is not judged, nor a run
    leaving a collapsed plateau whose norm is within the ratio of its starting one, nor a
    spike the clipper contained (:func:`contained`). An unclipped spike whose report's
    loss did not jump with it is judged on the next report, by the loss its step led to
    (:func:`_after_spike`).

    Example:
        >>> history = [{"step": s, "grad_norm": 1.0} for s in range(10)]
        >>> history.append({"step": 10, "grad_norm": 80.0})
        >>> check(history, RuleSettings()).summary()
        'grad_blowup at step 10: grad_norm=80, running_median=1, ratio=80, threshold=50, history=10'
    """
    if not history:
        return None
    norm = finite_num(history[-1], "grad_norm")
    if norm is None:
        return None
    cap = settings.grad_norm_cap
    if cap is not None and norm > cap:
        return _verdict(history, {"grad_norm": norm, "cap": cap})
    after = _after_spike(history, settings)
    if after is not None:
        return after
    evidence = _spike(history, len(history), settings)
    if evidence is None or _leaving_plateau(history, norm, settings) or \
            contained(history, settings) or _pending(history, settings):
        return None
    return _verdict(history, evidence)


def _spike(history: Sequence[Mapping[str, Any]], end: int,
           settings: RuleSettings) -> dict[str, Any] | None:
    """The evidence of a spike on report ``end - 1`` (its grad norm over ``blowup_ratio``
    x the median of the earlier ones in the window), else None."""
    norm = finite_num(history[end - 1], "grad_norm") if end > 0 else None
    if norm is None:
        return None
    earlier = finite_values(history, "grad_norm", max(0, end - settings.window), end - 1)
    if len(earlier) < settings.blowup_min_history:
        return None
    # Cheap exit (no sort): at least half the earlier norms are clearly >= norm / ratio,
    # so the median is too and the norm is within the ratio.
    bar = norm / settings.blowup_ratio * (1 + 1e-9)
    if len([v for v in earlier if v >= bar]) > len(earlier) // 2:
        return None
    med = median(earlier)
    if med <= 0 or norm <= settings.blowup_ratio * med:
        return None
    return {"grad_norm": norm, "running_median": med, "ratio": norm / med,
            "threshold": settings.blowup_ratio, "history": len(earlier)}


def _pending(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> bool:
    """Whether the newest report's spike is unclipped and its loss did not jump with it:
    the loss that comes of its step (the next report's) decides (:func:`_after_spike`).

    Unclipped, one spiking gradient moves the weights by its full size with SGD, but
    Adam-type optimisers divide it by a running RMS that the spike itself raises: a
    Hugging Face BERT classifier under AdamW without clipping spiked its grad norm 66x its
    running median on one step, its loss stayed in its range, and it trained on to an
    accuracy of 0.97 (it used to be stopped there and its config called fragile)."""
    if finite_num(history[-1], "clipped"):
        return False
    measured = loss_spike.jump(history, "loss", settings)
    return measured is not None and measured.ratio <= CONTAINED_LOSS_RATIO


def _after_spike(history: Sequence[Mapping[str, Any]],
                 settings: RuleSettings) -> Verdict | None:
    """A blowup on the newest report when the report before held a pending spike
    (:func:`_pending`) and this report's loss jumped past ``CONTAINED_LOSS_RATIO`` of its
    scale above its running median, or its grad norm spiked again (a run whose gradient
    keeps exploding, not one sharp batch); None otherwise (the step did no harm)."""
    n = len(history)
    if n < 2 or finite_num(history[-2], "clipped") or \
            finite_num(history[-2], "grad_norm") is None:
        return None
    spike = _spike(history, n - 1, settings)
    if spike is None:
        return None
    before = loss_spike.jump(history[: n - 1], "loss", settings)
    if before is None or before.ratio > CONTAINED_LOSS_RATIO:
        return None
    again = _spike(history, n, settings)
    if again is not None:
        return _verdict(history, {**again, "spike_step": step_of(history[-2], n - 2)})
    now = loss_spike.jump(history, "loss", settings)
    if now is None or now.ratio <= CONTAINED_LOSS_RATIO:
        return None
    return _verdict(history, {**spike, "spike_step": step_of(history[-2], n - 2),
                              "loss_ratio_after": now.ratio})


#: a clipped spike whose report's loss is at most this many of the loss's own scales above
#: its running median (``loss_spike``'s measure: ``loss / median`` for a settled positive
#: loss) was contained; the exploding gradients measured jumped the loss 6-750x
CONTAINED_LOSS_RATIO = 2.0


def contained(history: Sequence[Mapping[str, Any]], settings: RuleSettings) -> bool:
    """Whether the newest report's grad norm was clipped and its loss did not jump with it.

    Clipping bounds the step taken with a spiking gradient, so the spike alone moves the
    weights no further than any clipped step: a sharp batch, not an explosion. An
    exploding gradient shows in the loss of the same report (regression MLPs at lr 0.13-0.74:
    the loss 6-750x its running median on the report whose grad norm jumped 30-5000x, every
    one of them clipped); a vMF transformer clipped at 1 spiked its grad norm 16-56x its
    running median with the loss within 25 % of its own, and trained on (to val_loss
    0.65-1.07). Reports without ``clipped`` or ``loss`` are never contained.
    """
    if not finite_num(history[-1], "clipped"):
        return False
    measured = loss_spike.jump(history, "loss", settings)
    return measured is not None and measured.ratio <= CONTAINED_LOSS_RATIO


def _leaving_plateau(history: Sequence[Mapping[str, Any]], norm: float,
                     settings: RuleSettings) -> bool:
    """Whether the outputs sat collapsed on a plateau in the window (the ``collapse``
    rule's :func:`~sweeps.rules.collapse.plateau_since`) and ``norm`` is within
    ``blowup_ratio`` x the run's starting grad norm: a run leaving a plateau takes its
    gradient back from the plateau's low level to its own (a direction MLP: 0.16 on the
    plateau, 8.9 on leaving it, 0.64 at its start), not a blowup."""
    if not settings.is_enabled("collapse"):
        return False
    start = collapse.starting_grad_norm(history)
    if start is None or norm > settings.blowup_ratio * start:
        return False
    first = max(0, len(history) - settings.window)
    return collapse.plateau_since(history, settings, step_of(history[first], first))


def check_clipping(
    history: Sequence[Mapping[str, Any]], settings: RuleSettings
) -> dict[str, Any] | None:
    """Warn, on the report where it starts to hold, that more than ``clip_warn_fraction``
    of the reports carrying ``clipped`` in the window were clipped (at least
    ``clip_warn_min_reports`` of them): the clip threshold, not the LR, sets the step.

    Example:
        >>> history = [{"step": s, "clipped": 1.0} for s in range(20)]
        >>> check_clipping(history, RuleSettings())["warning"]
        'frequent_clipping'
    """
    newest = finite_num(history[-1], "clipped") if history else None
    if newest is None:
        return None
    n = len(history)
    first = max(0, n - settings.window)
    flags = finite_values(history, "clipped", first, n)
    clipped = len([f for f in flags if f > 0])
    share = _clip_share(clipped, len(flags), settings)
    # the same window one report earlier: drop the newest, add the report before `first`
    dropped = finite_values(history, "clipped", first - 1, first) if first else []
    before = clipped - (newest > 0) + len([f for f in dropped if f > 0])
    if share is None or _clip_share(before, len(flags) - 1 + len(dropped), settings) is not None:
        return None
    step = newest_step(history)
    evidence = {
        "clipped_fraction": share,
        "reports": len(flags),
        "threshold": settings.clip_warn_fraction,
    }
    return {"warning": "frequent_clipping", "step": step, "evidence": evidence}


def _clip_share(clipped: int, reports: int, settings: RuleSettings) -> float | None:
    """The clipped fraction when it is over the threshold (with enough reports), else None."""
    if reports < settings.clip_warn_min_reports:
        return None
    share = clipped / reports
    return share if share > settings.clip_warn_fraction else None


def _verdict(history: Sequence[Mapping[str, Any]], evidence: dict[str, Any]) -> Verdict:
    return Verdict("grad_blowup", newest_step(history), evidence)
