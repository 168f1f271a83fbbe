"""Checks run before any trial: compile modes, the LR schedule, the input scale.

``run_preflight`` returns the findings and the sweep to run (compile modes
that cannot work on this machine dropped from its space). Findings of level
``error`` stop ``sweeps run`` before Ray starts; ``warning`` findings are
printed and saved but the sweep goes on.
"""

from __future__ import annotations

from sweeps.preflight.findings import Finding, write_findings
from sweeps.preflight.runner import run_preflight

__all__ = ["Finding", "run_preflight", "write_findings"]
