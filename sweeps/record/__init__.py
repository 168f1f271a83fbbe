"""The driver's record of every trial: histories, outcomes, objective values. No Ray."""

from __future__ import annotations

from sweeps._lazy import exports

#: Public name -> the module that defines it (loaded on first use).
_LAZY = {
    "TrialBook": "sweeps.record.book",
    "TrialRecord": "sweeps.record.book",
    "open_book": "sweeps.record.book",
    "books_of": "sweeps.record.book",
    "Journal": "sweeps.record.journal",
}
__all__, __getattr__, __dir__ = exports(__name__, _LAZY, globals())
