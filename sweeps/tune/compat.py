"""The one place sweeps touches private Ray and Optuna names, and the version guard.

Each function wraps one private access and says why the public API does not do
the job. All were checked against ray 2.60.0 and optuna 5.0.0 (the versions in
``constraints.txt``, the range ``pyproject.toml`` declares). Ray and Optuna are
imported inside the functions, so importing this module imports neither.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from sweeps.errors import SpecError

#: The versions sweeps is tested with (as ``pyproject.toml`` declares them), and the fix.
TESTED = {"ray": (">=2.60,<2.61", 'pip install "ray[tune,default]==2.60.*"'),
          "optuna": (">=5.0,<5.1", 'pip install "optuna==5.0.*"')}

#: Ray's logger for "Token authentication is enabled for this Ray cluster".
TOKEN_SETUP_LOGGER = "ray._private.authentication.authentication_token_setup"
#: Ray's loggers that print a line for every job upload and warn about skipped folders.
PACKAGING_LOGGER = "ray._private.runtime_env.packaging"
WORKING_DIR_LOGGER = "ray._private.runtime_env.working_dir"


class UnsupportedVersion(SpecError):
    """An installed Ray or Optuna outside the range sweeps is tested with."""


def check_versions() -> None:
    """Raise :class:`UnsupportedVersion` if Ray or Optuna is outside :data:`TESTED`.

    Reads the installed distributions' metadata; imports neither library.
    """
    from packaging.specifiers import SpecifierSet

    for name, (tested, fix) in TESTED.items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            continue  # the import that needs it names it
        if installed not in SpecifierSet(tested):
            raise UnsupportedVersion(
                f"installed {name}", f"version {installed} is not the tested {name}{tested}",
                fix)


def reload_ray_config() -> None:
    """Make this process's Ray read its config (``RAY_AUTH_MODE`` and the like) again.

    Ray reads its config into ``ray._raylet.Config`` once, at import; there is no
    public call to re-read it, and Ray's own ``ray start`` does it this way.
    Checked with ray 2.60.0. A Ray without it changes nothing.
    """
    try:
        from ray._raylet import Config

        Config.initialize("")
    except ImportError:
        pass


def cluster_needs_token(gcs_address: str) -> bool | None:
    """Whether the Ray cluster at ``gcs_address`` refuses a client without a token (True),
    takes one without it (False), or could not be asked (None).

    Asked with ``ray._raylet.GcsClient``, in this process's current (non-token) auth
    mode; the C++ warning a refusal logs to stderr is kept off the terminal. Checked with
    ray 2.60.0 (``AuthenticationError`` when the token is missing).
    """
    try:
        from ray._raylet import GcsClient
        from ray.exceptions import AuthenticationError
    except ImportError:
        return None
    try:
        saved: int | None = os.dup(2)
    except OSError:  # no stderr to keep quiet
        saved = None
    try:
        with open(os.devnull, "w") as null:
            if saved is not None:
                os.dup2(null.fileno(), 2)
            try:
                GcsClient(address=gcs_address)
            finally:
                if saved is not None:
                    os.dup2(saved, 2)
    except AuthenticationError:
        return True
    except Exception:  # noqa: BLE001 - ray.init will say what is wrong with the address
        return None
    finally:
        if saved is not None:
            os.close(saved)
    return False


def reset_ray_token_cache() -> None:
    """Drop the auth token this process's Ray cached, so the next request reads it anew.

    Ray caches the token in ``ray._raylet.AuthenticationTokenLoader`` and has no
    public call to clear it. Checked with ray 2.60.0. A Ray without it changes nothing.
    """
    try:
        from ray._raylet import AuthenticationTokenLoader

        AuthenticationTokenLoader.instance().reset_cache()
    except (ImportError, AttributeError):
        pass


def set_ray_single_machine(on: bool | None) -> bool | None:
    """Switch Ray's single-machine mode (node address 127.0.0.1) in this process; return
    the old setting (None: this Ray has no such switch; ``on=None`` changes nothing).

    Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` into
    ``ray._private.ray_constants.ENABLE_RAY_CLUSTER`` at import, and there is no
    public setting for it once Ray is imported (the environment variable is for the
    processes Ray starts, the constant for this one). Checked with ray 2.60.0.
    """
    try:
        from ray._private import ray_constants
    except ImportError:
        return None
    clusters = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    if clusters is None or on is None:
        return None
    ray_constants.ENABLE_RAY_CLUSTER = not on
    return not clusters


def ray_excludes(root: Path, patterns: Sequence[str]) -> Callable[[Path], bool]:
    """Ray's test whether a path under ``root`` matches one of ``patterns`` (the job
    ``excludes`` syntax: gitwildmatch through ``pathspec``).

    Only ``ray._private.runtime_env.packaging`` has it; using it means the answer is
    what the upload does. Checked with ray 2.60.0.
    """
    from ray._private.runtime_env.packaging import _get_excludes

    return _get_excludes(root, list(patterns))


def ray_walk_upload(root: Path, excludes: Sequence[str], take: Callable[[Path], None],
                    include_gitignore: bool, logger: logging.Logger) -> None:
    """Call ``take`` on every path Ray would pack as a job's working dir from ``root``.

    Ray walks the folder with ``ray._private.runtime_env.packaging._dir_travel``
    (honouring ``.gitignore`` / ``.rayignore`` at every level); no public call lists
    what it ships. Checked with ray 2.60.0.
    """
    from ray._private.runtime_env.packaging import _dir_travel

    _dir_travel(root, [ray_excludes(root, excludes)], take,
                include_gitignore=include_gitignore, logger=logger)


def asha_rungs(scheduler: Any, trial_id: str) -> list[tuple[float, dict]] | None:
    """The rungs of the ASHA bracket ``trial_id`` is in: (milestone, {trial id: value})
    in descending milestone order, the dicts ASHA itself reads; None if it has none.

    ``ASHAScheduler`` keeps them in ``_trial_info`` / ``_Bracket._rungs`` and has no
    public way to record a value for a trial at a rung. Checked with ray 2.60.0.
    """
    bracket = scheduler._trial_info.get(trial_id)
    return None if bracket is None else bracket._rungs


def stop_hung_trial(controller: Any, trial: Any) -> None:
    """``controller.stop_trial(trial)`` for a trial that stopped reporting, its actor killed
    at once and never kept for the next trial.

    With ``reuse_actors`` Ray Tune caches a stopped trial's actor and hands the next trial
    to it, and stops an uncached one gracefully (600 s before it kills it): an actor hung
    in an import or a C call runs neither, so the sweep stalled with every slot taken.
    ``TuneController`` keeps the actors in ``_trial_to_actor``, the switch in
    ``_reuse_actors`` and the manager in ``_actor_manager``; a scheduler is handed a
    ``TrialRunnerWrapper`` around it (``_tune_controller``). Checked with ray 2.60.0.
    """
    controller = getattr(controller, "_tune_controller", controller)
    tracked = controller._trial_to_actor.get(trial)
    reuse = controller._reuse_actors
    controller._reuse_actors = False
    try:
        controller.stop_trial(trial)
    finally:
        controller._reuse_actors = reuse
    if tracked is not None:
        controller._actor_manager.remove_actor(tracked, kill=True)


def optuna_search_study(searcher: Any) -> Any:
    """The ``optuna.Study`` a Ray Tune ``OptunaSearch`` asks and tells.

    ``OptunaSearch`` keeps it in ``_ot_study`` with no public accessor.
    Checked with ray 2.60.0.
    """
    return searcher._ot_study


def optuna_search_trials(searcher: Any) -> dict[str, Any]:
    """The live ``optuna.Trial`` of each Tune trial id an ``OptunaSearch`` has asked for
    (the searcher's own dict: a change shows there).

    ``OptunaSearch`` keeps it in ``_ot_trials``. Checked with ray 2.60.0.
    """
    return searcher._ot_trials


def optuna_search_completed(searcher: Any) -> set[str]:
    """The Tune trial ids an ``OptunaSearch`` has told Optuna about (its own set).

    ``OptunaSearch`` keeps them in ``_completed_trials``. Checked with ray 2.60.0.
    """
    return searcher._completed_trials


def reopen_optuna_search(searcher: Any, storage: Any) -> None:
    """Point a restored ``OptunaSearch`` at its study in ``storage``, keeping its sampler
    and its running trials.

    ``OptunaSearch.restore`` un-pickles the study with the storage it had when saved
    (a journal file whose folder may since have moved); no public call swaps it. An
    ``optuna.Trial`` is rebuilt from its storage id, which only the private
    ``Trial._trial_id`` holds (the number would need the stale storage). Checked with
    ray 2.60.0 and optuna 5.0.0.
    """
    import optuna

    study = optuna.load_study(study_name=searcher._ot_study.study_name, storage=storage,
                              sampler=searcher._sampler)
    searcher._ot_study = study
    searcher._ot_trials = {tid: optuna.Trial(study, t._trial_id)
                           for tid, t in searcher._ot_trials.items()}


def adopt_optuna_trial(searcher: Any, trial_id: str, frozen: Any) -> None:
    """Have an ``OptunaSearch`` hold the study's running trial ``frozen`` for Tune trial
    ``trial_id`` (asked before a driver died, after Ray Tune last saved the searcher), so
    it can be told. ``optuna.Trial`` is rebuilt from the private storage id
    ``FrozenTrial._trial_id``. Checked with ray 2.60.0 and optuna 5.0.0."""
    import optuna

    searcher._ot_trials[trial_id] = optuna.Trial(searcher._ot_study, frozen._trial_id)
