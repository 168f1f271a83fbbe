"""Progress lines while a sweep runs: one per finished trial, and a tally."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from ray.tune import Callback
from rich.console import Console

from sweeps.book import TrialBook


class ProgressLines(Callback):
    """Prints each trial's outcome as it ends, with running counts and best so far."""

    def __init__(self, book: TrialBook, total: int, console: Console | None = None) -> None:
        self.book = book
        self.total = total
        self._console = console
        self.start = time.monotonic()
        self.done = 0
        self.counts: Counter[str] = Counter()

    @property
    def console(self) -> Console:
        if self._console is None:
            self._console = Console(stderr=True, highlight=False, soft_wrap=True)
        return self._console

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_console"] = None  # a Console holds locks; Ray Tune pickles its callbacks
        return state

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._report(trial, error=False)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._report(trial, error=True)

    def _report(self, trial: Any, error: bool) -> None:
        rec = self.book.finish(trial.trial_id, trial.last_result, error)
        self.done += 1
        self.counts[rec.reason or rec.status] += 1
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * max(0, self.total - self.done)
        knobs = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in rec.values.items())
        what = rec.status if not rec.reason else f"{rec.status} ({rec.reason} @ {rec.stop_step})"
        tally = ", ".join(f"{k} {n}" for k, n in sorted(self.counts.items()))
        self.console.print(f"[{self.done}/{self.total}] {rec.trial_id} {what}  {knobs}")
        self.console.print(f"    {tally} | elapsed {elapsed:.0f}s, ~{eta:.0f}s left",
                           style="dim")
