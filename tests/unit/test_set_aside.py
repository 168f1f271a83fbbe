"""A trial running when the driver died keeps what it reported once Ray Tune restarts it."""

from __future__ import annotations

from pathlib import Path

from sweeps.record.book import TrialBook
from tests.unit.conftest import load_linreg


def _report(book: TrialBook, step: int) -> None:
    book.record("t1", {"config": {"lr": 0.1}, "step": step, "loss": 1.0 / step})


def _steps(book: TrialBook) -> list[int]:
    return [h["step"] for h in book.trials["t1"].history]


def test_a_restarted_trial_resuming_from_a_checkpoint_keeps_its_earlier_reports(
        tmp_path: Path) -> None:
    sweep = load_linreg(tmp_path)
    book = TrialBook(sweep)
    for step in range(1, 7):  # the driver dies after step 6; the checkpoint was at 4
        _report(book, step)
    assert book.set_aside_unfinished() == ["t1"]
    book.journal.close_all()
    book = TrialBook(sweep)  # `sweeps resume`: a new driver reads the journal back
    book.load()
    book.set_aside_unfinished()
    for step in (5, 6, 7):
        _report(book, step)
    assert _steps(book) == [1, 2, 3, 4, 5, 6, 7], "each step once, none lost"
    reread = TrialBook(sweep)
    reread.load()
    assert [h["step"] for h in reread.trials["t1"].history] == [1, 2, 3, 4, 5, 6, 7]
    assert (sweep.output_dir / "trials" / "t1.jsonl.interrupted").is_file()


def test_a_restarted_trial_that_starts_over_replaces_its_earlier_reports(
        tmp_path: Path) -> None:
    sweep = load_linreg(tmp_path)
    book = TrialBook(sweep)
    for step in range(1, 7):
        _report(book, step)
    book.set_aside_unfinished()
    for step in (1, 2):  # no checkpoint: the trainer runs from step 1 again
        _report(book, step)
    assert _steps(book) == [1, 2]
