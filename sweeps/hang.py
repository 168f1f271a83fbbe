"""Stopping trials that stopped reporting (a hung data loader, a deadlock)."""

from __future__ import annotations

import time
from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from sweeps.book import TrialBook


class HangWatch:
    """Scheduler mixin: each controller step, stop RUNNING trials silent for ``timeout`` s.

    Ray Tune's stoppers only see results, and a hung trial sends none; the
    scheduler is asked which trial to run on every step of the controller loop,
    so that is where the watch runs.
    """

    def watch(self, book: TrialBook, timeout: float | None) -> HangWatch:
        self._book, self._timeout, self._since = book, timeout, {}
        return self

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        if getattr(self, "_timeout", None):
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
                controller.stop_trial(trial)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_since"] = {}
        return state


class WatchedFIFO(HangWatch, FIFOScheduler):
    """FIFO scheduling with the hang watch."""


class WatchedASHA(HangWatch, ASHAScheduler):
    """ASHA with the hang watch."""
