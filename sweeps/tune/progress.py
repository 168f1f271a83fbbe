"""Progress while a sweep runs: a live panel on a terminal, plain lines elsewhere.

On a terminal (rich ``Live``): trials running and done, outcomes by status and
failure reason, the best stable quality so far, elapsed and estimated time
left, with one line printed above the panel per finished trial. Not on a
terminal (CI logs, files): just those lines, each followed by the tally.
"""

from __future__ import annotations

import math
import textwrap
import time
from collections import Counter
from typing import Any

from ray.tune import Callback
from rich.console import Console
from rich.live import Live
from rich.table import Table

from sweeps.protocol import BASE, CRASH, FINISHED_OK, OK, SEARCH, STABILITY, probe_role
from sweeps.record import objectives
from sweeps.record.book import TrialBook, TrialRecord
from sweeps.results.race import owner_of
from sweeps.terminal import console as make_console


def run_label(rec: TrialRecord) -> str:
    """What a re-run after the search is, for its line (`` (your base config, seed 3)``,
    `` (8a1f on seed 2)``, `` (8a1f at LR x2, seed 0)``); '' for a search or stability run.

    Example:
        >>> from sweeps.record.book import TrialRecord
        >>> run_label(TrialRecord("t", {}, 0, role="probe:8a1f", lr_scale=2.0))
        ' (8a1f at LR x2, seed 0)'
    """
    owner = owner_of(rec.role)
    if rec.role == BASE:
        return f" (your base config, seed {rec.seed})"
    if owner is None:
        return ""
    if rec.role == probe_role(owner):
        return f" ({owner} at LR x{rec.lr_scale:g}, seed {rec.seed})"
    return f" ({owner} on seed {rec.seed})"

