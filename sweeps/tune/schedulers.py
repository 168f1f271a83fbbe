"""Stopping trials that stopped reporting (a hung data loader, a deadlock)."""

from __future__ import annotations

import time
from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from sweeps.protocol import RUN_KEY, WARM_BEST_KEY
from sweeps.record.book import TrialBook
from sweeps.spec.space import warmup_steps
from sweeps.tune import compat


class HangWatch:
    """Scheduler mixin: each controller step, stop RUNNING trials silent for ``timeout`` s.

    Ray Tune's stoppers only see results, and a hung trial sends none; the
    scheduler is asked which trial to run on every step of the controller loop,
    so that is where the watch runs.
    """

    def __init__(self, book: TrialBook, timeout: float | None, **scheduler: Any) -> None:
        """``book``: the sweep's trials; ``timeout``: seconds without a report after which a
        running trial is stopped as hung (None: never); ``scheduler``: the Ray Tune
        scheduler's own arguments."""
        super().__init__(**scheduler)
        self._book, self._timeout = book, timeout
        self._since: dict[str, float] = {}

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        if self._timeout:
            self._check(tune_controller)
        return super().choose_trial_to_run(tune_controller)  # type: ignore[misc]

    def _check(self, controller: Any) -> None:
        now = time.monotonic()
        for trial in list(controller.get_live_trials()):
            if trial.status != Trial.RUNNING:
                self._since.pop(trial.trial_id, None)
                continue
            started = self._since.setdefault(trial.trial_id, now)
            rec = self._book.trials.get(trial.trial_id)
            last = max(started, rec.last_seen) if rec is not None else started
            if now - last > self._timeout and not (rec is not None and rec.finished):
                self._book.mark_hung(trial.trial_id, trial.config, now - last, self._timeout)
                compat.stop_hung_trial(controller, trial)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_since"] = {}
        return state


class WatchedFIFO(HangWatch, FIFOScheduler):
    """FIFO scheduling with the hang watch."""


#: ASHA's value for a failed trial at a rung (ASHA keeps "higher is better"; finite, so
#: percentiles over a rung stay defined).
_FAILED_AT_RUNG = -1e300


def is_rerun(trial: Trial) -> bool:
    """A re-run of the race (its config is one ``_run`` entry), not a search trial."""
    return isinstance((getattr(trial, "config", None) or {}).get(RUN_KEY), dict)


def is_warm_best(trial: Trial) -> bool:
    """An earlier sweep's best config that a warm start queued as a search trial."""
    return (getattr(trial, "config", None) or {}).get(WARM_BEST_KEY) is not None


