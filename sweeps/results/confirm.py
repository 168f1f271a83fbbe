"""Confirmation: candidates re-run on fresh seeds and at LR × probe, judged robust or fragile.

A config is handed over only if it holds on seeds it was not picked on. Each
candidate (a search trial) is re-run on ``confirm.seeds`` new seeds and once at
``lr × confirm.lr_probe`` on its own seed. Its verdict:

- ``fragile``: a re-run ended unstable or crashed (or the LR probe did, with
  ``confirm.require_margin``), or its quality on its worst seed is more than
  ``confirm.tolerance`` worse than on its best seed: ``(worst - best) / (baseline -
  best)``, the share of the best seed's improvement over the random-guess loss that the
  worst seed gives up, when the quality objective has a ``baseline`` (default
  ``rules.baseline_loss``); ``(worst - best) / |best|`` otherwise;
- ``incomplete``: fewer re-runs were recorded than planned (e.g. 0 of 2);
- ``poor``: holds on every seed, but it is off the front (tried because better
  configs proved fragile) and its fresh-seed mean is more than ``confirm.tolerance``
  behind the best confirmed config's, or worse than the base config's own values on
  the fresh seeds both ran: stable, not good, so not handed over;
- ``confirmed``: every planned re-run recorded, stable, and within the tolerance;
- ``unconfirmed``: no confirmation seeds were planned (``confirm.seeds: 0``).

A failed LR probe is a narrow margin, not a verdict, and so is one that held but gave
up more than ``confirm.tolerance`` of the candidate's gain (:func:`narrow_probe`): such a
candidate must hold on ``confirm.narrow_seeds`` fresh seeds instead of ``confirm.seeds``
(:func:`ladder`).

Confirmed configs are ranked by their mean quality over the *fresh* seeds (the
search seed is where the config was picked for being good, so its value is
optimistic), the worst seed breaking ties: the order is what the user will get.
A candidate whose search trial the scheduler pruned is judged on its fresh seeds
alone (its search run was cut short, so its value is not comparable).
Most re-runs happen during the search (:mod:`sweeps.results.race`); :func:`select`
judges what they showed and settles more candidates after it, in raced rounds within
what is left of the budget, until ``confirm.keep`` hold. The base config's own knob
values are a search trial that races like any other; when they lie off the search
space they run on the same seeds after the search instead (``confirm.base``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sweeps.protocol import BASE as BASE_ROLE
from sweeps.protocol import (
    BASE_NOT_COMPARED,
    CRASH,
    FAILED,
    FLAT_PATIENCE_KEY,
    LOSS_AT_GUESS,
    LR_SCALE_KEY,
    NOT_TOLD_APART,
    OK,
    PRUNED,
    ROLE_KEY,
    SEARCH,
    SEED_KEY,
    WORSE_THAN_BASE,
    confirm_role,
    probe_role,
)
from sweeps.record import objectives
from sweeps.record.book import TrialBook, TrialRecord
from sweeps.spec.loader import Objective, Sweep
from sweeps.state.layout import CONFIRM_STAGE
from sweeps.terminal import shell_word
from sweeps.trial import horizon
from sweeps.trial.run import is_probe, trial_settings, trial_values

#: Verdicts under which a candidate is handed over.
HOLDS = ("confirmed", "unconfirmed")


def past_share(share: float, limit: float) -> str:
    """``share`` as a percentage with the decimals that show it is past ``limit`` (a gap
    of 20.5 % against a tolerance of 20 % is not "20 %").

    Example:
        >>> past_share(0.205, 0.2), past_share(0.31, 0.2), past_share(0.2004, 0.2)
        ('20.5%', '31%', '20.04%')
    """
    for places in range(4):
        text = f"{share:.{places}%}"
        if round(share * 100, places) != round(limit * 100, places):
            return text
    return text


@dataclass
class SeedRun:
    """One run of a config on one seed, as far as selection cares."""

    seed: int
    status: str
    reason: str | None
    stop_step: int | None
    quality: float | None
    last_step: int = 0

    @classmethod
    def of(cls, rec: TrialRecord, metric: str) -> SeedRun:
        step = rec.last_step if rec.status == PRUNED else rec.stop_step  # where it was cut
        return cls(rec.seed, rec.status, rec.reason, step,
                   objectives.metric_value(rec.history, metric), rec.last_step)

    def failure(self) -> str:
        return f"{self.reason or self.status} @ {self.stop_step}"


@dataclass
class Confirmation:
    """What the re-runs of one candidate showed, and its verdict."""

    trial_id: str
    quality: Objective
    tolerance: float
    planned: int
    search: SeedRun
    runs: list[SeedRun] = field(default_factory=list)
    probe_planned: bool = False
    probe: SeedRun | None = None
    lr_sensitivity: float | None = None
    #: How much of its own gain over the random guess the candidate gave up at LR × probe,
    #: when the probe held (:func:`probe_loss`): past ``tolerance`` the margin is narrow.
    probe_loss: float | None = None
    on_front: bool = True
    baseline: float | None = None
    #: The best holding candidate's fresh-seed mean, when this one is far behind it.
    poor_against: float | None = None
    #: A failed LR probe makes the candidate fragile (else it needs more fresh seeds).
    require_margin: bool = False
    #: (its mean, the base config's) on the fresh seeds both ran, when it is worse there.
    behind_base: tuple[float, float] | None = None
    #: Re-runs that crashed before their first step (the worker could not run them: an
    #: import, a path, a node lost), as ``seed N: error``: no evidence either way.
    never_ran: list[str] = field(default_factory=list)
    #: Mean quality on the fresh seeds every handed-over config ran, when some ran more
    #: (a narrow margin asks for more seeds): what the ranking compares (set by ``select``).
    shared_mean: float | None = None
    #: Those shared fresh seeds (empty when every handed-over config ran the same ones).
    shared_seeds: list[int] = field(default_factory=list)
    #: Why ``select`` ran no more of its ladder, for a racer it left open (others held
    #: ahead of it, or the budget ended): its reason says so, not just a count of runs.
    left_open: str | None = None
    #: Whether it is a search trial (its ``search`` run is on the search seed).
    searched: ClassVar[bool] = True

    @property
    def margin(self) -> str:
        """``wide`` (held at LR × probe), ``narrow (<reason> @ <step>)`` (failed there, or
        held but gave up more than ``tolerance`` of its gain), ``untested`` (no probe run
        yet, or none planned)."""
        if self.probe is None:
            return "untested"
        if self.probe.status != OK:
            return f"narrow ({self.probe.failure()})"
        if self.probe_loss is not None and self.probe_loss > self.tolerance:
            return (f"narrow (held, but {past_share(self.probe_loss, self.tolerance)} of "
                    f"its gain lost @ {self.probe.last_step})")
        return "wide"

    @property
    def narrow(self) -> bool:
        """Whether the LR probe ran and found the margin narrow (:attr:`margin`)."""
        return self.margin.startswith("narrow")

    # ---- per-seed figures
    @property
    def seeds(self) -> list[int]:
        """The confirmation seeds that were recorded."""
        return [r.seed for r in self.runs]

    @property
    def seed_status(self) -> list[str]:
        return [r.status for r in self.runs]

    @property
    def seeds_passed(self) -> int:
        return sum(r.status == OK for r in self.runs)

    @property
    def seed_reasons(self) -> list[str]:
        return [f"seed {r.seed}: {r.failure()}" for r in self.runs if r.status != OK]

    @property
    def probe_status(self) -> str | None:
        return self.probe.status if self.probe else None

    @property
    def probe_reason(self) -> str | None:
        return self.probe.reason if self.probe else None

    @property
    def by_seed(self) -> dict[int, float | None]:
        """Quality on every seed that ran: the search seed first, then the fresh ones."""
        return {r.seed: r.quality for r in [self.search, *self.runs]}

    def _values(self, fresh_only: bool) -> list[float]:
        runs = self.runs if fresh_only and self.runs else [self.search, *self.runs]
        return [r.quality for r in runs if r.status == OK and r.quality is not None
                and math.isfinite(r.quality)]

    @property
    def mean(self) -> float | None:
        """Mean quality over the fresh seeds (the search seed's when none ran)."""
        values = self._values(fresh_only=True)
        return statistics.fmean(values) if values else None

    @property
    def estimate(self) -> float | None:
        """Mean quality over every seed it ran stable, the search seed included: what the
        race ranks contenders by while their fresh seeds come in."""
        values = [r.quality for r in [self.search, *self.runs]
                  if r.status == OK and r.quality is not None]
        return statistics.fmean(values) if values else None

    def _extreme(self, worst: bool) -> float | None:
        values = self._values(fresh_only=False)
        if not values:
            return None
        return max(values) if (self.quality.mode == "min") == worst else min(values)

    @property
    def worst(self) -> float | None:
        """Quality on the worst seed that ran stable, the search seed included."""
        return self._extreme(worst=True)

    @property
    def best(self) -> float | None:
        return self._extreme(worst=False)

    @property
    def spread(self) -> float | None:
        """How much worse the worst seed is than the best (``objectives.quality_gap``)."""
        worst, best = self.worst, self.best
        if worst is None or best is None:
            return None
        return objectives.quality_gap(worst, best, self.quality.mode, self.baseline)

    # ---- verdict
    def _problem(self) -> tuple[str, str] | None:
        """(verdict, reason) when the candidate does not hold, else None.

        Fragility seen on the runs recorded so far is final (more seeds can only widen
        the gap), so it is checked before completeness: a candidate the screen rejected
        is ``fragile``, not ``incomplete``.
        """
        planned = self.planned + self.probe_planned
        done = len(self.runs) + (self.probe is not None)
        cut = (f" (settled by {done} of {planned} confirmation runs; the rest were not run)"
               if done < planned else "")
        failed = self.seed_reasons
        if failed:
            return "fragile", "unstable on a fresh seed: " + "; ".join(failed) + cut
        if self.require_margin and self.narrow and self.probe is not None:
            if self.probe.status != OK:
                return "fragile", f"LR probe unstable: {self.probe.failure()}"
            return "fragile", f"LR probe: margin {self.margin}"
        spread = self.spread
        if spread is not None and spread > self.tolerance:
            return "fragile", self._gap_text(spread) + cut
        if done < planned:
            never = f"; never ran: {'; '.join(self.never_ran)}" if self.never_ran else ""
            if self.left_open is not None:
                return "incomplete", (f"{self.left_open}; {done} of {planned} confirmation "
                                      f"runs recorded{never}")
            return "incomplete", f"only {done} of {planned} confirmation runs recorded{never}"
        unreported = [r.seed for r in [self.search, *self.runs] if r.quality is None]
        if unreported:
            return "incomplete", f"no {self.quality.metric} reported on seed(s) {unreported}"
        if self.poor_against is not None and self.mean is not None:
            gap = objectives.quality_gap(self.mean, self.poor_against, self.quality.mode,
                                         self.baseline)
            scale = objectives.gap_scale(self.poor_against, self.quality.mode, self.baseline)
            of = "" if scale == abs(self.poor_against) else \
                " of the best's improvement over the random guess"
            return "poor", (f"holds on every seed, but its mean {self.quality.metric} over "
                            f"fresh seeds, {self.mean:.4g}, is "
                            f"{past_share(gap, self.tolerance)}{of} behind the best "
                            f"confirmed config's {self.poor_against:.4g} (tolerance "
                            f"{self.tolerance:.0%}), and it is on no front that trades "
                            "quality for another objective")
        if self.behind_base is not None:
            mine, base = self.behind_base
            return "poor", (f"holds on every seed, but on the fresh seeds it shares with the "
                            f"base config its mean {self.quality.metric}, {mine:.4g}, is worse "
                            f"than the base config's {base:.4g}, and it is on no front that "
                            "trades quality for another objective")
        return None

    @property
    def fragile_reason(self) -> str | None:
        """Why the candidate is fragile or incomplete (None when it holds)."""
        problem = self._problem()
        return problem[1] if problem else None

    def _gap_text(self, spread: float) -> str:
        metric, seeds = self.quality.metric, self.by_seed
        worst_seed = next(s for s, v in seeds.items() if v == self.worst)
        best_seed = next(s for s, v in seeds.items() if v == self.best)
        scale = objectives.gap_scale(self.best, self.quality.mode, self.baseline)
        of = "worse" if scale == abs(self.best) else \
            "of its improvement over the random guess"
        return (f"seed {worst_seed}: {metric} {self.worst:.4g} against seed {best_seed}'s "
                f"{self.best:.4g}, {past_share(spread, self.tolerance)} {of} (tolerance "
                f"{self.tolerance:.0%})")

    @property
    def verdict(self) -> str:
        """confirmed | fragile | incomplete | poor | unconfirmed (see the module docstring)."""
        problem = self._problem()
        if problem is not None:
            return problem[0]
        return "confirmed" if self.planned > 0 else "unconfirmed"

    @property
    def confirmed(self) -> bool:
        return self.verdict == "confirmed"

    @property
    def holds(self) -> bool:
        """Handed over: confirmed, or unconfirmed because no seeds were planned."""
        return self.verdict in HOLDS

    @property
    def fresh_quality(self) -> dict[int, float]:
        """Quality on each fresh seed where it ran stable."""
        return {r.seed: r.quality for r in self.runs if r.status == OK
                and r.quality is not None and math.isfinite(r.quality)}

    def rank_key(self) -> tuple[float, float]:
        """Mean fresh-seed quality (on the seeds every handed-over config ran, when that
        is set), then the worst seed; smaller is better."""
        sign = 1.0 if self.quality.mode == "min" else -1.0
        mean = self.shared_mean if self.shared_mean is not None else self.mean
        worst = self.worst
        return (sign * mean if mean is not None else math.inf,
                sign * worst if worst is not None else math.inf)


@dataclass
class OwnBaseConfirmation(Confirmation):
    """The base config's own values run on the fresh seeds alone (a value lay off the
    search space, so they were no search trial), judged like any candidate: every run
    is a fresh seed (``search`` is the first of them, not a seed of its own)."""

    searched: ClassVar[bool] = False

    def _values(self, fresh_only: bool) -> list[float]:
        return [r.quality for r in self.runs if r.status == OK and r.quality is not None
                and math.isfinite(r.quality)]

    @property
    def by_seed(self) -> dict[int, float | None]:
        return {r.seed: r.quality for r in self.runs}

    @property
    def estimate(self) -> float | None:
        return self.mean


@dataclass
class BaseReference:
    """The base config's own knob values, run on the same seeds as the candidates."""

    values: dict[str, Any]
    quality: Objective
    runs: list[SeedRun] = field(default_factory=list)
    #: The search seed (the base config's search trial ran there, when it was one).
    search_seed: int | None = None
    #: The trial of its first run (its search trial, or its run on the first fresh seed).
    trial_id: str = ""

    @property
    def fresh(self) -> dict[int, float]:
        """Quality on each fresh seed where it ran stable."""
        return {r.seed: r.quality for r in self.runs if r.status == OK
                and r.quality is not None and r.seed != self.search_seed}

    @property
    def mean(self) -> float | None:
        """Mean over the fresh seeds where they ran stable (else every stable seed)."""
        ok = [r.quality for r in self.runs if r.status == OK and r.quality is not None]
        values = list(self.fresh.values()) or ok
        return statistics.fmean(values) if values else None

    @property
    def failures(self) -> list[str]:
        """Its runs that failed (unstable or crashed), as ``seed N: reason @ step``."""
        return [f"seed {r.seed}: {r.failure()}" for r in self.runs if r.status in FAILED]

    def not_compared(self) -> str | None:
        """Why no config is compared with it, when every run of it went unstable (its
        search trial was stopped, so it ran on no fresh seed); else None."""
        if self.mean is not None or not self.failures:
            return None
        return (f"your base config went unstable ({'; '.join(self.failures)}) and ran on no "
                f"fresh seed, so what the sweep hands over is {BASE_NOT_COMPARED} on fresh "
                "seeds; it is less safe than a config that held on every seed it ran")

    def summary(self) -> str:
        """Its mean, the fresh seeds it is over, and any run that failed or was cut."""
        seeds = sorted(self.fresh)
        over = (f"on fresh seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
                if seeds else "on the seeds it ran")
        text = f"mean {self.quality.metric} {self.mean:.4g} {over}"
        if self.failures:
            text += f" (unstable on {'; '.join(self.failures)})"
        cut = [f"seed {r.seed} @ {r.stop_step}" for r in self.runs if r.status == PRUNED]
        if cut:
            text += f" (cut by the scheduler for trailing on {'; '.join(cut)})"
        return text


@dataclass
class Selection:
    """Every candidate that was judged, in the order stable/ and pareto.csv use."""

    candidates: list[Confirmation]
    base: BaseReference | None = None
    steps: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: The search trial that ran the base config's own values, if one did.
    base_id: str | None = None
    #: Whether the step budget ended the settling of candidates (a note says so).
    budget_ended: bool = False

    def base_line(self) -> str | None:
        """Said when the top config is the user's own base config."""
        top = self.handed_over[0] if self.handed_over else None
        if top is None or top.trial_id != self.base_id:
            return None
        if not top.searched:
            return ("your base config held and nothing beat it: it is rank 1 "
                    f"({top.trial_id}); its own values lie off the search space, so the "
                    "search never ran them (it started at the nearest point): let the ranges "
                    "include them, or widen them, to look further")
        return ("your base config held and nothing beat it: it is rank 1 "
                f"({top.trial_id}); widen the search space to look further")

    @property
    def handed_over(self) -> list[Confirmation]:
        return [c for c in self.candidates if c.holds]

    @property
    def fragile(self) -> list[Confirmation]:
        return [c for c in self.candidates if not c.holds]

    def base_warning(self) -> str | None:
        """A loud line when the top config is no better than the base config's own values."""
        top = self.handed_over[0] if self.handed_over else None
        if top is None or self.base is None or self.base.mean is None or top.mean is None:
            return None
        q = top.quality
        worse = top.mean > self.base.mean if q.mode == "min" else top.mean < self.base.mean
        if not worse:
            return None
        return (f"the top config ({top.trial_id}) is {WORSE_THAN_BASE} on fresh "
                f"seeds: mean {q.metric} {top.mean:.4g} against the base config's "
                f"{self.base.mean:.4g}; keep your base config or widen the search")

    def base_tie(self) -> str | None:
        """A note when the top config leads the base config by less than either one's
        fresh seeds vary: on those seeds the two are not told apart."""
        top = self.handed_over[0] if self.handed_over else None
        if top is None or self.base is None or self.base.mean is None or top.mean is None \
                or top.trial_id == self.base_id:
            return None
        spread = max((max(v) - min(v) for v in (list(top.fresh_quality.values()),
                                                list(self.base.fresh.values())) if len(v) > 1),
                     default=None)
        lead = abs(top.mean - self.base.mean)
        if spread is None or lead >= spread or self.base_warning() is not None:
            return None
        return (f"the top config ({top.trial_id}) leads your base config by {lead:.3g} in mean "
                f"{top.quality.metric} on fresh seeds, less than the seeds vary ({spread:.3g}): "
                f"on these seeds the two are {NOT_TOLD_APART}; more seeds (confirm.seeds) or "
                "a wider search would")

    def baseline_warning(self, baseline: float | None) -> str | None:
        """A line when the base config's fresh-seed mean is worse than the quality
        objective's random-guess value ``baseline``: either it learns nothing in
        ``max_steps`` or ``baseline`` is not the random-guess value, and every quality gap
        (``confirm.tolerance``, ``poor``, ``sweeps audit``) is measured against it."""
        if baseline is None or self.base is None or self.base.mean is None:
            return None
        q, mean = self.base.quality, self.base.mean
        if (mean <= baseline) if q.mode == "min" else (mean >= baseline):
            return None
        return (f"the base config's mean {q.metric} on fresh seeds, {mean:.4g}, is worse than "
                f"the random-guess value {baseline:.4g} (objectives[0].baseline, else "
                "rules.baseline_loss): unless it learns nothing in budget.max_steps, that "
                "value is not what a random guess scores; set it right, as every quality gap "
                "(confirm.tolerance, poor, sweeps audit) is measured against it")


def fresh_seeds(sweep: Sweep, count: int | None = None) -> list[int]:
    """The confirmation seeds: the ones after the search seed (``confirm.seeds`` of them,
    or ``count``)."""
    n = sweep.spec.confirm.seeds if count is None else count
    return [sweep.spec.seed + 1 + k for k in range(n)]


def probes(sweep: Sweep, values: dict[str, Any]) -> bool:
    return sweep.spec.confirm.lr_probe > 0 and "lr" in values


def planned_seeds(sweep: Sweep, book: TrialBook, rec: TrialRecord) -> int:
    """Fresh seeds ``rec`` must hold on: ``confirm.seeds``, or ``confirm.narrow_seeds``
    once its LR probe found the margin narrow (:func:`narrow_probe`; more evidence, not a
    veto; with ``confirm.require_margin`` the probe is a veto instead). Never fewer than
    ``confirm.seeds``: a config unstable on one seed in three passes one fresh seed and
    the probe almost half the time."""
    conf = sweep.spec.confirm
    if conf.seeds == 0 or conf.require_margin:
        return conf.seeds
    for run in book.trials.values():
        if run.role == probe_role(rec.trial_id) and run.finished and \
                narrow_probe(sweep, rec, run):
            return max(conf.seeds, conf.narrow_seeds)
    return conf.seeds


def narrow_probe(sweep: Sweep, rec: TrialRecord, probe: TrialRecord) -> bool:
    """Whether ``rec``'s finished LR probe found a narrow margin: it did not hold, or it
    held but gave up more than ``confirm.tolerance`` of ``rec``'s gain over the random
    guess at the same step (:func:`probe_loss`). On the benchmarks the one held probe
    past 20 % (at 0.70 where its config stood at 0.19, random guess 1.57: 36 %) was of a
    config that failed 3 of 17 fresh seeds; no other lost more than 13 %
    (docs/benchmarks.md)."""
    if probe.status != OK:
        return True
    quality = sweep.objectives[0]
    lost = probe_loss(rec, probe, quality.metric, quality.mode, sweep.quality_baseline)
    return lost is not None and lost > sweep.spec.confirm.tolerance


def probe_loss(member: TrialRecord, probe: TrialRecord, metric: str, mode: str,
               baseline: float | None) -> float | None:
    """How much of ``member``'s gain over the random guess (``baseline``; of its |value|
    without one, :func:`~sweeps.record.objectives.quality_gap`) its held LR probe gave
    up, both at the probe's last step; negative when the probe did better, None when
    either reported no quality there."""
    own, new = at_probe_end(member, probe, metric)
    if own is None or new is None or not (math.isfinite(own) and math.isfinite(new)):
        return None
    return objectives.quality_gap(new, own, mode, baseline)


def at_probe_end(member: TrialRecord, probe: TrialRecord,
                 metric: str) -> tuple[float | None, float | None]:
    """``metric`` of ``member`` and of its LR probe, both at the probe's last step (a probe
    holds once the rules could tell, :mod:`sweeps.trial.horizon`, often before the end)."""
    upto = probe.last_step
    own = objectives.metric_value([h for h in member.history if h.get("step", 0) <= upto],
                                  metric)
    return own, objectives.metric_value(probe.history, metric)


def ladder(sweep: Sweep, book: TrialBook, rec: TrialRecord) -> list[dict[str, Any]]:
    """The re-runs ``rec`` still lacks, in the order they are run: the first fresh seed (the
    screen), the LR probe, the other fresh seeds (``confirm.narrow_seeds`` of them once the
    probe failed). A run that was started (finished or not) is not listed again."""
    started_seeds, probe = set(), None
    for run in book.trials.values():
        if run.role == confirm_role(rec.trial_id):
            started_seeds.add(run.seed)
        elif run.role == probe_role(rec.trial_id):
            probe = run
    seeds = fresh_seeds(sweep, planned_seeds(sweep, book, rec))
    missing = [s for s in seeds if s not in started_seeds]
    patience = fresh_flat_patience(sweep, rec) if missing else None
    extra = {FLAT_PATIENCE_KEY: patience} if patience is not None else {}
    order: list[dict[str, Any]] = [
        {**rec.values, SEED_KEY: s, ROLE_KEY: confirm_role(rec.trial_id), LR_SCALE_KEY: None,
         **extra}
        for s in missing]
    if probe is None and probes(sweep, rec.values):
        at = 1 if seeds and seeds[0] not in started_seeds else 0
        order.insert(at, {**rec.values, SEED_KEY: rec.seed,
                          LR_SCALE_KEY: sweep.spec.confirm.lr_probe,
                          ROLE_KEY: probe_role(rec.trial_id)})
    return order


def fresh_flat_patience(sweep: Sweep, rec: TrialRecord) -> int | None:
    """flat_at_baseline's patience on ``rec``'s fresh seeds: twice the step at which its
    own search run left the random guess (:func:`~sweeps.rules.flat_at_baseline.left_band_at`),
    when that is longer than the sweep's; else None. A config that learnt after a plateau
    is not called stuck on a seed whose plateau lasts a little longer."""
    from sweeps.rules.flat_at_baseline import left_band_at

    settings = trial_settings(sweep, rec.values)
    left = left_band_at(rec.history, settings)
    if left is None or 2 * left <= settings.flat_patience:
        return None
    return 2 * left


def run_cost(sweep: Sweep, run: dict[str, Any]) -> int:
    """Steps a re-run of :func:`ladder` may take: ``budget.max_steps``; an LR probe holds
    once the rules could tell (:func:`sweeps.trial.horizon.hold_step`)."""
    steps = sweep.spec.budget.max_steps
    if not is_probe(run):
        return steps
    return horizon.hold_step(trial_settings(sweep, trial_values(sweep, run)), steps)


def ladder_cost(sweep: Sweep, book: TrialBook, rec: TrialRecord) -> int:
    """Steps ``rec``'s missing re-runs may take (:func:`run_cost` of each)."""
    return sum(run_cost(sweep, run) for run in ladder(sweep, book, rec))


def plan(sweep: Sweep, book: TrialBook, batch: list[TrialRecord],
         stage: str = "all") -> list[dict[str, Any]]:
    """The re-runs ``batch`` still lacks (:func:`ladder`): "screen" the first fresh seed
    where it has not run, "all" every one."""
    runs: list[dict[str, Any]] = []
    for rec in batch:
        missing = ladder(sweep, book, rec)
        if stage == "screen":
            first = fresh_seeds(sweep)[:1]
            missing = [r for r in missing[:1] if r[SEED_KEY] in first
                       and r[ROLE_KEY] == confirm_role(rec.trial_id)]
        runs += missing
    return runs


def base_point(sweep: Sweep) -> dict[str, Any] | None:
    """The base config's own values of the searched knobs, when every one lies in the
    search space (then they are the search's first trial), else None."""
    from sweeps.spec.space import contains, optuna_space
    from sweeps.trial.tryout import try_values

    if not sweep.spec.confirm.base or sweep.base_unset:
        return None
    values = try_values(sweep, {})
    varying = optuna_space(sweep.space)
    if any(not contains(sweep.space[k], values[k]) for k in varying):
        return None
    return {k: values[k] for k in varying}


def nearest_base_point(sweep: Sweep) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """When the base config's own values lie off the search space only by numbers out of
    range (a ``weight_decay`` of 0 against a log range, say): the search space's point
    nearest them, and the base values it moved ({knob: base value}). The search starts
    there, so the sampler learns from your neighbourhood; the base config itself still
    runs on the fresh seeds (:func:`plan_base`). None when the base point is in the space,
    or a categorical value is not among its choices."""
    from sweeps.spec.space import off_space, optuna_space
    from sweeps.trial.tryout import try_values

    if not sweep.spec.confirm.base or sweep.base_unset:
        return None
    values = {k: v for k, v in try_values(sweep, {}).items() if k in optuna_space(sweep.space)}
    off = off_space(sweep.space, values)
    if not off or any(near is None for _, near in off.values()):
        return None  # in the space (the base point itself), or no nearest point
    return ({**values, **{k: near for k, (_, near) in off.items()}},
            {k: value for k, (value, _) in off.items()})


def base_trial(sweep: Sweep, book: TrialBook) -> TrialRecord | None:
    """The search trial that ran the base config's own values (the first one), or None."""
    point = base_point(sweep)
    if point is None:
        return None
    for rec in book.trials.values():
        if rec.role == SEARCH and all(rec.values.get(k) == v for k, v in point.items()):
            return rec
    return None


def plan_base(sweep: Sweep, book: TrialBook) -> list[dict[str, Any]]:
    """The base config's own knob values on every fresh seed, when they could not be a
    search trial (a value off the search space); none without fresh seeds
    (``confirm.seeds: 0`` re-runs nothing but the LR probes). Not on the search seed: the
    comparison with what the search hands over is on the fresh seeds."""
    from sweeps.trial.tryout import try_values

    if not sweep.spec.confirm.base or not sweep.spec.confirm.seeds or sweep.base_unset or \
            base_trial(sweep, book) is not None:
        return []
    done = {r.seed for r in book.trials.values() if r.role == BASE_ROLE}
    values = try_values(sweep, {})
    return [{**values, SEED_KEY: seed, ROLE_KEY: BASE_ROLE, LR_SCALE_KEY: None}
            for seed in fresh_seeds(sweep) if seed not in done]


def never_ran(run: TrialRecord) -> bool:
    """A re-run that crashed before its first step: the worker could not run the trainer
    (an import, a path, a lost node), which says nothing of the config on that seed."""
    return run.status == CRASH and not run.stop_step and run.last_step == 0


def judge(sweep: Sweep, book: TrialBook, rec: TrialRecord, on_front: bool) -> Confirmation:
    """The confirmation of one candidate, from the re-runs recorded in ``book``."""
    quality = sweep.objectives[0]
    conf = Confirmation(rec.trial_id, quality, sweep.spec.confirm.tolerance,
                        planned=sweep.spec.confirm.seeds,
                        search=SeedRun.of(rec, quality.metric),
                        probe_planned=probes(sweep, rec.values), on_front=on_front,
                        baseline=sweep.quality_baseline,
                        require_margin=sweep.spec.confirm.require_margin)
    for run in book.trials.values():
        if run.role in (confirm_role(rec.trial_id), probe_role(rec.trial_id)) and \
                run.finished and never_ran(run):
            error = str(run.evidence.get("error") or run.reason or "")[:200]
            kind = "LR probe" if run.role == probe_role(rec.trial_id) else "seed"
            conf.never_ran.append(f"{kind} {run.seed}: {error}")
        elif run.role == confirm_role(rec.trial_id) and run.finished:
            conf.runs.append(SeedRun.of(run, quality.metric))
        elif run.role == probe_role(rec.trial_id) and run.finished:
            conf.probe = SeedRun.of(run, quality.metric)
            conf.lr_sensitivity = _sensitivity(rec, run, quality.metric, quality.mode)
            if run.status == OK:
                conf.probe_loss = probe_loss(rec, run, quality.metric, quality.mode,
                                             sweep.quality_baseline)
    # never fewer than ran: a narrow margin's extra seeds stay counted when a wider
    # --tolerance later reads the probe as wide ("stable on 3/2 extra seeds")
    conf.planned = max(planned_seeds(sweep, book, rec), len(conf.runs))
    conf.runs.sort(key=lambda r: r.seed)
    return conf


def judge_own_base(sweep: Sweep, book: TrialBook,
                   ref: BaseReference | None) -> OwnBaseConfirmation | None:
    """The base config as a candidate when its values lay off the search space and it ran
    on the fresh seeds (:func:`plan_base`; ``ref``, its :func:`base_reference`): it holds
    or not like any config, so when it is the best that held it is what ``stable/``
    hands over. None otherwise."""
    if ref is None or not sweep.spec.confirm.base or base_trial(sweep, book) is not None:
        return None
    return OwnBaseConfirmation(ref.trial_id, ref.quality, sweep.spec.confirm.tolerance,
                               planned=len(fresh_seeds(sweep)), search=ref.runs[0],
                               runs=list(ref.runs), on_front=False,
                               baseline=sweep.quality_baseline,
                               require_margin=sweep.spec.confirm.require_margin)


def base_reference(sweep: Sweep, book: TrialBook) -> BaseReference | None:
    """The base config on the seeds it ran: its search trial and that trial's fresh-seed
    runs, or its own fresh-seed runs when it was off the search space."""
    trial = base_trial(sweep, book)
    if trial is not None and trial.finished:
        runs = [trial] + [r for r in book.trials.values() if r.finished
                          and r.role == confirm_role(trial.trial_id)]
    else:
        runs = [r for r in book.trials.values() if r.role == BASE_ROLE and r.finished]
    if not runs:
        return None
    quality = sweep.objectives[0]
    runs.sort(key=lambda r: (r.seed != sweep.spec.seed, r.seed))
    return BaseReference(dict(runs[0].values), quality,
                         [SeedRun.of(r, quality.metric) for r in runs], sweep.spec.seed,
                         runs[0].trial_id)


Runner = Callable[[list[dict[str, Any]], str], None]


def mark_poor(judged: list[Confirmation], base: BaseReference | None = None,
              base_id: str | None = None, trades: bool = True) -> int:
    """How many hold, once those far behind the best, or behind the base config, are
    marked ``poor``.

    A candidate off the front (a dominated or pruned search trial, tried because better
    ones proved fragile) that holds on every seed but whose fresh-seed mean is more than
    ``confirm.tolerance`` behind the best holding candidate's, or worse than the base
    config's (``base``, the search trial ``base_id``) on the fresh seeds both ran, is not
    handed over: it is stable, not good, and the user already has better. Front members
    trade quality for another objective and are kept (``trades``: the sweep has another
    objective; with quality alone the front is only the best search value, and is judged
    like the rest).
    """
    for c in judged:
        c.poor_against, c.behind_base = None, None
    holding = [c for c in judged if c.holds and c.mean is not None]
    if not holding:
        return 0
    best = min(holding, key=Confirmation.rank_key).mean
    for c in holding:
        if c.on_front and trades:
            continue
        if objectives.quality_gap(c.mean, best, c.quality.mode, c.baseline) > c.tolerance:
            c.poor_against = best
        elif base is not None and c.trial_id != base_id:
            c.behind_base = _behind(c, base)
    return sum(c.holds for c in judged)


def _behind(c: Confirmation, base: BaseReference) -> tuple[float, float] | None:
    """(c's mean, the base config's) on the fresh seeds both ran stable, when c's is worse;
    None when the base config failed a seed (what failed is no yardstick)."""
    if base.failures:
        return None
    theirs = base.fresh
    mine = {r.seed: r.quality for r in c.runs if r.status == OK and r.quality is not None}
    shared = sorted(set(theirs) & set(mine))
    if not shared:
        return None
    m, b = (statistics.fmean(d[s] for s in shared) for d in (mine, theirs))
    worse = m > b if c.quality.mode == "min" else m < b
    return (m, b) if worse else None


def affordable(sweep: Sweep, book: TrialBook, queue: list[TrialRecord], need: int) -> int:
    """How many of the next candidates a round may take: as many as the rest of
    ``budget.total_steps`` can re-run in full (``need`` without a step budget), after the
    base config's own runs still to come (:func:`plan_base`); one with nothing to re-run
    is taken even when the search spent past the budget."""
    budget = sweep.spec.budget
    if budget.total_steps is None:
        return need
    left = budget.total_steps - book.steps_spent(role=None) - \
        sum(run_cost(sweep, run) for run in plan_base(sweep, book))
    n = 0
    for rec in queue[:need]:
        cost = sum(run_cost(sweep, run) for run in plan(sweep, book, [rec]))
        if cost and cost > left:  # nothing to run (no seeds, no probe): always affordable
            break
        left -= cost
        n += 1
    return n


def by_estimate(sweep: Sweep, book: TrialBook,
                records: list[TrialRecord]) -> list[TrialRecord]:
    """``records`` by their mean quality over every seed they ran stable
    (:attr:`Confirmation.estimate`), best first; those with none last."""
    sign = 1.0 if sweep.objectives[0].mode == "min" else -1.0

    def key(rec: TrialRecord) -> float:
        value = judge(sweep, book, rec, on_front=True).estimate
        return math.inf if value is None else sign * value

    return sorted(records, key=key)


def raced(book: TrialBook, rec: TrialRecord) -> bool:
    """Whether ``rec`` has run (or runs) on a fresh seed or at LR × probe."""
    roles = (confirm_role(rec.trial_id), probe_role(rec.trial_id))
    return any(r.role in roles for r in book.trials.values())


def select(sweep: Sweep, book: TrialBook, ordered: list[TrialRecord], front: list[TrialRecord],
           run: Runner) -> Selection:
    """Judge the candidates the race settled and settle more until ``confirm.keep`` hold.

    Most candidates were raced during the search (:mod:`sweeps.results.race`); what is
    left runs here, in rounds, as Ray Tune experiments ``run(configs, name)`` records in
    ``book``: candidates whose race the budget cut first, then the next ones in
    ``ordered`` (the trials ASHA cut with no diagnosis among them), each round screening
    on the first fresh seed, then running the rest of :func:`ladder` for those still
    standing (twice: a failed LR probe asks for more seeds). A round takes as many as the
    rest of ``budget.total_steps`` can re-run in full; when nothing the search found holds
    yet (the base config aside), the first candidate is settled even past the budget, so
    a run hands over what holds.
    """
    conf = sweep.spec.confirm
    on_front = {r.trial_id for r in front}
    trades = len(sweep.objectives) > 1  # a front member trades quality for something
    base = base_trial(sweep, book)
    if base is not None and base.finished and not base.flagged and base not in ordered:
        ordered = [base, *ordered]
    # the raced ones by what their seeds showed (the race's leader first), so the one
    # settled past the budget, when nothing holds yet, is the best by the evidence
    started = by_estimate(sweep, book, [r for r in ordered if raced(book, r)])
    fresh = [r for r in ordered if not raced(book, r)]
    queue = started + fresh[:max(0, conf.max_candidates - len(started))]
    notes: list[str] = []
    stage_no = 0

    def run_stage(runs: list[dict[str, Any]]) -> None:
        nonlocal stage_no
        if runs:
            stage_no += 1
            run(runs, CONFIRM_STAGE if stage_no == 1 else f"{CONFIRM_STAGE}-{stage_no}")

    def verdict(rec: TrialRecord) -> Confirmation:
        return judge(sweep, book, rec, rec.trial_id in on_front)

    settled = [(r, verdict(r)) for r in started]
    judged = [c for r, c in settled if not plan(sweep, book, [r]) or c.verdict == "fragile"]
    done = {c.trial_id for c in judged}
    queue = [r for r in queue if r.trial_id not in done]
    base_runs = plan_base(sweep, book)
    base_id = base.trial_id if base is not None else None

    def found() -> int:
        """Configs the search found that hold (the base config is apart), or that held
        but are poor (far behind the best, or behind the base config): the candidates
        come in order of their search value, so those after one that trails are unlikely
        to beat it."""
        mark_poor(judged, base_reference(sweep, book), base_id, trades)
        return sum(c.holds or c.poor_against is not None or c.behind_base is not None
                   for c in judged if c.trial_id != base_id)

    budget_ended = False

    def base_open() -> bool:
        """The base config (the search's first trial) still waits in the queue: it is
        settled even once ``confirm.keep`` held, as the reference a hand-over is compared
        with (left open, a resume with more steps would run nothing for it)."""
        return any(r.trial_id == base_id for r in queue)

    while queue and (found() < conf.keep or base_open()):
        if found() >= conf.keep:
            queue = [r for r in queue if r.trial_id == base_id]
        need = max(1, conf.keep - found())
        take = affordable(sweep, book, queue, need)
        if take == 0 and not found():
            take = 1  # nothing the search found holds yet: settle the best remaining one
        if take == 0:
            budget_ended = True
            spent = book.steps_spent(role=None) + sum(run_cost(sweep, r) for r in base_runs)
            nxt = queue[0]
            enough = spent + sum(run_cost(sweep, r) for r in plan(sweep, book, [nxt]))
            notes.append(f"confirmation stopped after {len(judged)} candidate(s): another "
                         f"round would pass budget.total_steps ({spent} of "
                         f"{sweep.spec.budget.total_steps} spent, the base config's runs "
                         f"still to come included); the next candidate, {nxt.trial_id}, "
                         f"needs {enough - spent} more: `sweeps resume "
                         f"{shell_word(sweep.output_dir)} --total-steps {enough}` settles it "
                         "without starting again (more steps settle more)")
            break
        batch, queue = queue[:take], queue[take:]
        run_stage(plan(sweep, book, batch, "screen") + base_runs)
        base_runs = []
        for _ in range(2):  # the rest of the ladder; once more after a failed LR probe
            alive = [r for r in batch if verdict(r).verdict != "fragile"]
            run_stage(plan(sweep, book, alive))
        judged += [verdict(r) for r in batch]
    judged += _left_open(sweep, [verdict(r) for r in queue if raced(book, r)], budget_ended)
    run_stage(base_runs)
    ref = base_reference(sweep, book)
    own = judge_own_base(sweep, book, ref)
    if own is not None:  # off the search space: a candidate beside what the search found
        judged.append(own)
        base_id = own.trial_id
    mark_poor(judged, ref, base_id, trades)
    if not any(c.holds for c in judged) and judged:
        notes.append(_unsettled_note(sweep, book, judged))
    # an exact tie: your base config first (nothing beat it), then an order a resume keeps
    holding = sorted(pair_on_shared_seeds([c for c in judged if c.holds]),
                     key=lambda c: (*c.rank_key(), c.trial_id != base_id, c.trial_id))
    return Selection(holding + [c for c in judged if not c.holds], ref,
                     steps_by_kind(book, base_id), notes, base_id, budget_ended)


def _left_open(sweep: Sweep, racers: list[Confirmation],
               budget_ended: bool) -> list[Confirmation]:
    """Racers the search's race gave fresh seeds that ``select`` settled no further: listed
    in pareto.csv as ``incomplete``, with their seeds and why the rest did not run."""
    keep = sweep.spec.confirm.keep
    why = ("not settled: the step budget ended (budget.total_steps)" if budget_ended else
           f"not settled: confirm.keep is {keep}, and {keep} candidate(s) ranked ahead "
           "of it by their seeds were settled first")
    for c in racers:
        c.left_open = why
    return racers


def pair_on_shared_seeds(holding: list[Confirmation]) -> list[Confirmation]:
    """Set each one's :attr:`Confirmation.shared_mean` when they ran different fresh
    seeds: a config whose narrow margin earned it more seeds is ranked on the seeds the
    others ran too (the same seeds: the same initial weights and data order), not on a
    mean its extra seeds' luck moved."""
    sets = [set(c.fresh_quality) for c in holding]
    if len(holding) < 2 or all(s == sets[0] for s in sets):
        return holding
    shared = sorted(set.intersection(*sets))
    for c in holding:
        c.shared_mean, c.shared_seeds = None, []
        if shared:
            c.shared_mean = statistics.fmean(c.fresh_quality[s] for s in shared)
            c.shared_seeds = shared
    return holding


def steps_by_kind(book: TrialBook, base_id: str | None = None) -> dict[str, int]:
    """Training steps spent: the search, candidates on fresh seeds, LR probes, and the base
    config's re-runs (its fresh seeds and probe as the search trial ``base_id``, or its
    own runs when it was off the search space): the reference every hand-over is
    compared with, apart from the evidence for what the search found."""
    steps = {"search": 0, "seeds": 0, "probe": 0, "base": 0}
    for rec in book.trials.values():
        kind, _, owner = rec.role.partition(":")
        kind = {"confirm": "seeds", BASE_ROLE: "base"}.get(kind, kind)
        if base_id is not None and owner == base_id:
            kind = "base"
        if kind in steps:
            steps[kind] += rec.last_step
    return steps


def _unsettled_note(sweep: Sweep, book: TrialBook, judged: list[Confirmation]) -> str:
    """Why nothing was handed over, and what settling the best unsettled ones would take."""
    open_ = [c for c in judged if c.verdict == "incomplete"]
    spread = _spread_only(judged)
    if not open_ and spread:
        shares = sorted(c.spread for c in spread if c.spread is not None)
        keep = min(spread, key=lambda c: c.spread or math.inf)
        return (f"no candidate held on its fresh seeds ({len(judged)} judged), though every "
                f"seed ran stable: their seeds disagree in {judged[0].quality.metric} by "
                f"{shares[0]:.0%}-{shares[-1]:.0%} (tolerance {judged[0].tolerance:.0%}), "
                "so on this trainer seeds differ that much at "
                f"max_steps {sweep.spec.budget.max_steps}; train longer (budget.max_steps) "
                "so they converge, or accept that spread: "
                f"`sweeps resume {shell_word(sweep.output_dir)} --tolerance "
                f"{math.ceil(shares[0] * 20) / 20:.2f}` judges them again; it holds "
                f"{keep.trial_id} if its other seeds agree as well")
    if not open_:
        how = why_none_held(book, judged)
        return f"no candidate held on its fresh seeds ({len(judged)} judged){how}"
    steps = sum(ladder_cost(sweep, book, book.trials[c.trial_id]) for c in open_)
    return (f"{len(open_)} candidate(s) are not settled: about {steps} more training steps "
            "would settle them (`sweeps resume "
            f"{shell_word(sweep.output_dir)} --total-steps N`)")


#: Reasons that say the loss exploded: an LR range too high is the likely cause.
EXPLODED = ("divergence", "grad_blowup", "non_finite", "loss_spike")


def why_none_held(book: TrialBook, judged: list[Confirmation]) -> str:
    """What the judged candidates' failures point at, and the fix: every failed run at
    the random guess with no search trial that learnt is the trainer or its data; every
    failure an explosion, the LR range; else the space."""
    reasons = {r.reason for c in judged for r in (c.search, *c.runs, *filter(None, [c.probe]))
               if r.status not in (OK, PRUNED)}
    search = [rec for rec in book.trials.values() if rec.role == SEARCH]
    learnt = [rec for rec in search if rec.status == OK and
              not any(w.startswith(LOSS_AT_GUESS) for w in rec.warnings)]
    if reasons == {"flat_at_baseline"} and not learnt:
        flat = sum(rec.reason == "flat_at_baseline" or (rec.diagnosis or {}).get("reason")
                   == "flat_at_baseline" for rec in search)
        return (f": each sat at the random guess (flat_at_baseline), and no search trial "
                f"learnt either ({flat} of {len(search)} at the random guess, none ended ok "
                "away from it); at no value tried did the model learn, which points at the "
                "trainer or its data, not the hyperparameters (labels that do not match "
                "their inputs, a loss on the wrong tensor, frozen weights): `sweeps try "
                "FILE` prints one run's metrics as they come")
    if reasons and reasons <= set(EXPLODED):
        return f" ({', '.join(sorted(reasons))}); lower the LR range, or add grad_clip"
    return "; widen the search space"


def _spread_only(judged: list[Confirmation]) -> list[Confirmation]:
    """The fragile candidates whose every seed and probe ran stable, fragile only for the
    gap between their seeds' quality; empty when any candidate failed otherwise."""
    fragile = [c for c in judged if c.verdict == "fragile"]
    only = [c for c in fragile if not c.seed_reasons and c.spread is not None
            and c.spread > c.tolerance and not (c.require_margin and c.narrow)]
    return only if fragile and len(only) == len(fragile) else []


def _sensitivity(member: TrialRecord, probe: TrialRecord, metric: str,
                 mode: str = "min") -> float:
    """How much worse quality is at LR × probe, relative to the candidate's own (positive:
    worse, negative: better, whatever the objective's mode), both at the probe's last step
    (a probe holds once the rules could tell, :mod:`sweeps.trial.horizon`, often before
    the end); infinite when the probe went unstable."""
    if probe.status != OK:
        return math.inf
    base, new = at_probe_end(member, probe, metric)
    if base is None or new is None or base == 0:
        return math.nan
    return (new - base) / abs(base) * (1.0 if mode == "min" else -1.0)
