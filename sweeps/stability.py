"""Stability sweeps: a grid over one knob (optionally crossed with a second) and seeds.

For each grid value it reports the largest pre-clip grad norm, whether the loss
went down, the share of seeds that stayed stable and the failure reasons seen,
and gives a verdict: ``stable``, ``too slow`` (stable but not learning),
``borderline`` (some seeds failed for a reason other than sitting at the
baseline), or ``explodes`` (more than half the seeds did). It names the stability boundary
along the first knob, recommends a value with a safety margin below it, and a
grad_clip from the grad norms of the stable runs.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sweeps import objectives
from sweeps.book import TrialBook, TrialRecord
from sweeps.trainable import ROLE_KEY, SEED_KEY

ROLE = "stability"
#: Recommended value = at most the last stable grid value divided by this.
SAFETY_MARGIN = 2.0
#: The loss went down when its last tenth averages below this share of its first tenth.
DECREASE = 0.9
#: Failures that mean "not learning" rather than "unstable".
SLOW_REASONS = frozenset({"flat_at_baseline"})
#: A run "clips too often" when more than this share of its steps exceed grad_clip.
CLIP_WARN = 0.5


def parse_values(text: str) -> list[Any]:
    """``1e-5,3e-5,none`` -> numbers where they parse, strings otherwise."""
    out: list[Any] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            number = float(part)
        except ValueError:
            out.append(part)
        else:
            out.append(int(number) if number.is_integer() and "." not in part and "e" not in
                       part.lower() else number)
    return out


def log_range(low: float, high: float, points: int) -> list[float]:
    """``points`` values evenly spaced in log space from ``low`` to ``high``."""
    return [float(v) for v in np.geomspace(low, high, points)]


def plan(base_values: dict[str, Any], param: str, values: list[Any], seeds: list[int],
         second: tuple[str, list[Any]] | None = None) -> list[dict[str, Any]]:
    """Run configs for every grid point and seed."""
    others = second[1] if second else [None]
    runs = []
    for v in values:
        for w in others:
            point = {**base_values, param: v}
            if second:
                point[second[0]] = w
            runs += [{**point, SEED_KEY: s, ROLE_KEY: ROLE} for s in seeds]
    return runs


@dataclass
class Cell:
    """One grid point: its runs and what they showed."""

    key: tuple[Any, ...]
    runs: list[TrialRecord] = field(default_factory=list)

    @property
    def stable_share(self) -> float:
        return sum(r.status == "ok" for r in self.runs) / len(self.runs) if self.runs else 0.0

    @property
    def max_grad_norm(self) -> float | None:
        norms = [v for r in self.runs for v in objectives.series(r.history, "grad_norm")]
        return max(norms) if norms else None

    @property
    def reasons(self) -> list[str]:
        return sorted({r.reason for r in self.runs if r.reason})

    def loss_decreased(self) -> bool:
        """True when every stable run's loss fell (last tenth below 0.9 x first tenth)."""
        stable = [r for r in self.runs if r.status == "ok"]
        return bool(stable) and all(_decreased(objectives.series(r.history, "loss"))
                                    for r in stable)

    def verdict(self) -> str:
        """explodes / borderline by the share of seeds that failed hard; else too slow/stable."""
        hard = [r for r in self.runs if r.failed and r.reason not in SLOW_REASONS]
        if hard:
            return "explodes" if len(hard) > len(self.runs) / 2 else "borderline"
        if any(r.failed for r in self.runs) or not self.loss_decreased():
            return "too slow"
        return "stable"


