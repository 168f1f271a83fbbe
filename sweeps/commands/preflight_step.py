"""The preflight step of ``sweeps run``, ``sweeps preflight`` and ``sweeps stability
--probe``: run the checks, print and save them, refuse on an error."""

from __future__ import annotations

from collections.abc import Callable

from sweeps.errors import PreflightFailed
from sweeps.spec.loader import Sweep
from sweeps.state import folder_lock
from sweeps.terminal import echo_stderr


def preflight(sweep: Sweep, echo: Callable[[str], None] = echo_stderr) -> Sweep:
    """Run the preflight checks, print and save them; raise if one is an error."""
    from sweeps.preflight import run_preflight, write_findings

    with folder_lock.claim(sweep.output_dir, "preflight"):
        sweep, findings = run_preflight(sweep)
        sweep.output_dir.mkdir(parents=True, exist_ok=True)
        write_findings(sweep.output_dir, findings)
    for f in findings:
        echo(f"preflight {f.line()}")
    errors = [f for f in findings if f.level == "error"]
    if errors:
        raise PreflightFailed(f"preflight found {len(errors)} problem(s) that would spoil every "
                              f"trial (see {sweep.output_dir / 'preflight.md'}); fix them or "
                              "run with --no-preflight")
    return sweep
