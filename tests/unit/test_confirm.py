"""The pure parts of confirmation: the re-run plan, verdicts from a hand-filled book,
how many hold, and how many candidates a step budget can still afford."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sweeps.errors import SpecError
from sweeps.protocol import LR_SCALE_KEY, ROLE_KEY, SEED_KEY
from sweeps.record.book import TrialBook, TrialRecord
from sweeps.results.confirm import (
    BaseReference,
    SeedRun,
    affordable,
    base_reference,
    fresh_seeds,
    judge,
    judge_own_base,
    ladder,
    mark_poor,
    pair_on_shared_seeds,
    plan,
    why_none_held,
)
from sweeps.spec.loader import Sweep
from tests.unit.conftest import book_of, load_linreg, rec


def _sweep(tmp_path: Path, **confirm: object) -> Sweep:
    """linreg with ``confirm`` settings (baseline_loss 1.0, tolerance 0.2 by default)."""
    return load_linreg(tmp_path, confirm={"seeds": 2, "lr_probe": 2.0, **confirm})


def _rerun(of: str, seed: int, val_loss: float | None, status: str = "ok",
           kind: str = "confirm", **extra: object) -> TrialRecord:
    r = rec(f"{kind}-{of}-{seed}", status=status, role=f"{kind}:{of}", seed=seed,
            **({} if val_loss is None else {"val_loss": val_loss}))
    for key, value in extra.items():
        setattr(r, key, value)
    return r


def _judged(sweep: Sweep, cand: TrialRecord, *runs: TrialRecord, on_front: bool = True):
    book = book_of(sweep, cand, *runs)
    return judge(sweep, book, cand, on_front)


def test_plan_screen_then_the_ladder(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, seeds=3)
    cand = rec("c1", values={"lr": 0.05}, seed=0)
    book = book_of(sweep, cand)
    assert fresh_seeds(sweep) == [1, 2, 3]
    screen = plan(sweep, book, [cand], "screen")
    assert screen == [{"lr": 0.05, SEED_KEY: 1, ROLE_KEY: "confirm:c1", LR_SCALE_KEY: None}]
    every = plan(sweep, book, [cand])
    assert [(r[ROLE_KEY], r[SEED_KEY]) for r in every] == [
        ("confirm:c1", 1), ("probe:c1", 0), ("confirm:c1", 2), ("confirm:c1", 3)]
    assert every[1] == {"lr": 0.05, SEED_KEY: 0, LR_SCALE_KEY: 2.0, ROLE_KEY: "probe:c1"}


def test_the_ladder_skips_runs_started_and_grows_after_a_failed_probe(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, seeds=2, narrow_seeds=4)
    cand = rec("c", val_loss=0.1)
    running = _rerun("c", 1, None, status="running", finished=False)
    assert [(r[ROLE_KEY], r[SEED_KEY]) for r in ladder(sweep, book_of(sweep, cand, running),
                                                        cand)] == [("probe:c", 0),
                                                                   ("confirm:c", 2)]
    assert plan(sweep, book_of(sweep, cand, running), [cand], "screen") == []
    failed = _rerun("c", 0, None, status="unstable", kind="probe", stop_step=5)
    book = book_of(sweep, cand, _rerun("c", 1, 0.1), failed)
    assert [r[SEED_KEY] for r in ladder(sweep, book, cand)] == [2, 3, 4]


def test_seeds_that_agree_still_need_every_planned_seed(tmp_path: Path) -> None:
    """confirm.seeds is a floor: a config unstable on one seed in three passes one fresh
    seed and the probe almost half the time, so agreeing seeds settle nothing early."""
    sweep = _sweep(tmp_path, seeds=3)
    cand = rec("c", val_loss=0.10)
    agrees = _judged(sweep, cand, _rerun("c", 1, 0.1), _rerun("c", 0, 0.1, kind="probe"))
    assert agrees.planned == 3 and agrees.verdict == "incomplete"


def test_plan_without_probe_or_seeds(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, seeds=0, lr_probe=0)
    assert plan(sweep, book_of(sweep), [rec("c1")]) == []


def test_confirmed_on_every_fresh_seed(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path)
    cand = rec("c", val_loss=0.10)
    conf = _judged(sweep, cand, _rerun("c", 2, 0.12), _rerun("c", 1, 0.11),
                   _rerun("c", 0, 0.13, kind="probe"))
    assert conf.verdict == "confirmed" and conf.holds and conf.fragile_reason is None
    assert conf.seeds == [1, 2]  # sorted by seed
    assert conf.by_seed == {0: 0.10, 1: 0.11, 2: 0.12}
    assert conf.mean == pytest.approx(0.115)  # fresh seeds only
    assert conf.worst == 0.12 and conf.best == 0.10
    assert conf.spread == pytest.approx(0.02 / 0.9)  # share of the improvement over 1.0
    assert conf.lr_sensitivity == pytest.approx(0.3)


def test_unstable_fresh_seed_is_fragile(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path)
    cand = rec("c", val_loss=0.10)
    blown = _rerun("c", 1, None, status="unstable", reason="divergence", stop_step=7)
    conf = _judged(sweep, cand, blown)
    assert conf.verdict == "fragile" and not conf.holds
    assert conf.fragile_reason == ("unstable on a fresh seed: seed 1: divergence @ 7 (settled "
                                   "by 1 of 3 confirmation runs; the rest were not run)")


def test_a_failed_probe_asks_for_more_seeds_not_a_veto(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, narrow_seeds=4)
    cand = rec("c", val_loss=0.10)
    probe = _rerun("c", 0, None, status="crash", kind="probe", stop_step=3)
    conf = _judged(sweep, cand, _rerun("c", 1, 0.1), _rerun("c", 2, 0.1), probe)
    assert conf.verdict == "incomplete" and conf.planned == 4
    assert conf.lr_sensitivity == math.inf and conf.margin == "narrow (crash @ 3)"
    held = _judged(sweep, cand, *[_rerun("c", s, 0.1) for s in (1, 2, 3, 4)], probe)
    assert held.verdict == "confirmed" and held.margin == "narrow (crash @ 3)"
    strict = _sweep(tmp_path / "strict", require_margin=True)
    conf = _judged(strict, cand, _rerun("c", 1, 0.1), _rerun("c", 2, 0.1), probe)
    assert conf.verdict == "fragile" and conf.fragile_reason == "LR probe unstable: crash @ 3"


def test_a_probe_that_held_but_gave_up_its_gain_is_a_narrow_margin(tmp_path: Path) -> None:
    """At LR x 2 the run held but lost 40 % of the candidate's gain over the random guess
    (1.0) at the same step: near an edge, so it races on confirm.narrow_seeds; a probe
    that lost less than the tolerance (20 %) leaves the margin wide."""
    sweep = _sweep(tmp_path, narrow_seeds=4)
    cand = rec("c", val_loss=0.10)
    far = _rerun("c", 0, 0.46, kind="probe")
    conf = _judged(sweep, cand, _rerun("c", 1, 0.1), _rerun("c", 2, 0.1), far)
    assert conf.probe_loss == pytest.approx(0.4)
    assert conf.margin == "narrow (held, but 40% of its gain lost @ 10)" and conf.narrow
    assert conf.verdict == "incomplete" and conf.planned == 4
    assert [r[SEED_KEY] for r in ladder(sweep, book_of(sweep, cand, far), cand)] == [1, 2, 3, 4]
    near = _judged(sweep, cand, _rerun("c", 1, 0.1), _rerun("c", 2, 0.1),
                   _rerun("c", 0, 0.19, kind="probe"))
    assert near.margin == "wide" and near.planned == 2 and near.verdict == "confirmed"
    strict = _sweep(tmp_path / "strict", require_margin=True)
    conf = _judged(strict, cand, _rerun("c", 1, 0.1), _rerun("c", 2, 0.1), far)
    assert conf.verdict == "fragile"
    assert conf.fragile_reason == "LR probe: margin narrow (held, but 40% of its gain lost @ 10)"


def test_seed_gap_beyond_tolerance_is_fragile(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path)
    cand = rec("c", val_loss=0.10)
    conf = _judged(sweep, cand, _rerun("c", 1, 0.40), _rerun("c", 2, 0.11),
                   _rerun("c", 0, 0.1, kind="probe"))
    assert conf.verdict == "fragile"
    assert conf.fragile_reason.startswith("seed 1: val_loss 0.4 against seed 0's 0.1, 33% "
                                          "of its improvement over the random guess")


def test_missing_reruns_are_incomplete(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path)
    conf = _judged(sweep, rec("c", val_loss=0.1), _rerun("c", 1, 0.1))
    assert conf.verdict == "incomplete"
    assert conf.fragile_reason == "only 1 of 3 confirmation runs recorded"
    unfinished = _rerun("c", 2, 0.1, finished=False)
    assert _judged(sweep, rec("c", val_loss=0.1), unfinished).seeds == []


def test_unreported_quality_is_incomplete(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, lr_probe=0)
    conf = _judged(sweep, rec("c", val_loss=0.1), _rerun("c", 1, 0.1), _rerun("c", 2, None))
    assert conf.verdict == "incomplete"
    assert conf.fragile_reason == "no val_loss reported on seed(s) [2]"


def test_no_seeds_planned_is_unconfirmed(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, seeds=0, lr_probe=0)
    conf = _judged(sweep, rec("c", val_loss=0.1))
    assert conf.verdict == "unconfirmed" and conf.holds and not conf.confirmed
    assert conf.mean == 0.1  # the search seed's when no fresh seed ran


def test_pruned_search_run_is_not_counted(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, lr_probe=0)
    cand = rec("c", status="pruned", val_loss=0.9)
    conf = _judged(sweep, cand, _rerun("c", 1, 0.1), _rerun("c", 2, 0.1))
    assert conf.search.stop_step == 10
    assert conf.verdict == "confirmed" and conf.worst == 0.1


def test_holding_marks_far_off_front_candidates_poor(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, lr_probe=0)
    good = _judged(sweep, rec("good", val_loss=0.1), _rerun("good", 1, 0.1),
                   _rerun("good", 2, 0.1))
    far = _judged(sweep, rec("far", val_loss=0.5), _rerun("far", 1, 0.5),
                  _rerun("far", 2, 0.5), on_front=False)
    near = _judged(sweep, rec("near", val_loss=0.2), _rerun("near", 1, 0.2),
                   _rerun("near", 2, 0.2), on_front=False)
    front_far = _judged(sweep, rec("ff", val_loss=0.5), _rerun("ff", 1, 0.5),
                        _rerun("ff", 2, 0.5), on_front=True)
    assert mark_poor([good, far, near, front_far]) == 3
    assert far.verdict == "poor" and far.poor_against == 0.1
    assert ("44% of the best's improvement over the random guess behind the best confirmed "
            "config's 0.1") in far.fragile_reason
    assert near.holds and front_far.holds
    assert mark_poor([far]) == 1 and far.verdict == "confirmed"  # judged afresh each time
    assert mark_poor([]) == 0
    # quality alone (no other objective): the front is the best search value, no trade-off
    assert mark_poor([good, far, near, front_far], trades=False) == 2
    assert front_far.verdict == "poor" and front_far.poor_against == 0.1


def test_an_off_front_candidate_behind_the_base_config_is_poor(tmp_path: Path) -> None:
    """Within the tolerance of the best, but worse than the user's own values on the
    fresh seeds both ran: stable/ must not offer it (a new user's reserve config did)."""
    sweep = _sweep(tmp_path, lr_probe=0)
    quality = sweep.objectives[0]
    base = BaseReference({"lr": 0.01}, quality, [
        SeedRun(0, "ok", None, 10, 0.30),  # the search seed: not compared (picked there)
        SeedRun(1, "ok", None, 10, 0.26), SeedRun(2, "ok", None, 10, 0.28)], search_seed=0)
    assert base.fresh == {1: 0.26, 2: 0.28} and base.mean == pytest.approx(0.27)
    good = _judged(sweep, rec("good", val_loss=0.25), _rerun("good", 1, 0.25),
                   _rerun("good", 2, 0.26))
    behind = _judged(sweep, rec("behind", val_loss=0.2), _rerun("behind", 1, 0.28),
                     _rerun("behind", 2, 0.29), on_front=False)
    ahead = _judged(sweep, rec("ahead", val_loss=0.31), _rerun("ahead", 1, 0.265),
                    _rerun("ahead", 2, 0.27), on_front=False)
    on_front = _judged(sweep, rec("front", val_loss=0.2), _rerun("front", 1, 0.3),
                       _rerun("front", 2, 0.3), on_front=True)
    assert mark_poor([good, behind, ahead, on_front], base) == 3
    assert behind.verdict == "poor" and behind.behind_base == pytest.approx((0.285, 0.27))
    assert "worse than the base config's 0.27" in behind.fragile_reason
    assert ahead.holds and on_front.holds and good.holds
    # the base config's own search trial is never behind itself
    assert mark_poor([behind], base, base_id="behind") == 1 and behind.holds
    assert mark_poor([behind]) == 1 and behind.holds  # no base config run: nothing to compare
    assert base.summary() == "mean val_loss 0.27 on fresh seeds 1, 2"
    base.runs.append(SeedRun(4, "pruned", None, 100, 0.5))  # cut for trailing: no failure
    assert base.summary() == ("mean val_loss 0.27 on fresh seeds 1, 2 (cut by the scheduler "
                              "for trailing on seed 4 @ 100)")
    assert mark_poor([behind], base) == 0 and behind.verdict == "poor"  # still behind
    base.runs.append(SeedRun(3, "unstable", "non_finite", 5, None))
    assert mark_poor([behind], base) == 1 and behind.holds, "a base config that failed a seed"
    assert "(unstable on seed 3: non_finite @ 5)" in base.summary()


def test_a_base_config_off_the_search_space_is_judged_on_its_fresh_seeds(
        tmp_path: Path) -> None:
    """Its lr (0.1) lies above the space, so its runs are the fresh seeds alone: every one
    counts (no search seed to leave out), and it holds or not like any candidate."""
    sweep = load_linreg(tmp_path, search_space={"lr": {"type": "loguniform", "low": 1e-3,
                                                       "high": 0.05}},
                        confirm={"seeds": 2, "lr_probe": 2.0})
    search = rec("s1", values={"lr": 0.01}, val_loss=0.3)
    held = [_rerun("b", 1, 0.20, kind="base"), _rerun("b", 2, 0.22, kind="base")]
    for r in held:
        r.role = "base"
    def own_base(sweep: Sweep, *records: TrialRecord):
        book = book_of(sweep, *records)
        return judge_own_base(sweep, book, base_reference(sweep, book))

    own = own_base(sweep, search, *held)
    assert own is not None and not own.searched and own.trial_id == "base-b-1"
    assert own.mean == pytest.approx(0.21) and own.by_seed == {1: 0.20, 2: 0.22}
    assert own.verdict == "confirmed" and own.margin == "untested"  # no probe for it
    held[1].status, held[1].reason = "unstable", "non_finite"
    held[1].history = [{"step": 5}]
    broken = own_base(sweep, search, *held)
    assert broken.verdict == "fragile" and "seed 2: non_finite" in broken.fragile_reason
    only_one = own_base(sweep, search, held[0])
    assert only_one.verdict == "incomplete"  # 1 of its 2 fresh seeds recorded
    # inside the space it is a search trial, judged as one: no own-base candidate
    inside = load_linreg(tmp_path / "in", confirm={"seeds": 2})
    base_trial = rec("s0", values={"lr": 0.1}, val_loss=0.3)
    assert own_base(inside, base_trial) is None
    assert own_base(load_linreg(tmp_path / "none", search_space={"lr": {
        "type": "loguniform", "low": 1e-3, "high": 0.05}}, confirm={"seeds": 2, "base": False}),
        *held) is None  # confirm.base: false


def _spent(sweep: Sweep, steps: int) -> TrialBook:
    r = rec("s")
    r.history = [{"step": steps}]
    return book_of(sweep, r)


def test_affordable_without_step_budget_takes_what_is_needed(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path)
    queue = [rec(f"c{i}") for i in range(5)]
    assert affordable(sweep, _spent(sweep, 10_000), queue, 3) == 3


def test_affordable_counts_full_reruns_left_in_the_step_budget(tmp_path: Path) -> None:
    sweep = load_linreg(tmp_path, budget={"total_steps": 1000},
                        confirm={"seeds": 2, "lr_probe": 2.0})
    queue = [rec(f"c{i}") for i in range(5)]
    # each candidate costs 3 re-runs x 60 steps = 180 steps
    assert affordable(sweep, _spent(sweep, 1000 - 400), queue, 4) == 2
    assert affordable(sweep, _spent(sweep, 1000 - 179), queue, 4) == 0
    assert affordable(sweep, _spent(sweep, 0), queue, 1) == 1


def test_affordable_takes_candidates_with_nothing_to_rerun_past_the_budget(
        tmp_path: Path) -> None:
    """Without fresh seeds or a probe a candidate costs nothing: a search that ran past
    ``total_steps`` (running trials finish) still hands over ``confirm.keep`` configs, and
    no note says confirmation stopped for a budget it does not need."""
    sweep = load_linreg(tmp_path, budget={"total_steps": 1000},
                        confirm={"seeds": 0, "lr_probe": 0})
    queue = [rec(f"c{i}") for i in range(5)]
    assert affordable(sweep, _spent(sweep, 1100), queue, 3) == 3


def test_a_knob_the_base_config_leaves_at_hydra_missing_has_no_base_config(
        tmp_path) -> None:
    from sweeps.results.confirm import base_point
    from sweeps.trial.tryout import try_values
    from tests.unit.conftest import load_linreg

    sweep = load_linreg(tmp_path, train={"lr": "???"})
    assert sweep.base_unset == ["lr"] and sweep.base_value("lr") is None
    assert any("leaves lr at ??? (no value)" in note for note in sweep.notes)
    assert base_point(sweep) is None  # no base config to race or hand over
    assert try_values(sweep, {})["lr"] != "???"  # the range's middle
    assert base_point(load_linreg(tmp_path / "set")) == {"lr": 0.1}


def test_fresh_seeds_of_a_config_that_learnt_after_a_plateau_get_a_longer_patience(
        tmp_path: Path) -> None:
    from sweeps.protocol import FLAT_PATIENCE_KEY
    from sweeps.trial.run import trial_settings

    sweep = load_linreg(tmp_path, confirm={"seeds": 2, "lr_probe": 2.0},
                        rules={"flat_patience": 30})  # baseline_loss 1.0
    plateau = TrialRecord("slow", {"lr": 0.1}, 0, history=[
        {"step": t, "loss": 1.0 if t < 40 else 0.3} for t in range(1, 61)], status="ok",
        finished=True)
    runs = ladder(sweep, book_of(sweep, plateau), plateau)
    fresh = [r for r in runs if r[ROLE_KEY] == "confirm:slow"]
    # the mean of 20 losses leaves the sweep's 10 % band at step 42
    assert fresh and all(r[FLAT_PATIENCE_KEY] == 2 * 42 for r in fresh)
    assert all(FLAT_PATIENCE_KEY not in r for r in runs if r[ROLE_KEY] == "probe:slow")
    assert trial_settings(sweep, {"lr": 0.1}, 80).flat_patience == 80
    assert trial_settings(sweep, {"lr": 0.1}, 10).flat_patience == 30  # never shorter
    quick = TrialRecord("quick", {"lr": 0.1}, 0, history=[
        {"step": t, "loss": 0.3} for t in range(1, 61)], status="ok", finished=True)
    assert all(FLAT_PATIENCE_KEY not in r for r in ladder(sweep, book_of(sweep, quick), quick))


def test_a_re_runs_flat_patience_is_kept_in_the_journal(tmp_path: Path) -> None:
    from sweeps.protocol import FLAT_PATIENCE_KEY

    sweep = load_linreg(tmp_path)
    book = TrialBook(sweep)
    book.record("r1", {"config": {"lr": 0.1, ROLE_KEY: "confirm:c", SEED_KEY: 1,
                                  FLAT_PATIENCE_KEY: 80}, "step": 1, "loss": 1.0})
    assert book.trials["r1"].flat_patience == 80
    book.journal.close_all()
    reread = TrialBook(sweep)
    reread.load()
    assert reread.trials["r1"].flat_patience == 80


def test_try_set_of_a_knobs_own_path_sets_the_knob(tmp_path) -> None:
    from sweeps.trial.tryout import try_values

    sweep = load_linreg(tmp_path)  # write_back lr: train.lr
    assert try_values(sweep, {"train.lr": 0.3})["lr"] == 0.3  # not overwritten by 0.1
    assert try_values(sweep, {"lr": 0.2})["lr"] == 0.2
    assert try_values(sweep, {"train.steps": 5})["lr"] == 0.1


def test_a_knob_fixed_unlike_the_base_config_is_said(tmp_path) -> None:
    sweep = load_linreg(tmp_path, search_space={"lr": 0.05})  # train.lr is 0.1
    assert sweep.fixed_changes == {"lr": 0.05}
    assert any("fixes lr=0.05, unlike your base config" in note for note in sweep.notes)
    assert load_linreg(tmp_path / "same", search_space={"lr": 0.1}).fixed_changes == {}


def test_a_rerun_that_never_ran_is_no_verdict_on_the_config(tmp_path: Path) -> None:
    """A fresh seed whose worker crashed before the trainer's first step (an import that
    failed on the node) says nothing of the config: incomplete, not fragile."""
    sweep = _sweep(tmp_path)
    cand = rec("c", val_loss=0.10)
    lost = _rerun("c", 2, None, status="crash", reason="crash", stop_step=0,
                  evidence={"error": "AttributeError: module 'sweeps' has no attribute "
                                     "'Monitor'"})
    conf = _judged(sweep, cand, _rerun("c", 1, 0.1), lost)
    assert conf.verdict == "incomplete" and conf.seeds == [1]
    assert "never ran: seed 2: AttributeError: module 'sweeps'" in conf.fragile_reason
    late = _rerun("c", 2, None, status="crash", reason="crash", stop_step=4)
    assert _judged(sweep, cand, _rerun("c", 1, 0.1), late).verdict == "fragile", \
        "a crash after the trainer ran is the config's"


def test_lr_sensitivity_is_positive_when_the_probe_is_worse_in_either_mode(tmp_path) -> None:
    """A PSNR (max) 6 % higher at LR x 2 is better there: -0.06, as a loss 6 % lower is."""
    maximise = load_linreg(tmp_path / "max", confirm={"seeds": 2, "lr_probe": 2.0},
                           objectives=[{"metric": "psnr", "mode": "max", "baseline": 9.86}])
    cand = rec("c", psnr=16.0)
    better = judge(maximise, book_of(maximise, cand, rec("probe-c", role="probe:c",
                                                         psnr=16.96)), cand, True)
    assert better.lr_sensitivity == pytest.approx(-0.06)
    minimise = _sweep(tmp_path / "min")
    cand = rec("c", val_loss=0.10)
    worse = judge(minimise, book_of(minimise, cand, rec("probe-c", role="probe:c",
                                                        val_loss=0.13)), cand, True)
    assert worse.lr_sensitivity == pytest.approx(0.3)


def test_a_config_with_extra_seeds_is_ranked_on_the_seeds_the_others_ran(
        tmp_path: Path) -> None:
    """A narrow margin earns a config more fresh seeds; its mean over them must not beat a
    config that is better on the seeds both ran (the extra seeds' luck moved it)."""
    sweep = _sweep(tmp_path, seeds=2, narrow_seeds=4)
    narrow = rec("n", val_loss=0.10)
    wide = rec("w", val_loss=0.11)
    book = book_of(sweep, narrow, wide,
                   _rerun("n", 1, 0.138), _rerun("n", 2, 0.138), _rerun("n", 3, 0.10),
                   _rerun("n", 4, 0.10),
                   _rerun("n", 0, 0.5, status="unstable", kind="probe", stop_step=34),
                   _rerun("w", 1, 0.130), _rerun("w", 2, 0.130),
                   _rerun("w", 0, 0.13, kind="probe"))
    judged = [judge(sweep, book, r, True) for r in (narrow, wide)]
    assert [c.verdict for c in judged] == ["confirmed", "confirmed"]
    assert judged[0].mean < judged[1].mean  # 0.119 over four seeds against 0.130 over two
    ranked = sorted(pair_on_shared_seeds(judged), key=lambda c: c.rank_key())
    assert [c.trial_id for c in ranked] == ["w", "n"]
    assert ranked[1].shared_seeds == [1, 2] and ranked[1].shared_mean == pytest.approx(0.138)
    same = [judge(sweep, book, wide, True), judge(sweep, book, wide, True)]
    assert all(c.shared_mean is None for c in pair_on_shared_seeds(same))


def test_a_base_config_off_the_range_starts_the_search_at_the_nearest_point(
        tmp_path: Path) -> None:
    """A base lr of 50 against a range to 30 cannot be a search trial; the search starts at
    lr 30 (the sampler learns from the user's neighbourhood), the base config itself runs
    on the fresh seeds, and the sweep says so when it is loaded."""
    from sweeps.results.confirm import base_point, nearest_base_point, plan_base

    sweep = load_linreg(tmp_path / "off", train={"lr": 50.0})
    assert base_point(sweep) is None
    assert nearest_base_point(sweep) == ({"lr": 30.0}, {"lr": 50.0})
    assert [r[SEED_KEY] for r in plan_base(sweep, book_of(sweep))] == [1]
    note = next(n for n in sweep.notes if "off the search space" in n)
    assert "lr=50.0" in note and "nearest it (lr=30)" in note
    inside = load_linreg(tmp_path / "in")
    assert nearest_base_point(inside) is None
    assert not any("off the search space" in n for n in inside.notes)
    choice = load_linreg(tmp_path / "cat", search_space={
        "lr": {"type": "categorical", "choices": [0.01, 0.1]}}, train={"lr": 0.5})
    assert nearest_base_point(choice) is None
    assert any("starts without it (lr: not among its choices)" in n for n in choice.notes)
    for entry in ({"type": "categorical", "choices": [0.01, 0.1]},
                  {"type": "loguniform", "low": 0.01, "high": 1.0}):
        # quoted, the base config's own run would hand the trainer text: refused
        with pytest.raises(SpecError) as info:
            load_linreg(tmp_path / "quoted", search_space={"lr": entry}, train={"lr": "0.1"})
        assert info.value.key == "base_config.train.lr" and info.value.exit_code == 2
        assert str(info.value).endswith("(YAML reads 5e-4 as text): 0.1")
    # 5e-4 unquoted is text to YAML 1.1: "write it unquoted" gave the same text back
    with pytest.raises(SpecError) as info:
        load_linreg(tmp_path / "bare", train={"lr": "5e-4"})
    assert str(info.value).endswith(": 0.0005")


def test_no_candidate_held_because_nothing_learnt_points_at_the_trainer(tmp_path: Path) -> None:
    """Labels off by one: every search trial and every candidate's fresh seed sat at the
    random guess. "Lower the LR range" was the advice; the model learnt at no LR tried."""
    sweep = _sweep(tmp_path)
    search = [rec(f"s{i}", status="unstable", val_loss=1.0) for i in range(3)]
    for r in search:
        r.reason = "flat_at_baseline"
    cand = rec("c", status="pruned", val_loss=1.0)
    flat = _rerun("c", 1, None, status="unstable", reason="flat_at_baseline", stop_step=120)
    book = book_of(sweep, *search, cand, flat)
    judged = [judge(sweep, book, cand, True)]
    assert judged[0].verdict == "fragile"
    text = why_none_held(book, judged)
    assert "no search trial learnt either (3 of 4 at the random guess" in text
    assert "points at the trainer or its data" in text and "LR range" not in text
    learnt = rec("s9", val_loss=0.2)
    assert why_none_held(book_of(sweep, *search, learnt, cand, flat), judged) == \
        "; widen the search space"
    blown = _rerun("c", 1, None, status="unstable", reason="divergence", stop_step=7)
    judged = [judge(sweep, book_of(sweep, cand, blown), cand, True)]
    assert why_none_held(book_of(sweep, cand, blown), judged) == \
        " (divergence); lower the LR range, or add grad_clip"


def test_every_objective_is_told_over_the_same_seeds_and_a_failure_at_its_guess(
        tmp_path: Path) -> None:
    """val_loss, val_r2 (baseline 0) and instability: a raced config was told its seed
    mean on val_loss and its search seed's val_r2; an unstable trial was told the worst
    R² seen (0.97, a good one) beside a val_loss at the random guess."""
    sweep = load_linreg(tmp_path, objectives=[
        {"metric": "val_loss"}, {"metric": "val_r2", "mode": "max", "baseline": 0.0},
        {"metric": "instability"}])
    cand = rec("c", val_loss=0.014, val_r2=0.985)
    seed1 = _rerun("c", 1, 0.012)
    seed1.history[-1]["val_r2"] = 0.989
    probe = _rerun("c", 0, 0.03, kind="probe")
    probe.history[-1]["val_r2"] = 0.5  # another config (LR x 2): not in the mean
    blown = rec("u", status="unstable", val_loss=0.02, val_r2=0.972)
    book = book_of(sweep, cand, seed1, probe, blown)
    means = book.seed_means(cand, sweep.objectives)
    assert means[0] == pytest.approx(0.013) and means[1] == pytest.approx(0.987)
    told = book.penalised_values(blown, sweep.objectives)
    assert told[0] == 1.0 and told[1] == 0.0 and told[2] >= 10.0
