"""The race inside the search, read from a hand-filled book: who races, what runs next,
what the search leaves for settling the leader, and what the sampler is told."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeps.protocol import LR_SCALE_KEY, ROLE_KEY, SEED_KEY
from sweeps.record.book import TrialRecord
from sweeps.results.confirm import base_point, base_trial
from sweeps.results.race import Race, owner_of
from sweeps.spec.loader import Sweep
from tests.unit.conftest import book_of, load_linreg, rec


def _sweep(tmp_path: Path, **confirm: object) -> Sweep:
    """linreg (base lr 0.1, max_steps 60) with two fresh seeds and the LR probe."""
    return load_linreg(tmp_path, confirm={"seeds": 2, "lr_probe": 2.0, "keep": 2, **confirm})


def _rerun(of: str, seed: int, val_loss: float | None, status: str = "ok",
           kind: str = "confirm", finished: bool = True) -> TrialRecord:
    r = rec(f"{kind}-{of}-{seed}", status=status, role=f"{kind}:{of}", seed=seed,
            **({} if val_loss is None else {"val_loss": val_loss}))
    r.finished = finished
    return r


def test_the_base_config_races_first_then_the_best_keep_by_their_mean(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path)
    assert base_point(sweep) == {"lr": 0.1}
    base = rec("base", values={"lr": 0.1}, val_loss=0.5)
    good, better, worse = (rec(t, values={"lr": lr}, val_loss=v) for t, lr, v in
                           (("good", 0.05, 0.2), ("better", 0.03, 0.1), ("worse", 0.01, 0.4)))
    pruned = rec("cut", status="pruned", values={"lr": 0.02}, val_loss=0.05)
    book = book_of(sweep, base, good, better, worse, pruned)
    assert base_trial(sweep, book) is base
    race = Race(sweep, book)
    assert [r.trial_id for r in race.contenders()] == ["base", "better", "good"]
    assert race.wants(base) and race.wants(better), "the base config and the leader"
    assert not race.wants(good) and not race.wants(worse) and not race.wants(pruned)


def test_where_seeds_agree_only_the_leader_is_screened_and_all_once_they_disagree(
        tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, base=False, keep=3)
    best, second, third = (rec(t, values={"lr": lr}, val_loss=v) for t, lr, v in
                           (("best", 0.03, 0.1), ("second", 0.05, 0.2), ("third", 0.01, 0.3)))
    book = book_of(sweep, best, second, third)
    race = Race(sweep, book)
    assert [r.trial_id for r in race.screening()] == ["best"]
    screen = race.next_run(busy=set(), searching=True)
    assert (screen[ROLE_KEY], screen[SEED_KEY]) == ("confirm:best", 1)
    assert race.next_run(busy={"best"}, searching=True) is None, "no challenger to screen"
    book.trials["r1"] = _rerun("best", 1, 0.9)  # the leader fails its screen: fragile
    assert race.disagreed()
    assert [r.trial_id for r in race.screening()] == ["second", "third"]
    assert race.wants(third)


def test_a_challenger_behind_the_base_config_is_not_screened_while_searching(
        tmp_path: Path) -> None:
    """The base config is the incumbent: a search trial whose estimate trails it earns no
    fresh seed during the search (it would not be handed over); one ahead of it does."""
    sweep = _sweep(tmp_path, keep=3)
    base = rec("base", values={"lr": 0.1}, val_loss=0.2)
    behind = rec("behind", values={"lr": 0.05}, val_loss=0.3)
    book = book_of(sweep, base, behind, _rerun("base", 1, 0.2))
    race = Race(sweep, book)
    assert [r.trial_id for r in race.screening()] == ["base"]
    assert race.next_run(busy=set(), searching=True) is None, "the base config is screened"
    assert not race.wants(behind)
    book.trials["ahead"] = rec("ahead", values={"lr": 0.03}, val_loss=0.1)
    assert [r.trial_id for r in race.screening()] == ["ahead", "base"]
    assert race.next_run(busy=set(), searching=True)[ROLE_KEY] == "confirm:ahead"


def test_a_fragile_seed_drops_a_config_and_the_next_one_moves_up(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, base=False)
    good, better, worse = (rec(t, values={"lr": lr}, val_loss=v) for t, lr, v in
                           (("good", 0.05, 0.2), ("better", 0.03, 0.1), ("worse", 0.01, 0.4)))
    lost = _rerun("better", 1, 0.9)  # far past the tolerance: fragile
    race = Race(sweep, book_of(sweep, good, better, worse, lost))
    assert [r.trial_id for r in race.contenders()] == ["good", "worse"]


def test_runs_go_one_at_a_time_down_the_ladder(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, base=False)
    best = rec("best", values={"lr": 0.03}, val_loss=0.1)
    book = book_of(sweep, best)
    race = Race(sweep, book)
    first = race.next_run(busy=set())
    assert first == {"lr": 0.03, SEED_KEY: 1, ROLE_KEY: "confirm:best", LR_SCALE_KEY: None}
    assert race.next_run(busy={"best"}) is None, "one run in flight per config"
    book.trials["r1"] = _rerun("best", 1, 0.15)  # 6 % of the improvement: not agreeing
    assert race.next_run(busy=set())[ROLE_KEY] == "probe:best"
    book.trials["p"] = _rerun("best", 0, 0.11, kind="probe")
    assert race.next_run(busy=set())[SEED_KEY] == 2
    book.trials["r2"] = _rerun("best", 2, 0.12)
    assert race.next_run(busy=set()) is None, "settled"
    assert race.judge(best).verdict == "confirmed"


def test_while_searching_the_race_runs_screens_only(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, base=False)
    best = rec("best", values={"lr": 0.03}, val_loss=0.1)
    second = rec("second", values={"lr": 0.05}, val_loss=0.2)
    book = book_of(sweep, best, second, _rerun("best", 1, 0.1), _rerun("second", 1, 0.2))
    race = Race(sweep, book)
    assert race.leader() is best
    assert race.next_run(busy=set(), searching=True) is None, "the ladder waits"
    assert race.next_run(busy=set(), searching=False)[ROLE_KEY] == "probe:best"
    assert race.next_run(busy={"best"}, searching=False) is None, "the leader's steps"
    book.trials["p"] = _rerun("best", 0, 0.1, kind="probe")
    book.trials["r2"] = _rerun("best", 2, 0.1)
    assert race.next_run(busy=set(), searching=False)[ROLE_KEY] == "probe:second"
    book.trials["behind"] = rec("behind", values={"lr": 0.04}, val_loss=0.15)
    assert race.next_run(busy={"best"}, searching=True) is None, "not a challenger"
    book.trials["third"] = rec("third", values={"lr": 0.02}, val_loss=0.05)
    screen = race.next_run(busy={"best"}, searching=True)
    assert (screen[ROLE_KEY], screen[SEED_KEY]) == ("confirm:third", 1), "the challenger's"


def test_the_search_leaves_the_steps_that_settle_the_leader(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, base=False)
    best = rec("best", values={"lr": 0.03}, val_loss=0.1)
    book = book_of(sweep, best, rec("next", values={"lr": 0.05}, val_loss=0.2))
    race = Race(sweep, book)
    assert race.reserve() == 3 * 60  # two seeds and the probe, 60 steps each
    book.trials["r1"] = _rerun("best", 1, 0.1)
    assert race.reserve() == 2 * 60
    book.trials["p"] = _rerun("best", 0, 0.1, kind="probe")
    book.trials["r2"] = _rerun("best", 2, 0.1)
    assert race.reserve() == 0, "the leader is settled"


def test_the_sampler_hears_the_mean_over_seeds_once_a_rerun_is_back(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, base=False)
    best = rec("best", values={"lr": 0.03}, val_loss=0.1)
    book = book_of(sweep, best)
    race = Race(sweep, book)
    assert race.tell_value(best) is None, "nothing to tell before a re-run"
    book.trials["r1"] = _rerun("best", 1, 0.2)
    assert race.tell_value(best) == pytest.approx(0.15)


def test_nothing_races_without_seeds_or_a_probe(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, seeds=0, lr_probe=0)
    race = Race(sweep, book_of(sweep, rec("a", values={"lr": 0.1}, val_loss=0.1)))
    assert not race.active and race.contenders() == [] and race.reserve() == 0


def test_owner_of_a_role() -> None:
    assert owner_of("probe:abc") == "abc" and owner_of("base") is None



def test_a_trial_that_learnt_nothing_gets_no_fresh_seed(tmp_path: Path) -> None:
    """Its gain over the random guess (linreg's 1.0) under a tenth of the best's: the race
    leaves it out, as the candidates after the search do."""
    sweep = _sweep(tmp_path, base=False, keep=3)
    best, at_guess = (rec(t, values={"lr": lr}, val_loss=v) for t, lr, v in
                      (("best", 0.03, 0.1), ("flat", 0.5, 0.99)))
    race = Race(sweep, book_of(sweep, best, at_guess))
    assert [r.trial_id for r in race.contenders()] == ["best"]
    assert not race.wants(at_guess)
