"""Shared inputs of the unit tests: the linreg test sweep loaded for real, and trial records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sweeps.record.book import TrialBook, TrialRecord
from sweeps.spec.loader import Sweep, load_sweep
from tests.conftest import copy_sweepfiles, edit_linreg


def load_linreg(folder: Path, **edits: Any) -> Sweep:
    """The linreg test sweep from a fresh copy in ``folder`` (``edits`` as in
    :func:`tests.conftest.edit_linreg`), results under ``folder/results``."""
    folder.mkdir(parents=True, exist_ok=True)
    copy_sweepfiles(folder)
    if edits:
        edit_linreg(folder, **edits)
    return load_sweep(folder / "linreg.yaml", workdir=folder, import_trainer=False,
                      output=str(folder / "results"))


@pytest.fixture
def linreg_sweep(tmp_path: Path) -> Sweep:
    return load_linreg(tmp_path)


def rec(trial_id: str, status: str = "ok", role: str = "search", seed: int = 0,
        values: dict[str, Any] | None = None, **final: float) -> TrialRecord:
    """A finished trial whose history ends with ``final`` (metric: value) at step 10."""
    history = [{"step": 10, **final}] if final else []
    return TrialRecord(trial_id, dict(values or {"lr": 0.1}), seed, role=role,
                       history=history, status=status, finished=status != "running")


def book_of(sweep: Sweep, *records: TrialRecord) -> TrialBook:
    """A book holding ``records`` (nothing read from or written to disk)."""
    book = TrialBook(sweep)
    book.trials = {r.trial_id: r for r in records}
    return book
