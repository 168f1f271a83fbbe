"""``search_space.lr.high: probe``: lr's upper end set by the boundary probe.

Only the ``lr`` knob of a ``loguniform`` or ``uniform`` range with ``low > 0`` takes it.
Until ``sweeps run`` has probed, the knob's ``high`` stands at the ceiling ``low × SPAN``
(so every reader of the space sees a number: ``sweeps try``, preflight, the stability
grid, warm start); the loader marks the sweep as waiting for the probe
(``Sweep.lr_high_to_probe``). Once probed, the knob holds the probed number and its
:class:`ProbedHigh` record, which the saved sweep keeps: a resumed, moved or re-run copy
uses exactly that range and never probes again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sweeps.errors import SpecError

#: The word that asks for the probe.
PROBE = "probe"
#: The probe's range is ``[low, low × SPAN]``: six decades above the lowest LR searched.
SPAN = 1e6
#: Seeds the probe's answer must hold on (the base seed and the next ones).
SEEDS = 3
#: Knob types whose ``high`` may be ``probe``.
TYPES = ("loguniform", "uniform")
_FIX = "write 'lr: {type: loguniform, low: 1.0e-4, high: probe}'"


class ProbedHigh(BaseModel):
    """Where a probed ``high`` came from (written by sweeps into the saved sweep)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    boundary_low: float = Field(gt=0, description="the largest lr that held on every "
                                "probe seed: the range's high")
    boundary_high: float | None = Field(default=None, description="the smallest lr that "
                                        "failed; null when none failed up to the ceiling")
    ceiling: float = Field(gt=0, description="the top of the probe's range, low × 1e6")
    seeds: int = Field(ge=1, description="probe seeds the answer held on")
    steps: int = Field(ge=0, description="training steps the probe spent")
    report: str = Field(default="", description="the probe's report, relative to the "
                        "results folder")

    def line(self, low: float) -> str:
        """One line for the summary and the report."""
        failed = f"{self.boundary_high:.4g} failed" if self.boundary_high is not None else \
            f"nothing failed up to the ceiling {self.ceiling:.4g}"
        where = f"; {self.report}" if self.report else ""
        return (f"lr range {low:.4g} .. {self.boundary_low:.4g} from the boundary probe "
                f"(held on {self.seeds} seed(s) at {self.boundary_low:.4g}, {failed}; "
                f"{self.steps} probe steps{where})")


def ceiling(low: float) -> float:
    """The top of the probe's range for a knob starting at ``low``."""
    return low * SPAN


def take(name: str, entry: Mapping[str, Any], key: str) -> tuple[dict[str, Any], bool]:
    """``entry`` with ``high: probe`` replaced by the ceiling, and whether it was there.

    ``probe`` anywhere else it cannot stand (another knob, another type, ``low``, a low
    that is not > 0) and a ``probed`` record off ``lr`` are one SpecError each."""
    entry = dict(entry)
    kind = entry.get("type")
    if entry.get("low") == PROBE:
        raise SpecError(f"{key}.low", "'probe' sets only the upper end (high) of lr",
                        "give low a number, e.g. 'lr: {type: loguniform, low: 1.0e-4, "
                        "high: probe}'")
    if "probed" in entry and name != "lr":
        raise SpecError(f"{key}.probed", "only lr's high comes from the boundary probe",
                        "remove 'probed' (sweeps writes it into its saved sweep)")
    if entry.get("high") != PROBE:
        return entry, False
    if name != "lr":
        raise SpecError(f"{key}.high", "'probe' sets only lr's upper end (the boundary "
                        "probe searches the largest stable learning rate)",
                        f"give {name}'s high a number")
    if kind not in TYPES:
        raise SpecError(f"{key}.high", f"'probe' needs a loguniform or uniform lr, not "
                        f"{kind!r}", _FIX)
    low = entry.get("low")
    if not isinstance(low, (int, float)) or isinstance(low, bool) or not low > 0:
        raise SpecError(f"{key}.low", f"with high: probe, low must be a number > 0 (the "
                        f"probe searches low .. low × {SPAN:.0e}), not {low!r}".replace("e+0", "e"),
                        "give the smallest lr worth searching, e.g. low: 1.0e-4")
    if "probed" in entry:
        raise SpecError(f"{key}.probed", "is the record of an earlier probe, but high asks "
                        "for a new one", "drop 'probed' to probe again, or give high the "
                        "probed number")
    return {**entry, "high": ceiling(float(low))}, True


def note(low: float) -> str:
    """The loader's note for a sweep that waits for the probe."""
    return (f"search_space.lr.high: probe: `sweeps run` sets it before the search to the "
            f"largest lr that holds on {SEEDS} seeds, probed in {low:.4g} .. "
            f"{ceiling(low):.4g} (docs/stability.md#lr-range-from-the-probe)")
