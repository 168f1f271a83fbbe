"""One trial, in its own process: the trainer run, its reports judged by the rules. No Ray."""

from __future__ import annotations

from sweeps._lazy import exports

#: Public name -> the module that defines it (loaded on first use).
_LAZY = {
    "run_trainer": "sweeps.trial.run",
    "Monitor": "sweeps.trial.monitor",
    "TrialReporter": "sweeps.trial.reporter",
    "TrialStopped": "sweeps.trial.reporter",
    "Report": "sweeps.trial.contract",
    "TrialInfo": "sweeps.trial.contract",
    "compile_model": "sweeps.trial.compile",
    "try_trial": "sweeps.trial.tryout",
    "inert_knob": "sweeps.trial.knob_check",
}
__all__, __getattr__, __dir__ = exports(__name__, _LAZY, globals())
