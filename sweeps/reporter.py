"""Kept for trainers written against the old path: ``from sweeps.reporter import
TrialStopped``. The reporter lives in :mod:`sweeps.trial.reporter`."""

from sweeps.trial.reporter import TrialReporter, TrialStopped

__all__ = ["TrialReporter", "TrialStopped"]
