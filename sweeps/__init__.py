"""sweeps: hyperparameter search and stability sweeps for PyTorch training.

The names below are loaded on first use (PEP 562), so ``import sweeps`` and the pure
modules (``sweeps.rules``, ``sweeps.spec.loader``, ``sweeps.results.files``) do not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweeps._lazy import exports

if TYPE_CHECKING:
    from sweeps.rules.verdict import REASONS, Verdict
    from sweeps.trial.compile import COMPILE_MODES, compile_mode, compile_model
    from sweeps.trial.contract import Report, TrialInfo
    from sweeps.trial.monitor import Monitor
    from sweeps.trial.reporter import TrialStopped

#: Public name -> the module that defines it.
_LAZY: dict[str, str] = {
    "COMPILE_MODES": "sweeps.trial.compile",
    "compile_mode": "sweeps.trial.compile",
    "compile_model": "sweeps.trial.compile",
    "Monitor": "sweeps.trial.monitor",
    "REASONS": "sweeps.rules.verdict",
    "Verdict": "sweeps.rules.verdict",
    "Report": "sweeps.trial.contract",
    "TrialInfo": "sweeps.trial.contract",
    "TrialStopped": "sweeps.trial.reporter",
}

#: Spelt out (not computed) so that type checkers and linters see the public names.
__all__ = ["COMPILE_MODES", "Monitor", "REASONS", "Report", "TrialInfo", "TrialStopped",
           "Verdict", "compile_mode", "compile_model"]
__getattr__, __dir__ = exports(__name__, _LAZY, globals())[1:]
__version__ = "0.1.0"
