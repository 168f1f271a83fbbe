"""ASHA in sweeps: a trial the rules stopped counts at the rung it did not reach."""

from __future__ import annotations

from types import SimpleNamespace

from ray.tune.schedulers import TrialScheduler

from sweeps.protocol import WARM_BEST_KEY
from sweeps.record.book import TrialBook
from sweeps.spec.loader import load_sweep
from sweeps.tune import compat
from sweeps.tune.schedulers import WatchedASHA


def _asha(book: TrialBook) -> WatchedASHA:
    return WatchedASHA(book, None, time_attr="step", metric="val_loss", mode="min", max_t=300,
                       grace_period=75, reduction_factor=3, brackets=1,
                       stop_last_trials=False)


def _unstable(book: TrialBook, trial_id: str, step: int) -> None:
    for s in range(1, step + 1):
        book.record(trial_id, {"step": s, "loss": 1.0, "config": {"lr": 5.0}})
    book.record(trial_id, {"step": step, "loss": float("nan"), "config": {"lr": 5.0},
                           "sweeps/status": "unstable", "sweeps/reason": "non_finite",
                           "sweeps/stop_step": step, "sweeps/evidence": "{}"})


def _second_at_first_rung(linreg_dir, failed_first: bool) -> str:
    book = TrialBook(load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir))
    asha = _asha(book)
    trials = {t: SimpleNamespace(trial_id=t) for t in ("nan", "good", "next")}
    for trial in trials.values():
        asha.on_trial_add(None, trial)
    if failed_first:
        _unstable(book, "nan", 5)
        asha.on_trial_complete(None, trials["nan"], {"step": 5})
        rung = next(recorded for milestone, recorded in compat.asha_rungs(asha, "nan")
                    if milestone == 75)
        assert rung == {"nan": -1e300}, "recorded as the worst at the next rung"
    assert asha.on_trial_result(None, trials["good"], {"step": 75, "val_loss": 0.5}) == \
        TrialScheduler.CONTINUE
    return asha.on_trial_result(None, trials["next"], {"step": 75, "val_loss": 0.6})


def test_a_failed_trial_keeps_the_promotion_rate_of_its_rung(linreg_dir):
    # 0.6 is behind the only stable trial at the rung: alone with it, ASHA stops it;
    # with the trial that went NaN before the rung counted, it is in the top third
    assert _second_at_first_rung(linreg_dir, failed_first=False) == \
        TrialScheduler.STOP
    assert _second_at_first_rung(linreg_dir, failed_first=True) == \
        TrialScheduler.CONTINUE


def test_no_cut_while_the_reported_lr_rises_nor_at_the_last_step(linreg_dir):
    """A OneCycleLR warmup (``pct_start``, no ``warmup`` knob) still rising at the rung:
    ASHA waits; the same trial with its LR falling is judged; a trial at its last step
    has finished and is never cut (it would be ``pruned`` after running every step)."""
    book = TrialBook(load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir))
    asha = _asha(book)
    trials = {t: SimpleNamespace(trial_id=t) for t in ("good", "warming", "decaying", "last")}
    for trial in trials.values():
        asha.on_trial_add(None, trial)
    assert asha.on_trial_result(None, trials["good"], {"step": 75, "val_loss": 0.1}) == \
        TrialScheduler.CONTINUE

    def at_rung(trial_id: str, lrs: tuple[float, float]) -> str:
        book.record(trial_id, {"step": 74, "loss": 1.0, "lr": lrs[0], "config": {"lr": 0.1}})
        result = {"step": 75, "val_loss": 0.9, "lr": lrs[1]}
        book.record(trial_id, {**result, "loss": 1.0, "config": {"lr": 0.1}})
        return asha.on_trial_result(None, trials[trial_id], result)

    assert at_rung("warming", (0.05, 0.051)) == TrialScheduler.CONTINUE
    assert at_rung("decaying", (0.051, 0.05)) == TrialScheduler.STOP
    # the Lightning adapter's validation report carries no lr: the LR of the training
    # reports up to its step still rises
    trials["val_report"] = SimpleNamespace(trial_id="val_report")
    asha.on_trial_add(None, trials["val_report"])
    for step, lr in ((73, 0.049), (74, 0.05), (75, 0.051)):
        book.record("val_report", {"step": step, "loss": 1.0, "lr": lr, "config": {"lr": 0.1}})
    assert asha.on_trial_result(None, trials["val_report"], {"step": 75, "val_loss": 0.9}) \
        == TrialScheduler.CONTINUE
    last = {"step": 300, "val_loss": 0.9}  # max_t
    assert asha.on_trial_result(None, trials["last"], last) == TrialScheduler.CONTINUE
    # the last tenth of the steps is never judged: behind the rung's leader at step 280
    for t in ("ahead", "near_end"):
        trials[t] = SimpleNamespace(trial_id=t)
        asha.on_trial_add(None, trials[t])
    assert asha.on_trial_result(None, trials["ahead"], {"step": 240, "val_loss": 0.1}) == \
        TrialScheduler.CONTINUE
    assert asha.on_trial_result(None, trials["near_end"], {"step": 240, "val_loss": 0.9}) == \
        TrialScheduler.STOP
    trials["late"] = SimpleNamespace(trial_id="late")
    asha.on_trial_add(None, trials["late"])
    assert asha.on_trial_result(None, trials["late"], {"step": 280, "val_loss": 0.9}) == \
        TrialScheduler.CONTINUE


