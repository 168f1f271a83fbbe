"""Optuna search that learns where the instability cliff is.

Ray's ``OptunaSearch`` tells Optuna whatever the last result held: a trial a
stopper halted is told COMPLETE with its last (maybe NaN) value, and Optuna
turns a NaN into FAIL, from which TPE learns nothing. Here every trial is
told what it was: a finished trial its objective values; an unstable or
crashed one penalised values (worse than every finished trial) *and* a
violated constraint, so TPE ranks it below all feasible trials; a trial ASHA
stopped is told PRUNED, unless the rules diagnose a failure in what it ran (flat
at the baseline, collapsed, diverging: ``rules.diagnose``), in which case it is
told like an unstable trial, so TPE learns that region is bad rather than merely
slow. The trial's status, reason, stop step and diagnosis are kept as user
attributes, so ``optuna.load_study`` shows why each trial failed.
"""

from __future__ import annotations

import json
from typing import Any

import optuna
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from sweeps.protocol import (
    FINAL_KEY,
    INTERRUPTED,
    OK,
    PRUNED,
    ROLE_KEY,
    RUN_KEY,
    SEARCH,
    STABILITY_CONSTRAINT,
    WARM_BEST_KEY,
)
from sweeps.record.book import TrialBook, TrialRecord
from sweeps.record.objectives import told
from sweeps.results.confirm import base_point, nearest_base_point, raced, run_cost
from sweeps.results.race import Race, owner_of
from sweeps.results.warm_start import BEST_ATTR, searched
from sweeps.spec.loader import Sweep
from sweeps.spec.space import central_value, contains, optuna_space
from sweeps.state import folder_watch
from sweeps.state.layout import STUDY_FILE
from sweeps.trial.knob_check import sweep_problem
from sweeps.trial.run import trainer_metrics
from sweeps.tune import compat

#: Optuna constraint name: 1.0 (violated) for a trial that ended unstable or crashed.
CONSTRAINT = STABILITY_CONSTRAINT

optuna.logging.set_verbosity(optuna.logging.WARNING)


def make_sampler(sweep: Sweep) -> optuna.samplers.BaseSampler:
    """Multivariate TPE with a short random start; TPE reads each trial's constraint.

    With trials running at once, a running trial counts as a bad one (constant liar),
    so concurrent asks do not land on the same spot. ``budget.sampler: tpe`` is Optuna's
    default TPE instead (Ray Tune's ``OptunaSearch`` uses it): 10 random trials, and with
    several searched objectives each knob modelled on its own.
    """
    budget = sweep.spec.budget
    if budget.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=sweep.spec.seed)
    return optuna.samplers.TPESampler(
        seed=sweep.spec.seed, multivariate=True, n_startup_trials=budget.startup_trials,
        constant_liar=budget.concurrent > 1)




def study_storage(sweep: Sweep) -> optuna.storages.BaseStorage:
    """The Optuna study, in a journal file beside the results (the driver writes it).

    A journal file costs ~4 ms per trial where a sqlite study cost ~70 ms (every
    ask re-read all trials, every attribute was its own commit), and it is kept
    as the search goes, so ``sweeps resume`` and ``optuna-dashboard`` can read it.
    """
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(sweep.output_dir / STUDY_FILE)))


def initial_points(sweep: Sweep) -> list[dict[str, Any]]:
    """The sweep's initial points with every searched knob filled in.

    A knob a point leaves out takes the base config's value when the space
    allows it, else the middle of its range.
    """
    varying = optuna_space(sweep.space)
    defaults: dict[str, Any] = {}
    for name in varying:
        current = sweep.base_value(name)
        ok = current is not None and contains(sweep.space[name], current)
        defaults[name] = current if ok else central_value(sweep.space[name])
    return [{**defaults, **{k: v for k, v in p.items() if k in varying}}
            for p in sweep.spec.initial_points]


