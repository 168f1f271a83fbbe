"""``search_space.lr.high: probe`` in ``sweeps run``: the boundary probe sets lr's upper end.

It runs in the driver, after the preflight and before Ray starts, through
:func:`sweeps.commands.stability.run_probe` (one trial at a time, ``budget.max_steps`` per
run, :data:`~sweeps.spec.probed.SEEDS` seeds at the answer) within ``[low, low × 1e6]``,
and writes its report to ``<results>/lr_probe/boundary.md``. The range's high becomes the
largest lr that held on every seed (the ceiling when nothing failed); nothing holding is
a SpecError naming ``search_space.lr.high``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sweeps.commands.stability import BOUNDARY_FILE, run_probe
from sweeps.errors import ProbeCrashed, SpecError
from sweeps.spec import probed
from sweeps.spec.loader import Sweep
from sweeps.state.layout import PROBE_DIR
from sweeps.terminal import echo_stderr


def probe_lr_high(sweep: Sweep, *, quiet: bool = False,
                  echo: Callable[[str], None] = echo_stderr) -> Sweep:
    """``sweep`` with lr's high set by the boundary probe (unchanged when it asks for none).
    ``quiet``: no line per probe run, only the answer."""
    if not sweep.lr_high_to_probe:
        return sweep
    knob = sweep.space["lr"]
    low, top = float(knob.low), float(knob.high)  # high stands at the ceiling until now
    report = f"{PROBE_DIR}/{BOUNDARY_FILE}"
    echo(f"boundary probe: searching the stability boundary in {low:.4g} .. {top:.4g} "
         f"({probed.SEEDS} seeds, {sweep.spec.budget.max_steps} steps per run) for "
         "search_space.lr.high")
    at = replace(sweep, output_dir=sweep.output_dir / PROBE_DIR)
    try:
        result = run_probe(at, "lr", (low, top), seeds=probed.SEEDS,
                           echo=None if quiet else echo)
    except RuntimeError as exc:  # the trainer raised: an error to fix, not instability
        raise ProbeCrashed(f"the boundary probe for search_space.lr.high stopped: {exc}; "
                           f"see {sweep.output_dir / PROBE_DIR}") from exc
    if result.low is None:
        raise SpecError("search_space.lr.high", f"the boundary probe found no lr in "
                        f"{low:.4g} .. {top:.4g} that holds: even {result.high or low:.4g} failed "
                        f"(see {sweep.output_dir / report})",
                        "lower search_space.lr.low below the cliff (the probe starts there), "
                        "or find why the smallest lr fails: sweeps try FILE --set "
                        f"lr={low:.4g}")
    record = probed.ProbedHigh(boundary_low=result.low, boundary_high=result.high,
                               ceiling=top, seeds=result.seeds, steps=result.steps,
                               report=report)
    sweep, notes = sweep.with_probed_lr(record)
    echo(record.line(low))
    if result.high is None:
        echo(f"note: nothing failed up to lr {top:.4g}: the search range ends at the probe's "
             "ceiling; give search_space.lr.high a number to search less")
    for line in notes:
        echo(f"note: {line}")
    return sweep
