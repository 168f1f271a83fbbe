"""Warm start: seed a new sweep's Optuna study with an earlier sweep's finished trials.

``sweeps run FILE --warm-start DIR`` reads the study in ``DIR/optuna.journal`` (from a
private copy: nothing in DIR is written, no lock is taken there) and adds to the new study,
with Optuna's ``Study.add_trial``, every COMPLETE trial whose knob values all lie in the
new space: finished trials with their objective values, unstable or crashed ones with the
penalised values and the violated ``stability`` constraint they were told. TPE then starts
from what the earlier sweep learned. These trials never run again: they are not Ray
trials, spend no budget, are no candidates for the front or stable/, and are listed in
trials.csv with ``role`` = ``warm_start``. The earlier best configs that fit (as many as
run at once, at most 3) are queued as this sweep's first trials (``seed_study``): those
are ordinary search trials of this sweep.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from sweeps.errors import SpecError
from sweeps.protocol import OK, WARM_START
from sweeps.spec.loader import Objective, Sweep
from sweeps.spec.space import contains, fixed_values, optuna_space
from sweeps.state import saved_sweep
from sweeps.state.layout import STUDY_FILE

FLAG = "--warm-start"
#: trials.csv role of a trial taken from an earlier sweep.
ROLE = WARM_START
#: Optuna user attributes of a warm-started trial: the folder and trial it came from.
SOURCE_ATTR, TRIAL_ATTR = "warm_start", "warm_start_trial"
#: Optuna user attribute of a search trial that starts at an earlier best config: its
#: trial number in the earlier study.
BEST_ATTR = "warm_start_best"
_FIX = "give the results folder of an earlier `sweeps run`, e.g. results/linreg"


@dataclass
class WarmStart:
    """The trials taken from an earlier sweep, and why the others were not."""

    source: Path
    trials: list[optuna.trial.FrozenTrial]
    seen: int = 0
    skipped: Counter[str] = field(default_factory=Counter)

    def line(self) -> str:
        """One line for stderr: how many trials were taken and why others were skipped."""
        why = ", ".join(f"{n} {reason}" for reason, n in self.skipped.most_common())
        return (f"warm start: {len(self.trials)} of {self.seen} trials of {self.source} seed "
                f"the search (not run again)" + (f"; skipped: {why}" if why else ""))


def searched(sweep: Sweep) -> list[Objective]:
    """The objectives the sampler optimises (``budget.search_on``), in order."""
    return list(sweep.objectives if sweep.spec.budget.search_on == "all"
                else sweep.objectives[:1])


def directions(sweep: Sweep) -> list[str]:
    return ["minimize" if o.mode == "min" else "maximize" for o in searched(sweep)]


def _earlier_sweep(folder: Path) -> Sweep:
    """The earlier sweep as it ran (its resolved sweep.yaml; the trainer is not imported)."""
    try:
        return saved_sweep.read(folder, import_trainer=False)
    except SpecError as exc:
        raise SpecError(FLAG, f"{folder}/sweep.yaml cannot be read: {exc.key}: {exc.problem}",
                        _FIX) from None


def _earlier_trials(folder: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    """The earlier study's trials, read from a copy of its journal (DIR is never written)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    with tempfile.TemporaryDirectory(prefix="sweeps-warm-") as tmp:
        copy = Path(tmp) / STUDY_FILE
        shutil.copyfile(folder / STUDY_FILE, copy)
        try:
            storage = JournalStorage(JournalFileBackend(str(copy)))
            names = optuna.get_all_study_names(storage)
            study = optuna.load_study(study_name=name if name in names else names[0],
                                      storage=storage)
            return study.get_trials(deepcopy=True)
        except Exception as exc:  # a damaged or foreign journal
            raise SpecError(FLAG, f"{folder / STUDY_FILE} holds no readable Optuna study "
                            f"({type(exc).__name__}: {str(exc)[:200]})", _FIX) from None


def check_folder(folder: Path, sweep: Sweep) -> Path:
    """DIR resolved, or a SpecError saying what is wrong with it."""
    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise SpecError(FLAG, f"no folder at {folder}", _FIX)
    if folder == sweep.output_dir.resolve():
        raise SpecError(FLAG, f"{folder} is this sweep's own results folder, which the run "
                        "moves aside before it starts", "move it first (or give its archived "
                        "copy results/<name>.<timestamp>), or give the sweep a new name:")
    if not (folder / "sweep.yaml").is_file() or not (folder / "sweep_state.json").is_file():
        raise SpecError(FLAG, f"{folder} is not a sweeps results folder (no sweep.yaml and "
                        "sweep_state.json)", _FIX)
    if not (folder / STUDY_FILE).is_file():
        raise SpecError(FLAG, f"{folder} holds no Optuna study (no {STUDY_FILE}); it was "
                        "not written by `sweeps run`", _FIX)
    return folder


def why_not_fitting(values: dict[str, Any], old_searched: set[str], sweep: Sweep) -> str | None:
    """None when a trial with knob ``values`` fits the new space, else the reason."""
    for name, knob in sweep.space.items():
        if name in values:
            if not contains(knob, values[name]):
                return f"{name} outside the new space"
        elif not knob.is_fixed():
            return f"{name} not in the earlier sweep"
    dropped = sorted(old_searched - set(sweep.space))
    return f"{dropped[0]} no longer in the space" if dropped else None


