"""After the search: selection and confirmation, the front and stable/, the report,
tracking, the audit and warm start."""

from __future__ import annotations

from sweeps._lazy import exports

#: Public name -> the module that defines it (loaded on first use).
_LAZY = {
    "Race": "sweeps.results.race",
    "select": "sweeps.results.confirm",
    "Selection": "sweeps.results.confirm",
    "Confirmation": "sweeps.results.confirm",
    "pareto_front": "sweeps.results.front",
    "candidates": "sweeps.results.front",
    "write_front": "sweeps.results.files",
    "trials_frame": "sweeps.results.files",
    "write_report": "sweeps.results.report",
    "summary_of": "sweeps.results.summary",
    "load": "sweeps.results.folder_data",
    "run_audit": "sweeps.results.audit",
    "log_sweep": "sweeps.results.tracking",
}
__all__, __getattr__, __dir__ = exports(__name__, _LAZY, globals())