def _decreased(losses: list[float]) -> bool:
    if len(losses) < 4:
        return False
    k = max(1, len(losses) // 10)
    return statistics.fmean(losses[-k:]) < DECREASE * statistics.fmean(losses[:k])


def cells(book: TrialBook, param: str, second: str | None) -> list[Cell]:
    """Group the stability runs by grid point, in grid order."""
    grouped: dict[tuple[Any, ...], Cell] = {}
    for rec in book.trials.values():
        if rec.role != ROLE:
            continue
        key = (rec.values.get(param),) + ((rec.values.get(second),) if second else ())
        grouped.setdefault(key, Cell(key)).runs.append(rec)
    return list(grouped.values())


def boundary(rows: list[Cell]) -> tuple[Cell | None, Cell | None]:
    """The last stable cell before the first failing one along the first knob, and that one."""
    ordered = sorted(rows, key=lambda c: _order(c.key[0]))
    last_ok: Cell | None = None
    for cell in ordered:
        v = cell.verdict()
        if v in ("stable", "too slow"):
            last_ok = cell
        elif last_ok is not None and v in ("explodes", "borderline"):
            return last_ok, cell
    return last_ok, None


def _order(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, (int, float)) else (1, str(value))


def recommend(rows: list[Cell]) -> tuple[Any, str]:
    """A value of the first knob with a safety margin below the boundary, and why."""
    below, above = boundary(rows)
    stable = sorted((c.key[0] for c in rows if c.verdict() == "stable"), key=_order)
    if not stable:
        return None, "no grid value was stable on every seed and learning: widen the grid"
    if above is None:
        return stable[-1], (f"no value failed up to {stable[-1]}; the boundary lies above the "
                            "grid, so the largest stable value is recommended (extend the grid "
                            "to find the cliff)")
    edge = below.key[0] if below is not None and below.verdict() == "stable" else stable[-1]
    if not isinstance(edge, (int, float)):
        return edge, f"the last stable value before the boundary is {edge}"
    safe = [v for v in stable if isinstance(v, (int, float)) and v <= edge / SAFETY_MARGIN]
    if safe:
        return safe[-1], (f"boundary between {edge:g} (stable) and {above.key[0]:g} "
                          f"({above.verdict()}); recommended: the largest stable grid value at "
                          f"least {SAFETY_MARGIN:g}x below the last stable one")
    return edge, (f"boundary between {edge:g} (stable) and {above.key[0]:g} "
                  f"({above.verdict()}); no stable grid value lies {SAFETY_MARGIN:g}x below "
                  f"{edge:g}, so {edge:g} itself is recommended without margin: "
                  "add smaller grid values to get one")


def recommend_clip(rows: list[Cell]) -> tuple[float | None, str]:
    """grad_clip ≈ 90th percentile of stable runs' pre-clip norms, kept within 2-5x the median."""
    norms = [v for c in rows for r in c.runs if r.status == "ok"
             for v in objectives.series(r.history, "grad_norm")]
    if not norms:
        return None, "no stable run reported grad_norm"
    p90 = float(np.percentile(norms, 90))
    median = float(np.median(norms))
    clip = min(max(p90, 2 * median), 5 * median)
    return clip, (f"90th percentile of the {len(norms)} pre-clip grad norms of the stable runs "
                  f"is {p90:.3g} (median {median:.3g}); kept within 2-5x the median: {clip:.3g}")


def clip_warnings(rows: list[Cell], clip_knob: str = "grad_clip") -> list[str]:
    """Runs that clipped on more than half of their steps: the LR is the problem, not the clip."""
    out = []
    for cell in rows:
        for r in cell.runs:
            clip = r.values.get(clip_knob)
            norms = objectives.series(r.history, "grad_norm")
            if not isinstance(clip, (int, float)) or clip <= 0 or not norms:
                continue
            share = sum(n > clip for n in norms) / len(norms)
            if share > CLIP_WARN:
                out.append(f"{_label(cell.key)} seed {r.seed}: clipped on {share:.0%} of steps "
                           f"(grad_clip {clip:g}); the LR, not the clip, is the problem")
    return out


def _label(key: tuple[Any, ...]) -> str:
    return " × ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in key)


def table_rows(rows: list[Cell], names: list[str]) -> list[dict[str, Any]]:
    """One dict per grid point, for the CSV, the markdown and the terminal."""
    out = []
    for cell in sorted(rows, key=lambda c: tuple(_order(k) for k in c.key)):
        peak = cell.max_grad_norm
        out.append({**dict(zip(names, cell.key, strict=True)),
                    "max_grad_norm": peak if peak is None or math.isfinite(peak) else str(peak),
                    "loss_decreased": cell.loss_decreased(),
                    "stable_seeds": f"{sum(r.status == 'ok' for r in cell.runs)}/{len(cell.runs)}",
                    "reasons": ", ".join(cell.reasons), "verdict": cell.verdict()})
    return out


def draw_map(rows: list[Cell], names: list[str], path) -> None:
    """2-D stability map: first knob × second knob, each grid point coloured by verdict."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"stable": "#2a9d8f", "too slow": "#e9c46a", "borderline": "#f4a261",
               "explodes": "#e76f51"}
    xs = sorted({c.key[0] for c in rows}, key=_order)
    ys = sorted({c.key[1] for c in rows}, key=_order)
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(xs), 1.2 + 0.7 * len(ys)))
    for cell in rows:
        v = cell.verdict()
        ax.scatter(xs.index(cell.key[0]), ys.index(cell.key[1]), s=500, c=colours[v],
                   edgecolors="black")
        ax.annotate(f"{cell.stable_share:.0%}", (xs.index(cell.key[0]), ys.index(cell.key[1])),
                    ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(xs)), [_label((x,)) for x in xs], rotation=45)
    ax.set_yticks(range(len(ys)), [_label((y,)) for y in ys])
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
    for verdict, colour in colours.items():
        ax.scatter([], [], c=colour, label=verdict, edgecolors="black")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("stability map (share of seeds stable)")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