def load(folder: Path, sweep: Sweep) -> WarmStart:
    """The earlier sweep's trials that fit ``sweep``; a SpecError (exit 2) for a bad DIR or
    objectives that differ."""
    folder = check_folder(folder, sweep)
    old = _earlier_sweep(folder)
    theirs = [(o.metric, o.mode) for o in searched(old)]
    ours = [(o.metric, o.mode) for o in searched(sweep)]
    if theirs[:len(ours)] != ours:  # a sweep searching quality alone takes its first values
        show = lambda objs: ", ".join(f"{m} ({d})" for m, d in objs)  # noqa: E731
        added = [m for m, _ in ours if m not in {t for t, _ in theirs}]
        compile_added = added == ["step_time"] and "compile" in sweep.space and \
            not sweep.space["compile"].is_fixed()
        fix = ("this sweep searches compile, which adds step_time as an objective: fix it "
               "as the earlier sweep did (search_space: {compile: none}, or the mode it "
               "ran)" if compile_added else "warm-start only from a sweep with the same "
               "objectives (metrics and directions, in the same order; one that searched "
               "every objective also seeds budget.search_on: quality)")
        raise SpecError(FLAG, f"{folder} searched {show(theirs)}; this sweep searches "
                        f"{show(ours)}", fix)
    trials = _earlier_trials(folder, old.name)
    space = optuna_space(sweep.space)
    fixed = fixed_values(old.space)
    warm = WarmStart(folder, [])
    for trial in trials:
        warm.seen += 1
        if trial.state != optuna.trial.TrialState.COMPLETE:
            warm.skipped[trial.state.name.lower()] += 1
            continue
        why = why_not_fitting({**fixed, **trial.params}, set(trial.params), sweep)
        if why is not None:
            warm.skipped[why] += 1
            continue
        attrs = {**trial.user_attrs, SOURCE_ATTR: trial.user_attrs.get(SOURCE_ATTR,
                                                                      str(folder)),
                 TRIAL_ATTR: trial.user_attrs.get(TRIAL_ATTR, trial.number)}
        warm.trials.append(optuna.trial.create_trial(
            params={k: ({**fixed, **trial.params})[k] for k in space},
            distributions=space, values=trial.values[:len(ours)], user_attrs=attrs,
            constraints=trial.constraints or None))
    return warm


def best_first(sweep: Sweep, warm: WarmStart) -> list[optuna.trial.FrozenTrial]:
    """The earlier sweep's best distinct feasible configs (finished, no violated stability
    constraint; by the first searched objective), as many as run at once (at most 3). A
    config with an infeasible twin at the same point is left out: the race found it
    unstable on a fresh seed after it was told its search value (the ``race_of`` trial)."""
    sign = 1.0 if searched(sweep)[0].mode == "min" else -1.0

    def violated(trial: optuna.trial.FrozenTrial) -> bool:
        return any(c > 0 for c in (trial.constraints or {}).values())

    failed = [t.params for t in warm.trials if violated(t)]
    feasible = [t for t in warm.trials if t.values and math.isfinite(t.values[0])
                and not violated(t) and t.params not in failed]
    feasible.sort(key=lambda t: sign * t.values[0])
    out: list[optuna.trial.FrozenTrial] = []
    for trial in feasible:
        if all(trial.params != t.params for t in out):
            out.append(trial)
        if len(out) == min(3, max(1, sweep.spec.budget.concurrent)):
            break
    return out


def seed_study(sweep: Sweep, warm: WarmStart, storage: optuna.storages.BaseStorage) -> None:
    """Create the sweep's study in ``storage`` holding the warm-started trials, and queue
    the earlier best configs (``best_first``) as the search's first trials.

    TPE alone does not start near the earlier best: with a handful of earlier trials its
    "good" group is one or two trials and its prior spreads the first asks over the range
    (measured 0.9-2.4 decades of lr away). Queued with Optuna's ``enqueue_trial``, the
    earlier best configs are the first ones this sweep runs, on its own seed and base
    config, so they can reach its front and stable/; TPE takes over from the next ask.
    """
    study = optuna.create_study(storage=storage, study_name=sweep.name,
                                directions=directions(sweep))
    study.add_trials(warm.trials)
    for trial in best_first(sweep, warm):
        study.enqueue_trial(trial.params, user_attrs={BEST_ATTR: trial.user_attrs[TRIAL_ATTR]})


def rows(sweep: Sweep, storage: optuna.storages.BaseStorage) -> list[dict[str, Any]]:
    """trials.csv rows of the warm-started trials in the sweep's study (none without one)."""
    try:
        study = optuna.load_study(study_name=sweep.name, storage=storage)
    except KeyError:
        return []
    objs = searched(sweep)
    fixed = fixed_values(sweep.space)
    out = []
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        if SOURCE_ATTR not in attrs:
            continue
        row: dict[str, Any] = {
            "trial_id": str(attrs.get("ray_trial_id") or f"warm-{attrs.get(TRIAL_ATTR)}"),
            "role": ROLE, "status": attrs.get("status", OK),
            "reason": attrs.get("reason", ""), "stop_step": attrs.get("stop_step")}
        row.update({k: {**fixed, **trial.params}.get(k) for k in sweep.space})
        row.update({f"objective_{o.metric}": v
                    for o, v in zip(objs, trial.values or [], strict=False)})
        row["warm_start_from"] = attrs[SOURCE_ATTR]
        out.append(row)
    return out
