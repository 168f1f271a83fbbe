"""The boundary probe: an adaptive search for the largest knob value (e.g. LR) that holds.

Pure logic, no trainer: :func:`probe` takes ``run(value, seed) -> SeedRun`` and does an
exponential bracket from a start value (×/÷ ``FACTOR`` within ``[low, high]``), then
bisection in log space until ``high / low <= RATIO``. A point *holds* when every probe
seed held; seeds are added one at a time (up to ``seeds``) only while the point holds,
since a point that failed on one seed is failed. :func:`grid_steps` is what a log grid of
the same resolution over the bracketed range would cost. A predicted boundary (from
:mod:`sweeps.results.sharpness`) seeds the bracket with a first step of ``RATIO`` instead of
``FACTOR``; :func:`verify` checks the answer's two ends with full-length runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweeps.results.sharpness import Sharpness

#: Bracket step: ×FACTOR up until a point fails, ÷FACTOR down until one holds.
FACTOR = 4.0
#: Bisect until the interval's high / low is at most this.
RATIO = 1.25


@dataclass(frozen=True)
class SeedRun:
    """One run of one seed at one value: held, or why and where it failed; its steps."""

    held: bool
    steps: int
    reason: str | None = None
    stop_step: int | None = None
    #: The run's pre-clip grad norms (for the grad_clip advice), when it reported them.
    grad_norms: tuple[float, ...] = ()
    #: It held, but sat at the random guess (a slow verdict): it learnt nothing.
    slow: bool = False


@dataclass
class Point:
    """One probed value: the seeds run there and the outcome."""

    value: float
    seeds: list[int] = field(default_factory=list)
    runs: list[SeedRun] = field(default_factory=list)

    @property
    def held(self) -> bool:
        return bool(self.runs) and all(r.held for r in self.runs)

    @property
    def steps(self) -> int:
        return sum(r.steps for r in self.runs)

    def extend(self, run: Callable[[float, int], SeedRun], seeds: list[int]) -> bool:
        """Run the ``seeds`` not run here yet, in order, until one fails (a point that
        failed on one seed is failed); whether the point holds."""
        for seed in seeds[len(self.seeds):]:
            if self.runs and not self.held:
                break
            self.seeds.append(seed)
            self.runs.append(run(self.value, seed))
        return self.held

    def row(self) -> dict[str, Any]:
        """The JSON form: value, seeds, outcome, reason and stop step of the failing seed."""
        bad = next((r for r in self.runs if not r.held), None)
        return {"lr": self.value, "seeds": list(self.seeds),
                "outcome": "held" if self.held else "failed",
                "reason": bad.reason if bad else None,
                "stop_step": bad.stop_step if bad else None, "steps": self.steps}


@dataclass
class Boundary:
    """The probe's answer: the largest value that held and the smallest that failed
    (either None when the range has no such value), every point, and the cost."""

    low: float | None
    high: float | None
    points: list[Point]
    bracket: tuple[float, float]
    seeds: int
    steps_per_run: int
    #: The sharpness estimate that seeded the bracket (None: it started at the base value).
    prediction: Sharpness | None = None
    #: Why a trainer's sharpness hook gave no prediction (None when it did, or has none).
    prediction_note: str | None = None
    #: Full-length runs at the two ends (``--verify``), when asked.
    verified: Verify | None = None

    @property
    def steps(self) -> int:
        """Steps of the probe runs (the verify runs are counted apart)."""
        return sum(p.steps for p in self.points)

    def advice(self) -> dict[str, Any]:
        """What to use: ``lr`` a :data:`~sweeps.results.stability.SAFETY_MARGIN` below the
        largest value that held, once the probe found the edge above it (None when none
        held, or nothing failed: a margin below an edge nobody saw is a value nobody ran),
        and ``grad_clip`` from the pre-clip grad norms of the runs that held, as the grid
        advises it (``grad_clip_why``)."""
        from sweeps.results.stability import SAFETY_MARGIN, clip_from_norms

        edge_seen = self.low is not None and self.high is not None
        lr = self.low / SAFETY_MARGIN if edge_seen else None
        held = [p for p in self.points if any(r.held for r in p.runs)]
        if lr is not None and held:  # the grad norms at the LR advised, not at the edge
            near = min(held, key=lambda p: abs(math.log(p.value / lr)))
            held, runs = [near], f"probe runs that held at {near.value:.4g}"
        else:
            runs = "probe runs that held"
        norms = [v for p in held for r in p.runs if r.held for v in r.grad_norms]
        clip, why = clip_from_norms(norms, runs)
        return {"lr": lr, "margin": SAFETY_MARGIN, "grad_clip": clip, "grad_clip_why": why}

    @property
    def grid_steps(self) -> int:
        return grid_steps(*self.bracket, self.seeds, self.steps_per_run)

    def as_dict(self) -> dict[str, Any]:
        grid = self.grid_steps
        return {"boundary_low": self.low, "boundary_high": self.high,
                "width": self.high / self.low if self.low and self.high else None,
                "steps": self.steps, "grid_steps": grid,
                "grid_points": grid_points(*self.bracket),
                "ratio": self.steps / grid if grid else None,
                "bracket": list(self.bracket), "seeds": self.seeds,
                "steps_per_run": self.steps_per_run,
                "predicted": self.prediction.predicted if self.prediction else None,
                "sharpness": self.prediction.as_dict() if self.prediction else None,
                "sharpness_note": self.prediction_note,
                "verify": self.verified.as_dict() if self.verified else None,
                "advice": self.advice(),
                "probes": [p.row() for p in self.points]}


@dataclass
class Verify:
    """Full-length runs at the answer's ends: ``low`` on every probe seed (until one fails),
    ``high`` until a seed fails. They agree when low held on every seed and high failed on
    one; an end the probe did not find is None (not run)."""

    low: Point | None
    high: Point | None
    seeds: list[int]
    steps_per_run: int

    @property
    def agrees(self) -> bool:
        return (self.low is None or self.low.held) and (self.high is None or not self.high.held)

    @property
    def steps(self) -> int:
        return sum(p.steps for p in (self.low, self.high) if p is not None)

    def disagreement(self, name: str = "lr") -> str | None:
        """What the full runs say against the interval, with the fix; None when they agree."""
        out = []
        full = f"--steps {self.steps_per_run}"
        if self.low is not None and not self.low.held:
            r = self.low.row()
            out.append(f"{name} {self.low.value:.4g} (the held end) failed on seed "
                       f"{self.low.seeds[-1]} ({r['reason']} at step {r['stop_step']}) in a "
                       "full-length run: the boundary lies lower than the interval; probe "
                       f"again at the full length ({full})")
        if self.high is not None and self.high.held:
            out.append(f"{name} {self.high.value:.4g} (the failed end) held on every seed in "
                       "full-length runs: the probe's failure there did not repeat, so the "
                       f"boundary may lie higher; probe again at the full length ({full})")
        return "; ".join(out) or None

    def as_dict(self) -> dict[str, Any]:
        return {"agrees": self.agrees, "steps_per_run": self.steps_per_run,
                "seeds": list(self.seeds), "steps": self.steps,
                "low": self.low.row() if self.low else None,
                "high": self.high.row() if self.high else None,
                "disagrees": self.disagreement()}

    def lines(self, name: str = "lr") -> list[str]:
        """The verify line and its verdict line (``agrees: ...`` or ``disagrees: ...``)."""
        ends = [f"{name} {p.value:.4g} {_outcome(p)}" for p in (self.low, self.high)
                if p is not None]
        head = (f"verify: full {self.steps_per_run}-step runs on seed(s) "
                f"{', '.join(map(str, self.seeds))}: " + ("; ".join(ends) or "no end to run"))
        why = self.disagreement(name)
        return [head, f"disagrees: {why}" if why else
                "agrees: the held end held on every seed and the failed end failed"]


def verify(run: Callable[[float, int], SeedRun], b: Boundary, seeds: list[int],
           steps_per_run: int) -> Verify:
    """Run each end of ``b`` on ``seeds`` in order until one fails (the held end should
    hold on all, the failed end fail on one); ``run`` makes full-length runs
    (``steps_per_run`` says how long)."""
    def point(value: float | None) -> Point | None:
        if value is None:
            return None
        p = Point(value)
        p.extend(run, seeds)  # one failed seed settles either end
        return p

    return Verify(point(b.low), point(b.high), list(seeds), steps_per_run)


def grid_points(low: float, high: float, ratio: float = RATIO) -> int:
    """Points of a log grid from ``low`` to ``high`` with at most ``ratio`` between neighbours."""
    if high <= low:
        return 1
    return math.ceil(math.log(high / low) / math.log(ratio) - 1e-9) + 1


def grid_steps(low: float, high: float, seeds: int, steps: int, ratio: float = RATIO) -> int:
    """Steps of that grid run in full on ``seeds`` seeds."""
    return grid_points(low, high, ratio) * seeds * steps


def probe(run: Callable[[float, int], SeedRun], start: float, low: float, high: float, *,
          seeds: list[int], steps_per_run: int, factor: float = FACTOR,
          ratio: float = RATIO, first: float | None = None) -> Boundary:
    """Bracket then bisect the boundary of ``run`` within ``[low, high]`` (``0 < low <= high``),
    starting from ``start`` (clamped into the range). The bracket's first step is ×/÷
    ``first`` (default ``factor``; a predicted ``start`` is worth a first step of ``ratio``,
    which ends the search at once when the prediction is right), every later one ``factor``.

    Bracket and bisection run the first seed only; the final held value then runs the other
    seeds, and when one fails there it becomes the failed end and the search goes on below
    it (values under the answer need no more seeds: the answer only claims its two ends).
    """
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high, got {low}, {high}")
    if not seeds:
        raise ValueError("need at least one seed")
    points: dict[float, Point] = {}

    def holds(value: float, upto: int = 1) -> bool:
        return points.setdefault(value, Point(value)).extend(run, seeds[:upto])

    ok, bad = _bracket(holds, min(max(start, low), high), low, high, factor,
                       first or factor)
    probed = sorted(points)  # no edge in the range: the grid would span what was probed
    bracket = (ok, bad) if ok is not None and bad is not None else (probed[0], probed[-1])
    while ok is not None:
        while bad is not None and bad / ok > ratio:
            mid = math.sqrt(ok * bad)
            ok, bad = (mid, bad) if holds(mid) else (ok, mid)
        if holds(ok, len(seeds)):
            break
        bad = ok  # failed on a later seed: search below it
        below = [p.value for p in points.values() if p.held and p.value < bad]
        ok = max(below) if below else _down(holds, bad, low, factor)
        if ok is not None:
            bad = min(p.value for p in points.values() if not p.held and p.value > ok)
    ordered = sorted(points.values(), key=lambda p: p.value)
    return Boundary(ok, bad, ordered, bracket, len(seeds), steps_per_run)


def _bracket(holds: Callable[[float], bool], x: float, low: float, high: float,
             factor: float, first: float) -> tuple[float | None, float | None]:
    """(a value that held, the next one up that failed); None where the range ends first.
    The first step is ×/÷ ``first``, the others ×/÷ ``factor``."""
    step = first
    if holds(x):
        while x < high:
            up = min(x * step, high)
            if not holds(up):
                return x, up
            x, step = up, factor
        return x, None
    while x > low:
        down = max(x / step, low)
        if holds(down):
            return down, x
        x, step = down, factor
    return None, x


def _down(holds: Callable[[float], bool], x: float, low: float, factor: float) -> float | None:
    """The first value that held going down from ``x`` by ``factor``, or None at ``low``."""
    while x > low:
        x = max(x / factor, low)
        if holds(x):
            return x
    return None


def summary(b: Boundary, name: str = "lr") -> list[str]:
    """The answer as lines of plain text (stdout and boundary.md)."""
    d = b.as_dict()
    if b.low is not None and b.high is not None:
        head = (f"boundary: {name} between {b.low:.4g} (held on {b.seeds} seed(s)) and "
                f"{b.high:.4g} (failed), high/low = {d['width']:.3g}")
    elif b.high is None:
        head = (f"boundary: not found: {name} held up to the range's top {b.low:.4g}; "
                "raise --range HIGH")
    else:
        head = (f"boundary: not found: {name} failed down to the range's bottom "
                f"{b.high:.4g}; lower --range LOW")
    lines = [head,
             f"steps: {d['steps']} spent on {len(b.points)} probe point(s); a log grid over "
             f"{b.bracket[0]:.4g}..{b.bracket[1]:.4g} with ratio {RATIO:g} "
             f"({d['grid_points']} points × {b.seeds} seed(s) × {b.steps_per_run} steps) "
             f"would cost {d['grid_steps']} (ratio {d['ratio']:.2f})"]
    advice = b.advice()
    if advice["lr"] is not None:
        lines.append(f"advice: {name} {advice['lr']:.4g} ({advice['margin']:g}x below "
                     f"{b.low:.4g}, the largest that held: a margin below the edge; held "
                     f"means no rule fired, not that it learnt: `sweeps try FILE --set "
                     f"{name}={advice['lr']:.4g}` shows its quality)")
    elif b.low is not None:
        lines.append(f"advice: none for {name}: nothing up to {b.low:.4g} failed, so there "
                     "is no edge to keep a margin from (held means no rule fired, not "
                     "that it trained well)")
    if advice["grad_clip"] is not None:
        lines.append(f"advice: grad_clip {advice['grad_clip']:.3g} "
                     f"({advice['grad_clip_why']})")
    if b.prediction is not None:
        lines.append(b.prediction.line(name) + _against(b.prediction.predicted, b))
    elif b.prediction_note:
        lines.append(b.prediction_note)
    if b.verified is not None:
        lines += b.verified.lines(name)
    return lines


def _against(predicted: float, b: Boundary) -> str:
    """Where the prediction lies against the interval the probe found."""
    if b.low is not None and predicted < b.low:
        return f"; it lies ×{b.low / predicted:.3g} below the interval"
    if b.high is not None and predicted >= b.high:
        return f"; it lies ×{predicted / b.high:.3g} above the interval"
    return "; the interval holds it" if b.low is not None and b.high is not None else ""


def _outcome(p: Point) -> str:
    r = p.row()
    if p.held:
        return "held on every seed"
    why = f" ({r['reason']} at step {r['stop_step']})" if r["reason"] else ""
    return f"failed on seed {p.seeds[-1]}{why}"


def probe_lines(b: Boundary) -> list[str]:
    """One line per probed point, in value order."""
    out = []
    for p in b.points:
        r = p.row()
        why = f" ({r['reason']} at step {r['stop_step']})" if r["reason"] else ""
        held = [str(s) for s, run in zip(p.seeds, p.runs, strict=False) if run.held]
        failed = [str(s) for s, run in zip(p.seeds, p.runs, strict=False) if not run.held]
        seeds = (f"failed on seed(s) {', '.join(failed)}{why}"
                 + (f", held on {', '.join(held)}" if held else "")) if failed \
            else f"held on seed(s) {', '.join(held)}"
        out.append(f"  {p.value:.4g}: {seeds}, {p.steps} steps")
    return out