class WatchedASHA(HangWatch, ASHAScheduler):
    """ASHA with the hang watch, counting failed trials at the rung they did not reach.

    ASHA lets the best 1/rf of the trials recorded at a rung go on. A trial the
    rules stop before a rung is never recorded there, so without this the stable
    trials alone compete for the same share and ASHA prunes them harder the more
    unstable the space is (on the vMF direction MLP most stable trials stopped at
    the first rung). An unstable or crashed trial is recorded as the worst value at
    the next rung after its last step, as it would have been had it run on.

    ASHA judges a search trial first ``grace_period`` steps after its own warmup (the
    ``warmup`` knob) has ended, at the highest rung it has passed by then: a trial is
    not cut while its LR is still rising (nor while the LR it reports still rises, for a
    warmup no knob describes), nor in the last tenth of its steps (at its last step it
    finished: ok, not pruned). The race's re-runs on fresh seeds are never judged by ASHA
    (they run their full length, or until a rule stops them), nor is an earlier sweep's
    best config a warm start queued first: its reports count at the rungs, and it runs
    on (a cut on a small gap, with few trials at the rung, would throw away what the
    earlier sweep found).
    """

    def __init__(self, book: TrialBook, timeout: float | None, **asha: Any) -> None:
        super().__init__(book, timeout, **asha)
        self._grace = int(asha.get("grace_period", 1))
        self._last = asha.get("max_t")  # a trial's last step

    def own_grace(self, trial: Trial) -> int:
        """The step from which ASHA judges ``trial``: its warmup plus the grace period."""
        warmup = (getattr(trial, "config", None) or {}).get("warmup")
        return self._grace + (warmup_steps(warmup, self._last or 0) or 0)

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        if not is_rerun(trial):
            super().on_trial_add(tune_controller, trial)
            self._replay(trial)

    def _replay(self, trial: Trial) -> None:
        """Record at the rungs what the book holds of ``trial`` (a resumed sweep: Ray Tune
        keeps no scheduler state, and ASHA with empty rungs cuts none of the trials still
        to run): each report ASHA would have judged, in order, and a failed trial's worst
        value at the next rung, as :meth:`on_trial_result` and :meth:`on_trial_complete`
        record them while the sweep runs."""
        rec = self._book.trials.get(trial.trial_id)
        if rec is None or not rec.history:
            return
        for entry in rec.history:
            step, value = entry.get("step"), entry.get(self._metric)
            if not isinstance(step, (int, float)) or not isinstance(value, (int, float)) \
                    or self._waits(trial, entry):
                continue
            super().on_trial_result(None, trial, {self._time_attr: step, self._metric: value})
        self._record_failed(trial)

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        if is_rerun(trial) or self._waits(trial, result):
            return TrialScheduler.CONTINUE
        action = super().on_trial_result(tune_controller, trial, result)
        if action == TrialScheduler.STOP and is_warm_best(trial):
            return TrialScheduler.CONTINUE  # recorded at the rung, left to run
        return action

    def _waits(self, trial: Trial, result: dict) -> bool:
        """Whether ASHA leaves this result of a search trial alone: before the trial's own
        grace (:meth:`own_grace`), in the last tenth of its steps (a cut there saves little
        and throws away a result nearly in), or while its LR still rises."""
        step = result.get("step")
        if not isinstance(step, (int, float)):
            return False
        return step < self.own_grace(trial) or \
            (self._last is not None and step >= self._last - self._last // 10) or \
            self.lr_rising(trial, step, result)

    def lr_rising(self, trial: Trial, step: float, result: dict) -> bool:
        """Whether the LR this result reports is above the one reported before it: a
        warmup the ``warmup`` knob does not describe (OneCycleLR's ``pct_start``, a
        scheduler's own fixed warmup) is still going, and ASHA waits for its end. A result
        with no LR (a validation report: the trainer reports its LR with the training
        loss) is judged by the last two LRs the trial reported up to its step."""
        rec = self._book.trials.get(trial.trial_id)
        if rec is None:
            return False
        last: tuple[float, float] | None = None  # (step, lr) of the newest LR up to step
        if isinstance(result.get("lr"), (int, float)):
            last = (step, result["lr"])
        for h in reversed(rec.history):  # newest first: two LRs end it
            at, lr = h.get("step"), h.get("lr")
            if not isinstance(at, (int, float)) or not isinstance(lr, (int, float)) or \
                    at > step:
                continue
            if last is None:
                last = (at, lr)
            elif at < last[0]:
                return last[1] > lr * (1 + 1e-9)
        return False

    def on_trial_remove(self, tune_controller: Any, trial: Trial) -> None:
        if not is_rerun(trial):
            super().on_trial_remove(tune_controller, trial)

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict) -> None:
        if is_rerun(trial):
            return
        self._record_failed(trial)
        super().on_trial_complete(tune_controller, trial, result)

    def _record_failed(self, trial: Trial) -> None:
        """A trial the rules stopped (or that crashed): the worst value at the next rung
        after its last step."""
        rec = self._book.trials.get(trial.trial_id)
        rungs = compat.asha_rungs(self, trial.trial_id)
        if rec is not None and rec.failed and rungs is not None:
            ahead = [(milestone, recorded) for milestone, recorded in rungs
                     if milestone > rec.last_step and trial.trial_id not in recorded]
            if ahead:  # rungs are in descending order: the last one is the next rung
                ahead[-1][1][trial.trial_id] = _FAILED_AT_RUNG
