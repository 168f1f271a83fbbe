"""Warnings about how a trainer is wired to ``report`` and ``Monitor``, from its reports.

Not instability: mistakes in the training loop that make the rules judge numbers that do
not mean what they should. Each warns once per trial, on the report where it shows:

* ``grad_norm`` 0 on every one of the first :data:`ZERO_REPORTS` reports: ``measure`` ran
  when no gradient was there (after ``optimizer.zero_grad()``, or before ``backward()``),
  or, when the gradients were there and all zero, the model is dead
  (:func:`zero_norm_cause`);
* ``zeroed_grads``: the gradients ``measure`` saw were all zero at ``optimizer.step()``
  (a ``clip_grad_norm_(params, 0)`` of the trainer's own, where 0 means "no clipping");
* ``clipped_before_measure``: ``monitor.clip()`` ran before ``measure`` in a step, so the
  norm measured is the clipped one;
* a step whose training measurement is reported again: ``report`` once per optimizer
  step (with gradient accumulation, after the optimizer step, not per micro-batch);
* ``frozen_params``: parameter tensors the optimizer holds have ``requires_grad`` False
  (a backbone frozen by accident: they never train, and no gradient shows it).

:func:`warmup_never_ran` reads a whole run: the ``warmup`` knob was above 0 and the LR
never changed (the trainer steps no LR scheduler, or does not read the knob's path).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: Reports carrying ``grad_norm`` that must all be 0 before it is called unmeasured.
ZERO_REPORTS = 5

ZERO_GRAD_NORM_PROBLEM = ("grad_norm was 0 on every report: no parameter had a gradient when "
                          "Monitor.measure ran (it runs after optimizer.zero_grad() or before "
                          "loss.backward(), or the loss reaches no parameter: an output "
                          ".detach()ed, a forward under torch.no_grad())")
ZERO_GRAD_NORM_FIX = ("call monitor.measure after loss.backward(), before clipping and "
                      "optimizer.zero_grad(); if it is there, build the loss from the "
                      "model's output without detaching it. The Lightning and Hugging Face "
                      "adapters measure just before the optimizer step: nothing may zero "
                      "the gradients between backward and that step (a zero_grad in "
                      "on_after_backward, in a callback or in a custom optimizer_step)")
ZERO_GRAD_NORM = f"{ZERO_GRAD_NORM_PROBLEM}: {ZERO_GRAD_NORM_FIX}"
DEAD_MODEL_PROBLEM = ("grad_norm was 0 on every report, with a gradient on the parameters "
                      "each time: the model is dead, its loss does not reach its parameters "
                      "(a zero-initialised layer after a ReLU, an output detached or "
                      "multiplied by 0), or Monitor.measure runs after "
                      "optimizer.zero_grad(set_to_none=False)")
DEAD_MODEL_FIX = ("check the model's initialisation and that its loss depends on its "
                  "parameters (`sweeps try FILE` prints dead_params on each report); measure "
                  "after loss.backward(), before optimizer.zero_grad()")
DEAD_MODEL = f"{DEAD_MODEL_PROBLEM}: {DEAD_MODEL_FIX}"
ZEROED_GRADS = ("every gradient was zero at optimizer.step() although Monitor measured them: "
                "something scaled them to zero in between, e.g. clip_grad_norm_(params, 0) "
                "(0 means no clipping here: skip the clip at 0, or call monitor.clip())")
CLIPPED_FIRST = ("monitor.clip() ran before monitor.measure(): the grad norm measured is the "
                 "clipped one, so grad_blowup and frequent_clipping see nothing: measure "
                 "first, then clip")
STEP_BACK = ("a step went backwards: the trial's history keeps the reports of a restarted "
             "run, so every report from that step on was replaced by the new ones (the rules "
             "and the report see the last stretch only); report one step counter that only "
             "grows, e.g. epoch * steps_per_epoch + i, not one per epoch")
FROZEN = ("parameter tensor(s) the optimizer holds have requires_grad=False, so they never "
          "train (a backbone frozen by accident?): unfreeze them, or leave them out of the "
          "optimizer when the freezing is meant")
STEP_AGAIN = ("a step was reported again: call report once per optimizer step (with "
              "gradient accumulation, after optimizer.step(), not per micro-batch)")


def grad_norms_all_zero(history: Sequence[Mapping[str, Any]],
                        least: int = ZERO_REPORTS) -> bool:
    """Whether at least ``least`` reports carry a ``grad_norm`` and every one is 0.

    Example:
        >>> grad_norms_all_zero([{"step": s, "grad_norm": 0.0} for s in range(5)])
        True
        >>> grad_norms_all_zero([{"step": 0, "grad_norm": 0.0}, {"step": 1, "grad_norm": 0.3}])
        False
    """
    zeros = 0
    for report in history:  # a measured gradient ends it at once (the common case)
        norm = report.get("grad_norm")
        if isinstance(norm, (int, float)):
            if norm:
                return False
            zeros += 1
    return zeros >= least


def zero_norm_cause(history: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """The problem and the fix of a run whose grad norm was 0 on every report: a dead model
    when ``Monitor`` measured gradients that were there (its reports carry ``dead_params``
    and never ``grads_absent``), else a measurement where there was no gradient.

    Example:
        >>> zero_norm_cause([{"grad_norm": 0.0, "dead_params": 4.0}])[0][:60]
        'grad_norm was 0 on every report, with a gradient on the para'
        >>> absent = {"grad_norm": 0.0, "dead_params": 4.0, "grads_absent": 1.0}
        >>> zero_norm_cause([absent])[0] == ZERO_GRAD_NORM_PROBLEM
        True
    """
    monitored = any("dead_params" in r for r in history)
    if monitored and not any(r.get("grads_absent") for r in history):
        return DEAD_MODEL_PROBLEM, DEAD_MODEL_FIX
    return ZERO_GRAD_NORM_PROBLEM, ZERO_GRAD_NORM_FIX


WARMUP_NEVER_RAN_FIX = ("step the LR scheduler once per optimizer step (scheduler.step() "
                        "after optimizer.step()), and point write_back.warmup at the key "
                        "your trainer builds its warmup from (`sweeps try FILE --set "
                        "warmup=50` shows the LR it reports)")


def warmup_never_ran(warmup: Any, history: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the reported LR shows no warmup of ``warmup`` steps, or None: at least two
    reports inside the warmup and one past it, and every reported ``lr`` the same (a
    schedule stepped per epoch changes later; one never stepped, or a warmup knob the
    trainer ignores, never does).

    Example:
        >>> warmup_never_ran(20, [{"step": s, "lr": 0.01} for s in range(1, 41)])[:33]
        'the LR was 0.01 on every report ('
        >>> warmup_never_ran(20, [{"step": s, "lr": min(1, s / 20) * 0.01} for s in range(1, 41)])
    """
    if not isinstance(warmup, (int, float)) or isinstance(warmup, bool) or warmup < 2:
        return None
    lrs = [(int(h.get("step", 0)), float(h["lr"])) for h in history
           if isinstance(h.get("lr"), (int, float)) and not isinstance(h.get("lr"), bool)]
    inside = [lr for step, lr in lrs if step < warmup]
    if len(inside) < 2 or not any(step > warmup for step, _ in lrs):
        return None
    values = [lr for _, lr in lrs]
    if max(values) - min(values) > 1e-12 * max(abs(max(values)), 1e-30):
        return None
    return (f"the LR was {values[0]:.3g} on every report ({len(values)} reports, steps "
            f"{lrs[0][0]}-{lrs[-1][0]}) with warmup {warmup:g}: no warmup ran, and no "
            "schedule moved the LR")


