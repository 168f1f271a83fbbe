"""Each private access in ``sweeps.tune.compat`` against the installed Ray and Optuna."""

from __future__ import annotations

import logging
import os
from importlib.metadata import version
from pathlib import Path

import optuna
import pytest
from packaging.requirements import Requirement
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search.optuna import OptunaSearch

from sweeps.tune import compat

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the ranges are the same on 3.10

ROOT = Path(__file__).resolve().parents[2]


def _declared() -> dict[str, Requirement]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {r.name: r for r in map(Requirement, deps)}


@pytest.mark.parametrize("name", ["ray", "optuna"])
def test_installed_version_is_in_the_declared_range(name):
    assert version(name) in _declared()[name].specifier


@pytest.mark.parametrize("name", ["ray", "optuna"])
def test_guard_range_is_the_declared_one(name):
    assert str(_declared()[name].specifier) == str(
        Requirement(f"{name}{compat.TESTED[name][0]}").specifier)


def test_check_versions_passes_on_the_installed_ones():
    compat.check_versions()


def test_check_versions_names_version_range_and_fix(monkeypatch):
    monkeypatch.setitem(compat.TESTED, "ray", (">=9.0,<9.1", "pip install ray==9.0.*"))
    with pytest.raises(compat.UnsupportedVersion) as err:
        compat.check_versions()
    assert version("ray") in err.value.problem and ">=9.0,<9.1" in err.value.problem
    assert err.value.fix == "pip install ray==9.0.*" and err.value.exit_code == 2


def test_reload_ray_config_rereads_the_environment(monkeypatch):
    from ray._raylet import Config

    compat.reload_ray_config()
    before = Config.health_check_period_ms()
    monkeypatch.setenv("RAY_health_check_period_ms", str(before + 1234))
    assert Config.health_check_period_ms() == before  # cached at import
    compat.reload_ray_config()
    assert Config.health_check_period_ms() == before + 1234
    monkeypatch.delenv("RAY_health_check_period_ms")
    compat.reload_ray_config()
    assert Config.health_check_period_ms() == before


def test_reset_ray_token_cache_reads_the_new_token(monkeypatch):
    from ray._raylet import AuthenticationTokenLoader

    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "a" * 64)
    compat.reload_ray_config()
    compat.reset_ray_token_cache()
    loader = AuthenticationTokenLoader.instance()
    assert loader.get_raw_token() == "a" * 64
    monkeypatch.setenv("RAY_AUTH_TOKEN", "b" * 64)
    assert loader.get_raw_token() == "a" * 64  # cached
    compat.reset_ray_token_cache()
    assert loader.get_raw_token() == "b" * 64
    monkeypatch.undo()
    compat.reload_ray_config()
    compat.reset_ray_token_cache()


def test_set_ray_single_machine_switches_and_restores():
    from ray._private import ray_constants

    old = compat.set_ray_single_machine(True)
    try:
        assert old is not None and ray_constants.ENABLE_RAY_CLUSTER is False
        assert compat.set_ray_single_machine(None) is None
        assert ray_constants.ENABLE_RAY_CLUSTER is False
    finally:
        assert compat.set_ray_single_machine(old) is True
    assert ray_constants.ENABLE_RAY_CLUSTER is (not old)


def test_ray_upload_walk_honours_excludes_and_gitignore(tmp_path):
    for name in ("a.py", "secret.key", "logs/x.log", "sub/b.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / ".gitignore").write_text("logs/\n")
    seen: list[str] = []
    compat.ray_walk_upload(tmp_path, ["*.key"], lambda p: p.is_file() and seen.append(
        p.relative_to(tmp_path).as_posix()), include_gitignore=True,
        logger=logging.getLogger(__name__))
    assert sorted(seen) == [".gitignore", "a.py", "sub/b.py"]
    is_key = compat.ray_excludes(tmp_path, ["*.key"])
    assert is_key(tmp_path / "secret.key") and not is_key(tmp_path / "a.py")


class _Trial:
    """What ASHA reads of a trial when it is added: its id."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id


def _asha() -> ASHAScheduler:
    sched = ASHAScheduler(metric="m", mode="max", max_t=27, grace_period=1,
                          reduction_factor=3)
    sched.on_trial_add(None, _Trial("t1"))
    return sched


def _first_rung(sched: ASHAScheduler, value: float) -> str:
    return sched.on_trial_result(None, _Trial("t1"), {"m": value, "training_iteration": 1})


@pytest.mark.parametrize("recorded", [{}, {"t0": 5.0}])
def test_asha_cuts_on_the_rungs_compat_gives(recorded):
    sched = _asha()
    rungs = compat.asha_rungs(sched, "t1")
    assert [m for m, _ in rungs] == [27, 9, 3, 1]
    rungs[-1][1].update(recorded)  # as sweeps records a failed trial at its next rung
    assert _first_rung(sched, 0.1) == (ASHAScheduler.STOP if recorded else ASHAScheduler.CONTINUE)
    assert compat.asha_rungs(sched, "nobody") is None


def _searcher(storage=None) -> OptunaSearch:
    return OptunaSearch(space={"x": optuna.distributions.FloatDistribution(0, 1)},
                        metric="loss", mode="min", study_name="s", storage=storage,
                        sampler=optuna.samplers.RandomSampler(seed=0))


def test_optuna_search_state_is_the_searchers_own():
    search = _searcher()
    config = search.suggest("t1")
    study = compat.optuna_search_study(search)
    trials = compat.optuna_search_trials(search)
    assert isinstance(study, optuna.Study) and set(trials) == {"t1"}
    assert trials["t1"].params["x"] == config["x"]
    search.on_trial_complete("t1", {"loss": 0.5, **config})
    assert compat.optuna_search_completed(search) == {"t1"}
    assert study.get_trials()[0].values == [0.5]


def test_reopen_optuna_search_moves_the_study_to_a_new_storage(tmp_path):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    old = tmp_path / "old.journal"
    search = _searcher(JournalStorage(JournalFileBackend(str(old))))
    search.suggest("t1")
    moved = tmp_path / "moved.journal"
    os.replace(old, moved)
    compat.reopen_optuna_search(search, JournalStorage(JournalFileBackend(str(moved))))
    study = compat.optuna_search_study(search)
    trial = compat.optuna_search_trials(search)["t1"]
    trial.set_user_attr("seen", True)
    study.tell(trial, 0.25)
    assert not old.exists()
    reread = optuna.load_study(study_name="s",
                               storage=JournalStorage(JournalFileBackend(str(moved))))
    [frozen] = reread.get_trials()
    assert frozen.values == [0.25] and frozen.user_attrs["seen"] is True


def test_importing_compat_imports_neither_ray_nor_optuna():
    import subprocess
    import sys

    code = ("import sys, sweeps.tune.compat; "
            "print(sorted(m for m in ('ray', 'optuna', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert out.stdout.strip() == "[]"


def test_the_driver_stops_before_ray_starts_on_an_untested_ray(monkeypatch):
    from sweeps.tune.session import ray_running

    monkeypatch.setitem(compat.TESTED, "ray", (">=9.0,<9.1", "pip install ray==9.0.*"))
    started = []
    with pytest.raises(compat.UnsupportedVersion, match="not the tested ray>=9.0,<9.1"):
        with ray_running(num_cpus=2):
            started.append(True)
    assert not started