class ProgressLines(Callback):
    """Ray Tune callback that shows the sweep's progress (see the module docstring).

    ``muted`` (class-wide) silences it: a resumed run gets back the callbacks the run it
    continues was started with, and ``sweeps resume --quiet`` must still print nothing.
    """

    muted = False

    def __init__(self, book: TrialBook, total: int | None, console: Console | None = None,
                 live: bool | None = None, stage: str | None = None) -> None:
        self.book = book
        self.total = total
        self.stage = stage  # None: the search; else a confirmation stage's name or STABILITY
        self._console = console
        self._live_wanted = live
        self._live: Live | None = None
        self._last_draw = 0.0
        self.start = time.monotonic()
        self.first_result: float | None = None  # when training began (Ray, data, compile done)
        #: steps and finished trials before this process's first result (a resumed sweep's
        #: earlier runs, which took none of this process's wall time)
        self._before: tuple[int, int] = (0, 0)
        self.done = 0
        self.running = 0
        self.counts: Counter[str] = Counter()
        self.best: tuple[float, str] | None = None
        self._seen: set[str] = set()
        self._catch_up()

    def _catch_up(self) -> None:
        """Count the search trials that finished before this driver watched (a resumed
        sweep): the count goes on from them, and none is printed twice."""
        if self.stage is not None:
            return
        for rec in self.book.trials.values():
            if rec.role == SEARCH and rec.finished and rec.trial_id not in self._seen:
                self._seen.add(rec.trial_id)
                self.done += 1
                self.counts[rec.reason or rec.status] += 1
                self._update_best(rec)

    @property
    def console(self) -> Console:
        if self._console is None:
            self._console = make_console(stderr=True)  # trainer text printed as text
        return self._console

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_console"] = None  # a Console and a Live hold locks; Tune pickles callbacks
        state["_live"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled from Ray Tune's saved state (``sweeps resume``): catch up with the
        book, which holds what finished since that state was saved."""
        self.__dict__.update(state)
        self.__dict__.setdefault("_seen", set())
        self.start, self.first_result = time.monotonic(), None  # this process's clock
        self._before = (0, 0)
        self._catch_up()

    # -- Ray Tune hooks
    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        self.running = sum(1 for t in trials if t.status == "RUNNING")
        if not self.muted and self._use_live() and time.monotonic() - self._last_draw > 0.5:
            self._draw()

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        if self.first_result is None:
            self.first_result = time.monotonic()
            self._before = (self._all_spent(), self.done)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._finished(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._finished(trial)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        if self._live is not None:
            self.running = 0
            self._live.update(self.panel())
            self._live.stop()
            self._live = None

    # -- drawing
    def _use_live(self) -> bool:
        wanted = self._live_wanted
        return self.console.is_terminal if wanted is None else wanted

    def _draw(self) -> None:
        self._last_draw = time.monotonic()
        if self._live is None:
            self._live = Live(self.panel(), console=self.console, refresh_per_second=4,
                              transient=False)
            self._live.start()
        else:
            self._live.update(self.panel())

    def _finished(self, trial: Any) -> None:
        rec = self.book.trials.get(trial.trial_id)
        if rec is None or not rec.finished:  # closed by TrialEvents, called before this
            return
        if trial.trial_id in self._seen or self.muted:  # counted already (finished before
            return                                       # a resume), or quiet
        if self.stage is None and rec.role != SEARCH:  # a re-run of the race
            self.console.print(f"    race {rec.role} seed {rec.seed}: " + self.line(rec, False))
            return
        self._seen.add(rec.trial_id)
        self.done += 1
        self.counts[rec.reason or rec.status] += 1
        self._update_best(rec)
        self.console.print(self.line(rec))
        if self._use_live():
            self._draw()
        else:
            self.console.print(f"    {self.tally()}", style="dim")

    def _update_best(self, rec: TrialRecord) -> None:
        """The best quality so far; a probe run (the LR scaled) is not a config's result."""
        owner = owner_of(rec.role)  # a re-run: the candidate it re-runs, on which seed
        if rec.status != OK or not self.book.sweep.objectives or \
                (owner is not None and rec.role == probe_role(owner)):
            return
        first = self.book.sweep.objectives[0]
        value = objectives.metric_value(rec.history, first.metric)
        if value is None or not math.isfinite(value):
            return
        key = value if first.mode == "min" else -value
        if self.best is None or key < self.best[0]:
            who = f"{owner}, seed {rec.seed}" if owner else rec.trial_id
            self.best = (key, f"{first.metric} {value:.4g} ({who})")

    def line(self, rec: TrialRecord, counted: bool = True) -> str:
        knobs = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in rec.values.items())
        what = rec.status if not rec.reason else f"{rec.status} ({rec.reason} @ {rec.stop_step})"
        if rec.diagnosis:
            what += f" · {rec.diagnosis_text()}"
        if rec.status == CRASH and rec.evidence.get("error"):
            what += f": {textwrap.shorten(str(rec.evidence['error']), 200, placeholder=' …')}"
        if rec.compile_fallback:
            eager = textwrap.shorten(rec.compile_fallback, 120, placeholder=" …")
            what += f" · RAN EAGERLY: {eager}"
        if not counted:
            return f"{rec.trial_id} {what}"
        count = f"{self.done}/{self.total}" if self.total is not None else self.count()
        seed = f" seed {rec.seed}" if rec.role == STABILITY else ""
        return f"[{count}] {rec.trial_id}{run_label(rec)} {what}  {knobs}{seed}"

    def count(self) -> str:
        """``done/total`` trials, or trials done and steps spent of a step budget."""
        if self.total is not None:
            return f"{self.done}/{self.total} done"
        return f"{self.done} done, {self._all_spent()}/{self.step_budget} steps"

    @property
    def step_budget(self) -> int | None:
        return self.book.sweep.search_steps

    def eta(self, now: float | None = None) -> tuple[float, float]:
        """Seconds elapsed, and left (NaN until it can be told).

        Measured in training steps: the wall time per step since the first result (so
        Ray's start-up is not spread over what is left), times the steps still to run,
        the race's full-length re-runs included (:meth:`_steps_left`). Shown only once
        as many trials finished as run at once (the first to finish are the ones a
        scheduler or rule cut short)."""
        now = time.monotonic() if now is None else now
        elapsed = now - self.start
        rate = self._rate(now)
        if self.stage is not None:  # a confirmation stage: its own full-length runs
            if math.isnan(rate) or self.total is None:
                return elapsed, math.nan
            return elapsed, rate * max(0, self.total - self.done)
        if math.isnan(rate):
            return elapsed, math.nan
        return elapsed, rate * self._steps_left()

    def _all_spent(self) -> int:
        """Training steps every trial of the sweep ran so far, the race's re-runs included."""
        return self.book.steps_spent(role=None)

    def _steps_left(self) -> float:
        """Training steps still to run: of a step budget what is left of it (the race runs
        inside it); of a trial count the search's (:meth:`search_steps_left`) and the
        race's re-runs not yet run (``Sweep.confirm_steps`` less what re-runs ran)."""
        if self.total is None and self.step_budget:
            return max(0, self.step_budget - self._all_spent())
        reruns = self._all_spent() - self.book.steps_spent()
        return self.search_steps_left() + max(0, self.book.sweep.confirm_steps - reruns)

    def fragile_extra(self, now: float | None = None) -> float:
        """Seconds one more confirmation round would add (NaN until told; 0 in a stage):
        when candidates prove fragile the next ones on the list are confirmed in their
        place, within what is left of ``budget.total_steps``."""
        if self.stage is not None:
            return 0.0
        sweep = self.book.sweep
        steps = sweep.confirm_round_steps
        total = sweep.spec.budget.total_steps
        if total is not None:
            planned = self._all_spent() + self._steps_left()
            steps = max(0, min(steps, total - planned))
        return self._rate(time.monotonic() if now is None else now) * steps

    def _rate(self, now: float) -> float:
        """Wall seconds per training step since the first result: per trial in a
        confirmation stage (its runs are alike), per step in the search (NaN until
        ``budget.concurrent`` trials finished). Only what this process ran counts: a
        resumed sweep's earlier steps took none of its time."""
        training = now - self.first_result if self.first_result is not None else 0.0
        spent, done = self._all_spent() - self._before[0], self.done - self._before[1]
        if training <= 0 or done <= 0:
            return math.nan
        if self.stage is not None:
            return training / done
        if done < max(1, self.book.sweep.spec.budget.concurrent) or spent <= 0:
            return math.nan
        return training / spent

    def search_steps_left(self) -> float:
        """Training steps the search still runs: of a step budget, what is left of it; of a
        trial count, the trials not finished times the expected length of a trial (see
        :func:`expected_length`) less what the running ones already ran."""
        if self.total is None and self.step_budget:
            return max(0, self.step_budget - self._all_spent())
        search = [r for r in self.book.trials.values() if r.role == SEARCH]
        finished = [r.last_step for r in search if r.finished]
        running = [r.last_step for r in search if not r.finished]
        length = expected_length(finished, running, self.book.sweep.spec.budget.max_steps)
        unfinished = max(0, (self.total or 0) - len(finished))
        return max(0.0, unfinished * length - sum(running))

    def tally(self) -> str:
        counts = ", ".join(f"{k} {n}" for k, n in sorted(self.counts.items()))
        label = "best" if self.stage in (None, STABILITY) else "best fresh-seed run"
        best = f" | {label} {self.best[1]}" if self.best else ""
        return f"{counts}{best} | {self.time_text()}"

    def time_text(self, now: float | None = None) -> str:
        elapsed, left = self.eta(now)
        eta = "?" if math.isnan(left) else f"~{left:.0f}s"
        if self.stage is not None:
            return f"{self.stage}: elapsed {elapsed:.0f}s, {eta} left in this stage"
        extra = self.fragile_extra(now)
        more = f" (+~{extra:.0f}s if candidates prove fragile)" if extra >= 1 else ""
        return f"elapsed {elapsed:.0f}s, {eta} left with confirmation{more}"

    def panel(self) -> Table:
        table = Table(title=f"sweep {self.book.sweep.name}", show_header=False, box=None)
        table.add_column(style="bold")
        table.add_column()
        table.add_row("trials", f"{self.count()}, {self.running} running")
        by_status = {k: n for k, n in self.counts.items() if k in FINISHED_OK}
        table.add_row("finished", ", ".join(f"{k} {n}" for k, n in sorted(by_status.items()))
                      or "-")
        failed = {k: n for k, n in self.counts.items() if k not in FINISHED_OK}
        table.add_row("failed", ", ".join(f"{k} {n}" for k, n in sorted(failed.items()))
                      or "-")
        table.add_row("best so far", self.best[1] if self.best else "-")
        table.add_row("time", self.time_text())
        return table


def expected_length(finished: list[int], running: list[int], cap: int) -> float:
    """Mean length of a trial in steps, from the trials that finished and those still
    running (whose length is at least their step so far): the Kaplan–Meier mean, restricted
    to ``cap`` (``budget.max_steps``).

    The first trials to finish are the ones the rules or the scheduler cut short; a mean
    of the finished alone would say every trial is that short and the time left would be
    half the truth. Counting the running ones as "at least this long" corrects for it.

    Example:
        >>> expected_length([60, 60], [60, 60], cap=300)  # half stop at 60, half run on
        180.0
        >>> expected_length([60, 300, 300, 300], [], cap=300)
        240.0
    """
    if not finished and not running:
        return float(cap)
    mean, alive, last = 0.0, 1.0, 0
    for step in sorted(set(finished)):
        at_risk = sum(s >= step for s in finished) + sum(s >= step for s in running)
        mean += alive * (min(step, cap) - last)
        alive *= 1 - finished.count(step) / at_risk
        last = min(step, cap)
    return mean + alive * max(0, cap - last)
