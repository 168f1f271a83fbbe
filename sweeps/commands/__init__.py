"""The command line: one module per command that does more than call another."""

from __future__ import annotations

from sweeps._lazy import exports

#: Public name -> the module that defines it (loaded on first use).
_LAZY = {
    "main": "sweeps.commands.cli",
    "run_sweep": "sweeps.commands.run",
    "resume_sweep": "sweeps.commands.run",
    "SweepOutcome": "sweeps.commands.run",
}
__all__, __getattr__, __dir__ = exports(__name__, _LAZY, globals())
