"""The results folder's safety: atomic writes, one owner, damage and trust checks."""

from __future__ import annotations

from sweeps._lazy import exports

#: Public name -> the module that defines it (loaded on first use).
_LAZY = {
    "claim": "sweeps.state.folder_lock",
    "write_text": "sweeps.state.atomic",
    "write_bytes": "sweeps.state.atomic",
    "check_for_resume": "sweeps.state.check",
    "check_for_report": "sweeps.state.check",
    "DamagedState": "sweeps.state.check",
}
__all__, __getattr__, __dir__ = exports(__name__, _LAZY, globals())
