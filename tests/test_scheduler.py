"""ASHA in sweeps: a trial the rules stopped counts at the rung it did not reach."""

from __future__ import annotations

from types import SimpleNamespace

from ray.tune.schedulers import TrialScheduler

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
    last = {"step": 300, "val_loss": 0.9}  # max_t
    assert asha.on_trial_result(None, trials["last"], last) == TrialScheduler.CONTINUE