class WiringWatch:
    """The wiring warnings of one trial, each given once."""

    def __init__(self) -> None:
        self.given: set[str] = set()
        self._zero_norms = 0  # reports with grad_norm 0, while none had another

    def check(self, history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The warnings the newest report of ``history`` starts. A step reported again
        counts when both reports carry a training measurement (``grad_norm``): a
        validation report at the step of the training one (as the Lightning adapter
        sends) is fine."""
        if not history:
            return []
        newest = history[-1]
        step = int(newest.get("step", 0))
        found = []
        before = history[-2] if len(history) > 1 else None
        if before is not None and step < int(before.get("step", 0)):
            found.append(("step_back", f"{STEP_BACK} (step {step} after step "
                                       f"{int(before.get('step', 0))})"))
        elif before is not None and step == int(before.get("step", 0)) and \
                "grad_norm" in newest and "grad_norm" in before:
            found.append(("step_again", f"{STEP_AGAIN} (step {step} after step "
                                        f"{int(before.get('step', 0))})"))
        if newest.get("zeroed_grads"):
            found.append(("zeroed_grads", ZEROED_GRADS))
        if newest.get("clipped_before_measure"):
            found.append(("clipped_first", CLIPPED_FIRST))
        frozen = newest.get("frozen_params")
        if isinstance(frozen, (int, float)) and frozen > 0:
            found.append(("frozen_params", f"{int(frozen)} {FROZEN}"))
        norm = newest.get("grad_norm")
        if isinstance(norm, (int, float)) and self._zero_norms >= 0:
            self._zero_norms = self._zero_norms + 1 if norm == 0 else -1  # -1: never again
            if self._zero_norms == ZERO_REPORTS:
                found.append(("zero_grad_norm", ": ".join(zero_norm_cause(history))))
        out = []
        for kind, text in found:
            if kind not in self.given:
                self.given.add(kind)
                out.append({"warning": text, "step": step})
        return out