def test_a_resumed_sweep_rebuilds_the_rungs_from_its_trials(linreg_dir):
    """Ray Tune keeps no scheduler state: after ``sweeps resume`` ASHA starts with empty
    rungs and cut none of the trials still to run. The rungs are rebuilt from the book, as
    the uninterrupted sweep recorded them, so the next trial is cut as it would have been."""
    book = TrialBook(load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir))
    live = _asha(book)
    trials = {t: SimpleNamespace(trial_id=t, config={}) for t in ("a", "b", "nan")}
    for trial_id, loss in (("a", 0.5), ("b", 0.4)):
        live.on_trial_add(None, trials[trial_id])
        for step in range(1, 301):
            result = {"step": step, "val_loss": loss + 1.0 / step}
            book.record(trial_id, {**result, "config": {"lr": 0.1}})
            live.on_trial_result(None, trials[trial_id], result)
        book.record(trial_id, {"step": 300, "val_loss": loss + 1 / 300, "config": {"lr": 0.1},
                               "sweeps/status": "ok", "sweeps/final": 1})
        live.on_trial_complete(None, trials[trial_id], {"step": 300, "val_loss": loss})
    live.on_trial_add(None, trials["nan"])
    _unstable(book, "nan", 5)
    live.on_trial_complete(None, trials["nan"], {"step": 5})
    resumed = _asha(book)  # a new scheduler, as Tuner.restore makes, told of every trial
    for trial in trials.values():
        resumed.on_trial_add(None, trial)
    for asha in (live, resumed):  # one bracket: a new trial's rungs are every trial's
        asha.on_trial_add(None, SimpleNamespace(trial_id="view", config={}))
    rungs = [(m, dict(r)) for m, r in compat.asha_rungs(live, "view")]
    assert [(m, dict(r)) for m, r in compat.asha_rungs(resumed, "view")] == rungs
    assert {"a", "b", "nan"} <= set(dict(rungs)[75]), "every trial counted at the first rung"
    late = SimpleNamespace(trial_id="late", config={})
    resumed.on_trial_add(None, late)
    assert resumed.on_trial_result(None, late, {"step": 75, "val_loss": 0.9}) == \
        TrialScheduler.STOP, "behind the top third of the rung, as before the resume"


def test_an_earlier_best_queued_by_a_warm_start_is_recorded_at_the_rung_not_cut(linreg_dir):
    """The config a warm start queued first (``WARM_BEST_KEY`` in its Ray config) runs its
    full length behind the rung's leader, where a plain trial with the same value is cut;
    its value still counts at the rung for the trials after it."""
    book = TrialBook(load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir))
    asha = _asha(book)
    trials = {"good": SimpleNamespace(trial_id="good", config={}),
              "plain": SimpleNamespace(trial_id="plain", config={}),
              "earlier": SimpleNamespace(trial_id="earlier", config={WARM_BEST_KEY: 7})}
    for trial in trials.values():
        asha.on_trial_add(None, trial)
    assert asha.on_trial_result(None, trials["good"], {"step": 75, "val_loss": 0.1}) == \
        TrialScheduler.CONTINUE
    assert asha.on_trial_result(None, trials["plain"], {"step": 75, "val_loss": 0.9}) == \
        TrialScheduler.STOP
    assert asha.on_trial_result(None, trials["earlier"], {"step": 75, "val_loss": 0.9}) == \
        TrialScheduler.CONTINUE
    rung = next(r for m, r in compat.asha_rungs(asha, "earlier") if m == 75)
    assert rung["earlier"] == -0.9, "its value counts at the rung (ASHA keeps higher-better)"
