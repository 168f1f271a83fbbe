"""The ``report`` callable a trainer receives inside a trial.

It records each metrics dict, runs the instability rules on the history and
forwards the metrics (with the trial's status) to a sink: Ray Tune in a sweep,
the terminal in ``sweeps try``. When a rule fires it raises
:class:`TrialStopped` out of ``report`` so the trainer's loop ends on that very
step, even in a trainer that only calls ``report``. With ``observe=True`` (``sweeps
audit``) it only records the first verdict and never stops the trainer.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sweeps import rules
from sweeps.protocol import (
    CRASH,
    EVIDENCE_KEY,
    REASON_KEY,
    RUNNING,
    STATUS_KEY,
    STOP_STEP_KEY,
    UNSTABLE,
    WARNING_KEY,
)
from sweeps.rules.settings import RuleSettings
from sweeps.rules.verdict import Verdict
from sweeps.trial import horizon
from sweeps.trial.wiring import WiringWatch


class TrialStopped(BaseException):  # noqa: N818 - a control-flow signal, like GeneratorExit
    """Raised out of ``report`` to end a trial a rule judged unstable.

    A ``BaseException`` so that a trainer's ``except Exception`` cannot swallow it.
    """

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.summary())
        self.verdict: Verdict | None = verdict


class TrialHeld(TrialStopped):
    """Raised out of ``report`` to end a run that asked only whether it is stable (an LR
    probe), once the rules' windows closed with no verdict (:mod:`sweeps.trial.horizon`):
    it held. A :class:`TrialStopped`, so a trainer's clean-up for a stop runs for it too;
    its ``verdict`` is None."""

    def __init__(self, step: int) -> None:
        BaseException.__init__(self, f"held at step {step}: stable through every window")
        self.verdict = None
        self.step = step


def _number(value: Any) -> Any:
    """Plain Python scalars for what Ray and CSV files store: an int past a float's range
    is ±inf (Ray Tune turns every metric into a float, and that overflow ended the whole
    sweep), another real number (a ``Fraction``) its float."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            return str(value)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (float, str)) or value is None:
        return value
    if isinstance(value, numbers.Real):  # an int, a Fraction, ...
        try:
            as_float = float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
        return value if isinstance(value, int) else as_float
    return str(value)


#: Distinct metric keys a trial keeps: the first this many it reports (and the keys the
#: rules and objectives read, whenever they come); later keys are dropped with one warning.
#: Every key costs the driver, Ray Tune and MLflow a column: 100 000 keys took 4 minutes.
MAX_METRIC_KEYS = 1000
#: Keys kept past the bound: what the rules, the report and the step time read.
CORE_KEYS = frozenset({"step", "step_time", "loss", "val_loss", "grad_norm", "lr",
                       "nonfinite_grads", "dead_params", "zeroed_grads", "clipped",
                       "clipped_before_measure",
                       "pred_std", "target_std"})
#: Dropped keys a warning names (it counts the rest).
SHOWN_DROPPED = 5


