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
