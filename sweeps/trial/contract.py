"""The trainer contract's types: what ``train(config, report)`` receives.

A trainer is ``def train(config: dict, report: sweeps.Report) -> None``; its
``config["sweep"]`` is a :class:`TrialInfo`, and ``report`` raises
:class:`sweeps.TrialStopped` on the step a rule fires (as Optuna's objective gets a
``Trial`` and may raise ``TrialPruned``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypedDict


class Report(Protocol):
    """The ``report`` a trainer is called with: hand over this step's metrics (and,
    optionally, state to continue from if the worker dies). Raises
    :class:`~sweeps.trial.reporter.TrialStopped` when a rule judged the trial unstable."""

    def __call__(self, metrics: Mapping[str, Any], checkpoint: Any = None) -> None: ...


class TrialInfo(TypedDict):
    """``config["sweep"]``: which trial this is and how to run it."""

    trial_id: str
    #: Seed every RNG from it.
    seed: int
    #: Stop after this many optimizer steps.
    max_steps: int
    #: ``cuda:0`` or ``cpu``: where to put the model and data.
    device: str
    #: The GPUs Ray assigned to the trial (empty without one).
    gpu_ids: list[Any]
    #: The last checkpoint's file when a retried trial continues (``torch.load`` it), else None.
    checkpoint: str | None
