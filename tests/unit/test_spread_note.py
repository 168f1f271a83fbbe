"""What a run that handed nothing over says when every seed ran stable but the seeds of
every candidate disagree: the trainer's seed spread, and how to accept it."""

from __future__ import annotations

from pathlib import Path

from sweeps.protocol import confirm_role
from sweeps.results import confirm
from tests.unit.conftest import book_of, load_linreg, rec


def test_candidates_fragile_only_for_their_seed_spread_say_how_to_accept_it(
        tmp_path: Path) -> None:
    sweep = load_linreg(tmp_path, confirm={"seeds": 1, "lr_probe": 0, "base": False})
    a = rec("a", val_loss=0.5, values={"lr": 0.01})
    b = rec("b", val_loss=0.6, values={"lr": 0.02})
    a1 = rec("a1", role=confirm_role("a"), seed=1, val_loss=0.2, values={"lr": 0.01})
    b1 = rec("b1", role=confirm_role("b"), seed=1, val_loss=0.2, values={"lr": 0.02})
    book = book_of(sweep, a, b, a1, b1)
    chosen = confirm.select(sweep, book, [a, b], [a, b], lambda runs, name: None)
    assert [c.verdict for c in chosen.candidates] == ["fragile", "fragile"]
    note = " ".join(chosen.notes)
    assert "though every seed ran stable" in note, note
    assert "--tolerance 0.40" in note and "it holds a " in note, note


def test_a_tolerance_given_to_resume_must_be_a_share_above_0(tmp_path: Path) -> None:
    import pytest

    from sweeps.commands.run import with_tolerance
    from sweeps.errors import SpecError

    sweep = load_linreg(tmp_path)
    assert with_tolerance(sweep, 0.4).spec.confirm.tolerance == 0.4
    for bad in (0.0, -0.1, float("nan"), float("inf")):
        with pytest.raises(SpecError) as err:
            with_tolerance(sweep, bad)
        assert err.value.key == "--tolerance" and "--tolerance 0.3" in err.value.fix


def test_the_base_config_is_settled_even_once_confirm_keep_held(tmp_path: Path) -> None:
    """keep 1, and one config held before the base config's second fresh seed ran: the base
    config was left ``incomplete`` ("3 ranked ahead of it were settled first"), and a
    resume with more steps, told it would settle it, ran nothing, run after run."""
    from sweeps.protocol import ROLE_KEY, SEED_KEY

    sweep = load_linreg(tmp_path, confirm={"seeds": 2, "lr_probe": 0, "keep": 1})
    base = rec("base", val_loss=0.5, values={"lr": 0.1})  # the base config's own lr
    a = rec("a", val_loss=0.3, values={"lr": 0.01})
    done = [rec(f"a{s}", role=confirm_role("a"), seed=s, val_loss=0.3, values={"lr": 0.01})
            for s in (1, 2)]
    half = rec("base1", role=confirm_role("base"), seed=1, val_loss=0.5, values={"lr": 0.1})
    book = book_of(sweep, base, a, *done, half)
    ran: list[tuple[str, int]] = []

    def run(runs: list[dict], name: str) -> None:
        for r in runs:
            ran.append((r[ROLE_KEY], r[SEED_KEY]))
            new = rec(f"run{len(ran)}", role=r[ROLE_KEY], seed=r[SEED_KEY], val_loss=0.5,
                      values={"lr": r["lr"]})
            book.trials[new.trial_id] = new

    chosen = confirm.select(sweep, book, [a, base], [a], run)
    assert ran == [(confirm_role("base"), 2)]
    verdicts = {c.trial_id: c.verdict for c in chosen.candidates}
    assert verdicts["a"] == "confirmed" and verdicts["base"] != "incomplete"