class MetricKeys:
    """The metric keys a trial keeps: the first ``limit`` distinct keys it reports, and
    those in ``always`` (the core keys and the trainer's objectives) whenever they come."""

    def __init__(self, always: Sequence[str] = (), limit: int = MAX_METRIC_KEYS) -> None:
        self.always = CORE_KEYS | set(always)
        self.limit = limit
        self.kept: set[str] = set()
        self.warned = False

    def admit(self, entry: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """``entry`` without the keys past the bound, and those keys (in report order)."""
        if self.kept.issuperset(entry):  # the usual report: no key it has not seen
            return entry, []
        out: dict[str, Any] = {}
        dropped: list[str] = []
        for key, value in entry.items():
            if key in self.kept or key in self.always or len(self.kept) < self.limit:
                self.kept.add(key)
                out[key] = value
            else:
                dropped.append(key)
        return out, dropped

    def warning(self, dropped: list[str], step: int) -> dict[str, Any] | None:
        """The one warning of a trial that reported too many keys (None after the first)."""
        if not dropped or self.warned:
            return None
        self.warned = True
        shown = ", ".join(repr(k) for k in dropped[:SHOWN_DROPPED])
        more = f" and {len(dropped) - SHOWN_DROPPED} more" if len(dropped) > SHOWN_DROPPED else ""
        return {"warning": f"too many metric keys: only the first {self.limit} distinct keys "
                f"are kept; dropped {shown}{more} (and any new key after them)", "step": step}


def bad_metric(entry: Mapping[str, Any], required: Sequence[str],
               step: int = 0) -> Verdict | None:
    """``bad_metric`` at ``step`` when a reported value (the step's own included) is not a
    real number, or a ``required`` metric (an objective) is reported as ``None``; other
    ``None`` values mean "not reported"."""
    for key, value in entry.items():
        if value is None and key not in required:
            continue
        if value is None or isinstance(value, str):
            shown = repr(value)[:80]
            return Verdict("bad_metric", step, {
                "metric": key, "value": shown,
                "error": f"{key!r} is {shown}; report real numbers (a float, an int or a "
                         "one-element tensor) and keep text out of report()"})
    return None


class TrialReporter:
    """Callable ``report(metrics)`` that judges every report with the rules.

    Args:
        settings: rule thresholds for this trial.
        sink: receives each result dict (metrics plus the ``sweeps/*`` keys).
        clock: time source, for the measured ``step_time`` fallback.
        observe: only watch: keep the first verdict in ``verdict`` (its report carries the
            ``sweeps/reason`` and ``sweeps/stop_step`` keys, its status stays ``running``)
            but never raise :class:`TrialStopped`, so the trainer runs to its end. Used by
            ``sweeps audit`` to see what a stopped trial would have become.
        required: metrics the trainer itself must report (the objectives it owns): a
            ``None`` there ends the trial as ``bad_metric``, like text anywhere.
        hold_max_steps: end the run with :class:`TrialHeld` once it has held for a run of
            this many steps (:func:`sweeps.trial.horizon.holds_now`); None runs it to its end.
    """

    def __init__(self, settings: RuleSettings, sink: Callable[[dict[str, Any]], None],
                 clock: Callable[[], float] = time.perf_counter,
                 checkpoint_sink: Callable[[dict[str, Any], Any], None] | None = None,
                 observe: bool = False, required: Sequence[str] = (),
                 hold_max_steps: int | None = None) -> None:
        self.settings = settings
        self.hold_max_steps = hold_max_steps
        self._after_warmup = 0
        self._reported: set[str] = set()
        self.required = tuple(required)
        self.observe = observe
        self.history: list[dict[str, Any]] = []
        self.verdict: Verdict | None = None
        self.warnings: list[dict[str, Any]] = []
        self.keys = MetricKeys(self.required)
        self.wiring = WiringWatch()
        self._sink = sink
        self._checkpoint_sink = checkpoint_sink
        self._clock = clock
        self._last_time = clock()
        self._last_step = 0
        #: The sink ended the trial (Ray Tune ends a stopped trial's thread with
        #: ``sys.exit`` inside ``report``): not the trainer's doing.
        self.ended_by_sink = False

    def __call__(self, metrics: Mapping[str, Any], checkpoint: Any = None) -> None:
        """Record, judge and forward one report; ``checkpoint`` is optional trainer state
        (anything ``torch.save`` takes) that a retried trial gets back."""
        if self.verdict is not None and (not self.observe or self.verdict.reason == "bad_metric"):
            raise TrialStopped(self.verdict)
        now = self._clock()
        entry, dropped = self.keys.admit({str(k): _number(v) for k, v in metrics.items()})
        step = entry.get("step")
        if not isinstance(step, (int, float)) or not math.isfinite(step):
            step = self._last_step + 1
        broken = bad_metric(entry, self.required, int(step))  # a step "5" too
        entry["step"] = int(step)
        if broken is not None:  # a crash even when only observing: nothing to judge
            self.verdict = broken
            entry = {k: v for k, v in entry.items() if isinstance(v, (int, float))}
            self.history.append(entry)
            self._forward(self._sink, {**entry, **unstable_fields(broken, status=CRASH)})
            raise TrialStopped(broken)
        entry = {k: v for k, v in entry.items() if v is not None}
        if "step_time" not in entry:
            steps = max(1, entry["step"] - self._last_step)
            entry["step_time"] = (now - self._last_time) / steps
        self._last_time, self._last_step = now, entry["step"]
        self.history.append(entry)
        observed = self.observe and self.verdict is not None  # only the first one counts
        verdict = None if observed else rules.evaluate(self.history, self.settings)
        result = dict(entry)
        result[STATUS_KEY] = RUNNING
        found = rules.warnings(self.history, self.settings) + \
            self.wiring.check(self.history)
        too_many = self.keys.warning(dropped, entry["step"])
        if too_many is not None:
            found = [*found, too_many]
        if found:
            self.warnings.extend(found)
            result[WARNING_KEY] = "; ".join(f"{w['warning']} at step {w['step']}" for w in found)
        if verdict is not None:
            self.verdict = verdict
            result.update(unstable_fields(verdict, status=RUNNING if self.observe
                                          else UNSTABLE))
        if checkpoint is not None and self._checkpoint_sink is not None and verdict is None:
            self._forward(self._checkpoint_sink, result, checkpoint)
        else:
            self._forward(self._sink, result)
        if verdict is not None and not self.observe:
            raise TrialStopped(verdict)
        self._after_warmup += entry["step"] > self.settings.warmup_steps
        self._reported.update(entry)
        if self.hold_max_steps is not None and verdict is None and self.verdict is None and \
                self._after_warmup % max(1, self.settings.smoothing // 4) == 0 and \
                horizon.holds_now(self.settings, self.hold_max_steps, self.history,
                                  self._after_warmup, self._reported):
            raise TrialHeld(entry["step"])

    def _forward(self, sink: Callable[..., None], *args: Any) -> None:
        try:
            sink(*args)
        except SystemExit:
            self.ended_by_sink = True
            raise


def unstable_fields(verdict: Verdict, status: str = UNSTABLE) -> dict[str, Any]:
    """The ``sweeps/*`` keys that mark a result as the end of a failed trial."""
    import json

    return {STATUS_KEY: status, REASON_KEY: verdict.reason, STOP_STEP_KEY: verdict.step,
            EVIDENCE_KEY: json.dumps(verdict.evidence, default=str)}