class StabilityAwareSearch(OptunaSearch):
    """``OptunaSearch`` that tells Optuna each trial's real outcome (see module doc) and
    hands Ray Tune the race's re-runs between its own trials (:mod:`sweeps.results.race`).

    A search trial that enters the race is told once its first fresh seed (or its LR
    probe) has run: infeasible if that failed, else its mean over every seed it ran
    stable, on every objective. A failure found on a later seed is told as an added
    infeasible trial at the same point (user attr ``race_of``: the number of the trial it
    repeats)."""

    def __init__(self, sweep: Sweep, book: TrialBook,
                 storage: optuna.storages.BaseStorage | None = None) -> None:
        self.book = book
        # what the sampler optimises: every objective (the Pareto front), or the quality
        # objective alone with stability as a constraint only (budget.search_on: quality)
        self.objectives = searched(sweep)
        metrics = [o.metric for o in self.objectives]
        modes = [o.mode for o in self.objectives]
        multi = len(metrics) > 1
        points = initial_points(sweep)
        base = base_point(sweep)
        if base is None:  # off the search space: start at the point nearest it
            near = nearest_base_point(sweep)
            base = near[0] if near is not None else None
        if base is not None and base not in points:  # the base config races from the start
            points = [base, *points]
        super().__init__(space=optuna_space(sweep.space), metric=metrics if multi else metrics[0],
                         mode=modes if multi else modes[0], sampler=make_sampler(sweep),
                         study_name=sweep.name, storage=storage,
                         points_to_evaluate=points or None)
        self._race_runs: dict[str, str] = {}  # Tune trial id of a re-run -> its candidate
        self._run_costs: dict[str, int] = {}  # Tune trial id of a re-run -> steps it may take
        self._deferred: set[str] = set()  # raced search trials not told yet
        self._told_fragile: set[str] = set()  # raced trials told infeasible after their tell
        self.race = Race(sweep, book)
        book.on_finish(self.tell_outcome)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled from Ray Tune's saved state: listen to the (re-opened) book again."""
        self.__dict__.update(state)
        self.__dict__.setdefault("_run_costs", {})  # saved before it was kept
        self._listen()

    def _listen(self) -> None:
        self.race = Race(self.book.sweep, self.book)  # what it cached was of the old book
        self.book.on_finish(self.tell_outcome)

    @property
    def study(self) -> optuna.Study:
        return compat.optuna_search_study(self)

    def restore(self, checkpoint_path: str) -> None:
        """Ray Tune's saved searcher, its study re-opened from the journal beside the book
        (the results folder may have moved since the state was saved)."""
        super().restore(checkpoint_path)
        compat.reopen_optuna_search(self, study_storage(self.book.sweep))
        self._listen()
        self.catch_up()

    def catch_up(self) -> None:
        """Tell the study the search trials that finished after Ray Tune last saved this
        searcher (a driver killed then): the book has their outcome, the saved state does
        not, and a trial left running in the study is failed as interrupted at the end
        (:func:`fail_interrupted`), so the sampler lost them, the best one included. A
        trial asked after the save is found by the ``ray_trial_id`` set when it was asked."""
        ot_trials = compat.optuna_search_trials(self)
        completed = compat.optuna_search_completed(self)
        running = self.study.get_trials(deepcopy=False,
                                        states=(optuna.trial.TrialState.RUNNING,))
        for frozen in running:
            trial_id = frozen.user_attrs.get("ray_trial_id")
            rec = self.book.trials.get(trial_id) if isinstance(trial_id, str) else None
            if rec is None or rec.role != SEARCH or not rec.finished or \
                    trial_id in completed or trial_id in self._deferred:
                continue
            if trial_id not in ot_trials:
                compat.adopt_optuna_trial(self, trial_id, frozen)
            self._tell_outcome(rec)
            if trial_id in self._deferred:  # its race may have run before the driver died
                self._tell_raced(trial_id)

    # ---- what runs next: a re-run of the race, a new search trial, or nothing
    def _finished(self, trial_id: str) -> bool:
        rec = self.book.trials.get(trial_id)
        return rec is not None and rec.finished

    def _committed(self, in_flight: list[str]) -> int:
        """Steps the trials have run, plus those the trials in flight may still run: a
        search trial or fresh seed to ``budget.max_steps``, an LR probe to where it holds.
        The steps run alone left the leader's re-runs uncounted once they had started (no
        longer missing from its ladder, not yet run), and a new search trial started in
        their place: past the budget, with no steps left to settle it if it won."""
        max_steps = self.book.sweep.spec.budget.max_steps
        ahead = 0
        for trial_id in in_flight:
            rec = self.book.trials.get(trial_id)
            if rec is None and trial_id in self._race_runs:
                continue  # not reported yet: still missing from its ladder (Race.reserve)
            done = rec.last_step if rec is not None else 0
            ahead += max(0, self._run_costs.get(trial_id, max_steps) - done)
        return self.book.steps_spent(role=None) + ahead

    def _search_open(self, spent: int) -> bool:
        """Whether a new search trial may start: under the trial cap, and ``spent`` (the
        steps the trials ran and those in flight may still run, :meth:`_committed`) and
        settling the race's leader (:meth:`Race.reserve`) leave some of the step budget."""
        budget = self.book.sweep.spec.budget
        if getattr(self, "inert", None):  # a searched knob does nothing: start no more
            return False
        if budget.trial_cap is not None and self._search_trials() >= budget.trial_cap:
            return False
        return budget.total_steps is None or spent + self.race.reserve() < budget.total_steps

    def _search_trials(self) -> int:
        """Search trials started so far: the sampler's (running, or restored with Ray
        Tune's state) and every one the book saw finish. After a driver died, a trial
        that finished after Ray Tune last saved its state is in the book alone; counting
        the sampler's alone let a resumed sweep run past ``budget.trials``."""
        ids = set(compat.optuna_search_trials(self))
        ids.update(t for t, rec in self.book.trials.items()
                   if rec.role == SEARCH and rec.finished)
        return len(ids)

    def suggest(self, trial_id: str) -> dict | str | None:
        """The next trial: a race re-run (one at a time while the search goes on, any
        number after it), else a new search config while :meth:`_search_open`, else None
        while trials run, else FINISHED. A study file gone with its results folder is
        :class:`~sweeps.state.folder_watch.FolderGone`."""
        try:
            return self._suggest(trial_id)
        except OSError:
            folder_watch.check_current()
            raise

    def _suggest(self, trial_id: str) -> dict | str | None:
        if trial_id in compat.optuna_search_trials(self):  # asked again after a restore
            return super().suggest(trial_id)
        budget = self.book.sweep.spec.budget
        ids = list(compat.optuna_search_trials(self)) + list(self._race_runs)
        in_flight = [t for t in ids if not self._finished(t)]
        spent = self._committed(in_flight)
        search_open = self._search_open(spent)
        busy = {owner for t, owner in self._race_runs.items() if t in in_flight}
        # the race's re-runs leave what the base config's runs after the search will take
        fits = budget.total_steps is None or \
            spent + self.race.base_steps() < budget.total_steps
        if fits and not getattr(self, "inert", None) and \
                len(busy) < (1 if search_open else budget.concurrent):
            run = self.race.next_run(busy, searching=search_open)
            if run is not None:
                self._race_runs[trial_id] = owner_of(run[ROLE_KEY]) or ""
                self._run_costs[trial_id] = run_cost(self.book.sweep, run)
                return {RUN_KEY: run}
        if search_open:
            return self._new_config(trial_id)
        if in_flight:
            return None
        self.settle_deferred()
        return Searcher.FINISHED

    def _new_config(self, trial_id: str) -> dict | str | None:
        """Optuna's next search config; an earlier sweep's best that a warm start queued
        (:func:`sweeps.results.warm_start.seed_study`) carries ``WARM_BEST_KEY``, so ASHA
        lets it run its full length."""
        config = super().suggest(trial_id)
        ot_trial = compat.optuna_search_trials(self).get(trial_id)
        if isinstance(config, dict) and ot_trial is not None:  # found again after a restart
            ot_trial.set_user_attr("ray_trial_id", trial_id)
        if isinstance(config, dict) and ot_trial is not None and \
                BEST_ATTR in ot_trial.user_attrs:
            config[WARM_BEST_KEY] = ot_trial.user_attrs[BEST_ATTR]
        return config

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """Intermediate values (single objective only) where the metric was reported."""
        if isinstance(self.metric, list) or trial_id in compat.optuna_search_completed(self) or \
                trial_id not in compat.optuna_search_trials(self) or \
                result.get(FINAL_KEY):  # a summary repeating the last report
            return
        value, step = result.get(self.metric), result.get("step")
        if isinstance(value, (int, float)) and isinstance(step, int) and value == value:
            compat.optuna_search_trials(self)[trial_id].report(float(value), step)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                          error: bool = False) -> None:
        """Nothing here: Ray Tune calls this before its callbacks, and the outcome is told
        once ``TrialEvents`` closed the trial in the book (:meth:`tell_outcome`)."""

    def tell_outcome(self, rec: TrialRecord) -> None:
        """Tell Optuna a closed trial's real outcome (see the module doc); a re-run of the
        race tells its candidate's, once that is known (see the class doc). Nothing when
        the study file went with its results folder: the next step stops the run."""
        try:
            self._tell_outcome(rec)
        except OSError:
            if not folder_watch.current_gone():
                raise

    def _tell_outcome(self, rec: TrialRecord) -> None:
        owner = owner_of(rec.role)
        self._tell_dropped()
        if owner is not None:
            self._tell_raced(owner)
            return
        trial_id = rec.trial_id
        completed = compat.optuna_search_completed(self)
        ot_trials = compat.optuna_search_trials(self)
        if trial_id in completed or trial_id not in ot_trials:
            return
        if not getattr(self, "inert", None):
            self.inert = sweep_problem(self.book.trials.values(),
                                       trainer_metrics(self.book.sweep),
                                       self.book.sweep.spec.rules, self.book.sweep.objectives)
        if rec.status == OK and self.race.wants(rec):
            self._deferred.add(trial_id)
            return
        self._tell(rec)

    def _tell_raced(self, owner: str) -> None:
        rec = self.book.trials.get(owner)
        if rec is None:
            return
        if owner in self._deferred:
            value = self.race.tell_value(rec)
            if self.race.judge(rec).verdict == "fragile":
                self._tell(rec, fragile=True)
            elif value is not None:
                self._tell(rec, quality=value)
            else:
                return
            self._deferred.discard(owner)
        elif owner in compat.optuna_search_completed(self) and owner not in self._told_fragile \
                and self.race.judge(rec).verdict == "fragile":
            self._add_fragile(rec)

    def _tell_dropped(self) -> None:
        """Tell the waiting trials the race no longer wants before they ran a re-run (a
        better one pushed them out) their search values, so the sampler has them now."""
        for trial_id in sorted(self._deferred):
            rec = self.book.trials.get(trial_id)
            if rec is not None and not raced(self.book, rec) and not self.race.wants(rec):
                self._tell(rec)
                self._deferred.discard(trial_id)

    def settle_deferred(self) -> None:
        """Tell the raced trials still waiting (the search ended before their first re-run)
        their search values."""
        for trial_id in sorted(self._deferred):
            rec = self.book.trials.get(trial_id)
            if rec is not None:
                self._tell(rec)
        self._deferred.clear()

    def _add_fragile(self, rec: TrialRecord) -> None:
        """A raced trial told feasible that a later re-run showed fragile: an infeasible
        trial at the same point teaches the sampler."""
        ot_trial = compat.optuna_search_trials(self)[rec.trial_id]
        worst = self._fragile_values(self.book.penalised_values(rec, self.objectives))
        judged = self.race.judge(rec)
        self.study.add_trial(optuna.trial.create_trial(
            params=ot_trial.params, distributions=ot_trial.distributions,
            values=worst, constraints={CONSTRAINT: 1.0},
            user_attrs={"race_of": ot_trial.number, "ray_trial_id": rec.trial_id,
                        "status": "fragile", "reason": (judged.fragile_reason or "")[:500]}))
        self._told_fragile.add(rec.trial_id)

    def _fragile_values(self, values: list[float]) -> list[float]:
        """Values of a config that failed a fresh seed: the quality of a failed trial."""
        first = self.objectives[0]
        out = list(values)
        out[0] = self.book.worst_value(first, 0, None)
        return out

    def _tell(self, rec: TrialRecord, *, fragile: bool = False,
              quality: float | None = None) -> None:
        """Tell Optuna ``rec``'s outcome: as the search saw it, infeasible when a re-run
        showed it ``fragile``, or with ``quality`` (its mean over seeds) as its value."""
        trial_id = rec.trial_id
        completed = compat.optuna_search_completed(self)
        ot_trials = compat.optuna_search_trials(self)
        ot_trial, study = ot_trials[trial_id], self.study
        if is_finished(study, ot_trial.number):
            completed.add(trial_id)  # told before the driver restarted
            return
        ot_trial.set_user_attr("ray_trial_id", trial_id)
        ot_trial.set_user_attr("status", "fragile" if fragile else rec.status)
        ot_trial.set_constraint(CONSTRAINT, 1.0 if rec.flagged or fragile else 0.0)
        if fragile:
            ot_trial.set_user_attr("reason", (self.race.judge(rec).fragile_reason or "")[:500])
            values = self._fragile_values(self.book.penalised_values(rec, self.objectives))
            study.tell(ot_trial, values if len(values) > 1 else values[0])
            self._told_fragile.add(trial_id)
            completed.add(trial_id)
            return
        if rec.reason:
            ot_trial.set_user_attr("reason", rec.reason)
            ot_trial.set_user_attr("stop_step", rec.stop_step)
            ot_trial.set_user_attr("evidence", json.dumps(rec.evidence, default=str)[:2000])
        if rec.diagnosis:
            ot_trial.set_user_attr("diagnosis", rec.diagnosis_text())
        if rec.status == PRUNED and not rec.flagged:
            study.tell(ot_trial, state=optuna.trial.TrialState.PRUNED)
        else:
            values = self.book.penalised_values(rec, self.objectives)
            if quality is not None:  # every objective over the seeds the first's mean is
                ot_trial.set_user_attr("seed_mean", quality)
                means = self.book.seed_means(rec, self.objectives)
                values = [v if m is None else m for v, m in zip(values, means, strict=True)]
                values[0] = quality
            values = [told(o.metric, v) for o, v in zip(self.objectives, values, strict=True)]
            study.tell(ot_trial, values if len(values) > 1 else values[0])
        completed.add(trial_id)


def is_finished(study: optuna.Study, number: int) -> bool:
    """Whether the study's trial ``number`` was told an outcome."""
    return any(t.number == number and t.state.is_finished()
               for t in study.get_trials(deepcopy=False))


def fail_interrupted(sweep: Sweep) -> int:
    """Tell Optuna FAIL for trials left RUNNING by a driver that died; returns how many."""
    storage = study_storage(sweep)
    try:
        study = optuna.load_study(study_name=sweep.name, storage=storage)
    except KeyError:
        return 0
    study_id = storage.get_study_id_from_name(sweep.name)
    stale = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    for trial in stale:
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        storage.set_trial_user_attr(trial_id, "status", INTERRUPTED)
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
    return len(stale)
