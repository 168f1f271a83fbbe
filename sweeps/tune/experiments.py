"""Ray Tune runs: the Optuna-guided search, and re-runs of chosen configs."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.schedulers import TrialScheduler
from ray.tune.search import Searcher

from sweeps.protocol import ROLE_KEY, RUN_KEY, SEED_KEY
from sweeps.record.book import TrialBook
from sweeps.spec.loader import Sweep
from sweeps.tune.callbacks import RuleStopper, TrialEvents, WatchFolder, WorkerLogs
from sweeps.tune.progress import ProgressLines
from sweeps.tune.schedulers import WatchedASHA, WatchedFIFO
from sweeps.tune.searcher import StabilityAwareSearch, study_storage
from sweeps.tune.trainable import ray_trainable


def make_scheduler(sweep: Sweep, book: TrialBook) -> TrialScheduler:
    """ASHA on the first objective (quality), judged at its reports; stability is the rules' job.

    ASHA takes one metric while the search may have several objectives: ASHA
    only stops stable trials whose quality trails their rung, and the rules stop
    unstable ones at once, so the two never judge the same thing.
    """
    budget = sweep.spec.budget
    first = sweep.objectives[0]
    if budget.scheduler == "none" or budget.expected_trials < 4 or first.metric in (
            "instability", "step_time", "compile_s"):
        return WatchedFIFO(book, budget.hang_timeout)
    return WatchedASHA(book, budget.hang_timeout, time_attr="step", metric=first.metric,
                       mode=first.mode, max_t=budget.max_steps, grace_period=budget.asha_grace,
                       reduction_factor=3, stop_last_trials=False)


def _trainable(sweep: Sweep) -> Any:
    res = sweep.spec.resources
    return tune.with_resources(tune.with_parameters(ray_trainable, sweep=sweep),
                               {"cpu": res.cpu, "gpu": res.gpu})


def _run_config(sweep: Sweep, name: str, book: TrialBook, total: int | None,
                progress: bool, stage: str | None = None) -> tune.RunConfig:
    # the log is kept before it is named
    callbacks = [WorkerLogs(book), TrialEvents(book), WatchFolder()]
    if stage is None and name != "ray":  # "ray": the search; else confirmation
        stage = name
    callbacks += [ProgressLines(book, total, stage=stage)] if progress else []
    return tune.RunConfig(
        name=name, storage_path=str(sweep.output_dir), stop=RuleStopper(book),
        callbacks=callbacks, verbose=0,
        failure_config=tune.FailureConfig(max_failures=sweep.spec.budget.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1))


def run_search(sweep: Sweep, book: TrialBook, *, progress: bool = True,
               resume: bool = False) -> None:
    """Run the Optuna-guided search (or continue it from Ray Tune's experiment state)."""
    budget = sweep.spec.budget
    path = sweep.output_dir / "ray"
    if resume and tune.Tuner.can_restore(str(path)):
        _restored(path, sweep, progress)
        return
    searcher = StabilityAwareSearch(sweep, book, storage=study_storage(sweep))
    tuner = tune.Tuner(
        _trainable(sweep),
        tune_config=tune.TuneConfig(
            search_alg=searcher, scheduler=make_scheduler(sweep, book),
            num_samples=-1,  # until the searcher says FINISHED (trial cap, step budget)
            max_concurrent_trials=budget.concurrent, reuse_actors=True),
        run_config=_run_config(sweep, "ray", book, budget.trial_cap, progress))
    tuner.fit()
    searcher.settle_deferred()


def run_configs(sweep: Sweep, book: TrialBook, configs: list[dict[str, Any]], name: str,
                *, progress: bool = True, resume: bool = False,
                stage: str | None = None) -> None:
    """Run fixed trial configs (knob values plus ``_seed``/``_lr_scale``/``_role``);
    ``stage`` names them in the progress lines (default: ``name``)."""
    if not configs:
        return
    path = sweep.output_dir / name
    if resume and tune.Tuner.can_restore(str(path)):
        _restored(path, sweep, progress)
        # a stage of the same name can be one an earlier run finished (a resume with a
        # larger budget numbers its rounds from the first again): what it did not run
        # runs now, under a name of its own
        configs = [c for c in configs if not _recorded(book, c)]
        if not configs:
            return
        name = _unused(sweep.output_dir, name)
    tuner = tune.Tuner(
        _trainable(sweep),
        tune_config=tune.TuneConfig(
            search_alg=FixedRuns(configs), num_samples=-1,
            max_concurrent_trials=sweep.spec.budget.concurrent, reuse_actors=True,
            scheduler=WatchedFIFO(book, sweep.spec.budget.hang_timeout)),
        run_config=_run_config(sweep, name, book, len(configs), progress, stage))
    tuner.fit()


def _recorded(book: TrialBook, config: dict[str, Any]) -> bool:
    """Whether the book holds a run of ``config``: its role and seed (a candidate's fresh
    seed, LR probe or the base config's run)."""
    role, seed = config.get(ROLE_KEY), config.get(SEED_KEY)
    return any(rec.role == role and rec.seed == seed for rec in book.trials.values())


def _unused(folder: Path, name: str) -> str:
    """``name-resumed``, ``name-resumed-2``, …: the first with no folder in ``folder``."""
    k, candidate = 1, f"{name}-resumed"
    while (folder / candidate).exists():
        k += 1
        candidate = f"{name}-resumed-{k}"
    return candidate


def _restored(path: Path, sweep: Sweep, progress: bool) -> None:
    """Continue the Ray Tune experiment saved at ``path``; its callbacks come back with
    it, so without ``progress`` its progress lines are muted."""
    ProgressLines.muted = not progress
    try:
        tune.Tuner.restore(str(path), _trainable(sweep), resume_unfinished=True,
                           resume_errored=True).fit()
    finally:
        ProgressLines.muted = False


class FixedRuns(Searcher):
    """Hands Ray Tune fixed re-run configs, in order, then FINISHED: their trials get the
    same 8-character ids as the search's (a grid search names them ``<hash>_<index>``,
    and those ids name the handed-over YAML files). Its state (which config is next) is
    saved with Ray Tune's, so a resumed stage starts none twice."""

    def __init__(self, configs: list[dict[str, Any]]) -> None:
        super().__init__()
        self.configs = list(configs)
        self.next = 0

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self.next >= len(self.configs):
            return Searcher.FINISHED
        self.next += 1
        return {RUN_KEY: self.configs[self.next - 1]}

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                          error: bool = False) -> None:
        """Nothing to learn: the runs are fixed."""

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as fh:
            pickle.dump({"configs": self.configs, "next": self.next}, fh)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as fh:  # Ray Tune's own state of this results folder
            state = pickle.load(fh)  # noqa: S301 - the folder's seal was checked on resume
        self.configs, self.next = state["configs"], state["next"]

