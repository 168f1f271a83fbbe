"""Stability sweeps: a grid over one knob (optionally crossed with a second) and seeds.

For each grid value it reports the largest pre-clip grad norm, whether the loss
went down, the share of seeds that stayed stable, the failure reasons seen and
the quality reached (the sweep's first objective: its last value per run, mean,
min and max over the stable seeds), and gives a verdict: ``stable``,
``stable, poor`` (stable, but more than ``POOR_GAP`` worse than the best stable
cell), ``too slow`` (stable but not learning), ``borderline`` (some seeds failed
for a reason other than sitting at the baseline), or ``explodes`` (more than half
the seeds did). It names the stability boundary along the first knob, recommends
the best-quality value with a safety margin below it, and a grad_clip from the
grad norms of the stable runs; it says why runs clipped on most of their steps.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sweeps.protocol import CRASH, OK, ROLE_KEY, SEED_KEY, STABILITY, UNSTABLE
from sweeps.record import objectives
from sweeps.record.book import TrialBook, TrialRecord

ROLE = STABILITY
#: Recommended value = at most the last stable grid value divided by this.
SAFETY_MARGIN = 2.0
#: The loss went down when its last tenth averages below this share of its first tenth.
DECREASE = 0.9
#: Failures that mean "not learning" rather than "unstable".
SLOW_REASONS = frozenset({"flat_at_baseline"})
#: A run "clips too often" when more than this share of its steps exceed grad_clip.
CLIP_WARN = 0.5
#: The first this many grad-norm reports are a run's "start" in the clipping diagnosis.
START_REPORTS = 5
#: The grad norm "grew" when the median of the run's last half exceeds this multiple of the
#: median of its start (or it became non-finite): then the LR is blamed for the clipping.
NORM_GROWTH = 2.0
#: A stable cell is "poor" when its mean quality is more than this share worse than the
#: best stable cell's (``objectives.quality_gap``: a share of the best cell's improvement
#: over ``rules.baseline_loss`` when there is one, else of ``|best|``).
POOR_GAP = 0.10


def slow(reason: str | None, evidence: dict[str, Any] | None) -> bool:
    """A verdict that says too slow, not unstable: flat at the random guess, unless the
    run had learnt and went back there (``went_back``: the LR destroyed what it learnt)."""
    return reason in SLOW_REASONS and not (evidence or {}).get("went_back")


@dataclass(frozen=True)
class Quality:
    """The quality objective: a metric (its last value per run), whether lower is better,
    and the random-guess loss its gaps are measured against (None: relative to the best)."""

    metric: str
    mode: str = "min"
    baseline: float | None = None

    def gap(self, value: float, best: float) -> float:
        """How much worse ``value`` is than ``best`` (0 = as good)."""
        return objectives.quality_gap(value, best, self.mode, self.baseline)


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


#: Reasons that make a failed cell read ``explodes`` (the loss or the gradient blew up);
#: a cell whose seeds failed mostly otherwise (outputs collapsed, a broken LR schedule)
#: reads ``fails``.
EXPLOSIONS = frozenset({"non_finite", "grad_blowup", "divergence", "loss_spike"})


@dataclass
class Cell:
    """One grid point: its runs and what they showed."""

    key: tuple[Any, ...]
    runs: list[TrialRecord] = field(default_factory=list)
    #: ``(baseline_loss, flat_tolerance)`` of the sweep: a run that ends in that band sits
    #: at the random guess, whatever it started from.
    guess: tuple[float, float] | None = None
    #: An LR cell above one whose seeds all learnt: a run of it that sat at the random
    #: guess, or whose loss did not fall, is dead there (a higher LR will not help), not
    #: too slow (set by :func:`cells`).
    above_learning: bool = False

    @property
    def stable_share(self) -> float:
        return sum(r.status == OK for r in self.runs) / len(self.runs) if self.runs else 0.0

    @property
    def max_grad_norm(self) -> float | None:
        norms = [v for r in self.runs for v in objectives.series(r.history, "grad_norm")]
        return max(norms) if norms else None

    @property
    def reasons(self) -> list[str]:
        return sorted({r.reason for r in self.runs if r.reason})

    def qualities(self, quality: Quality) -> list[float]:
        """The quality metric of every stable run that reported it."""
        values = [objectives.metric_value(r.history, quality.metric)
                  for r in self.runs if r.status == OK]
        return [v for v in values if v is not None and math.isfinite(v)]

    def mean_quality(self, quality: Quality | None) -> float | None:
        """Mean quality over the stable seeds, or None when none reported it."""
        values = self.qualities(quality) if quality else []
        return statistics.fmean(values) if values else None

    def loss_decreased(self) -> bool:
        """True when every stable run's loss fell (last tenth below 0.9 x first tenth)."""
        stable = [r for r in self.runs if r.status == OK]
        return bool(stable) and all(_decreased(objectives.series(r.history, "loss"))
                                    for r in stable)

    def verdict(self) -> str:
        """crashed when the trainer raised on every seed (an error, not instability);
        explodes (most of them blew up: :data:`EXPLOSIONS`; else ``fails``, e.g. outputs
        collapsed) / borderline by the share of seeds that failed hard; else too slow (not
        learning, or ended at the random guess: :meth:`at_guess`) or stable. Above an LR
        whose seeds all learnt (:attr:`above_learning`), a seed flat at the guess or whose
        loss did not fall failed: ``dead`` when that is more than half of them, else
        ``borderline``."""
        if self.runs and all(r.status == CRASH for r in self.runs):
            return "crashed"
        hard = self._hard()
        dead = self._dead(hard)
        if hard or dead:
            if len(hard) + len(dead) <= len(self.runs) / 2:
                return "borderline"
            if len(hard) < len(dead):
                return "dead"
            blown = sum(r.reason in EXPLOSIONS for r in hard)
            return "explodes" if blown * 2 >= len(hard) else "fails"
        if any(r.failed for r in self.runs) or not self.loss_decreased() or \
                self.at_guess():
            return "too slow"
        return "stable"

    def _hard(self) -> list[TrialRecord]:
        """The runs that failed for a reason other than sitting at the random guess."""
        return [r for r in self.runs if r.failed and not slow(r.reason, r.evidence)]

    def _dead(self, hard: list[TrialRecord]) -> list[TrialRecord]:
        """Above an LR whose seeds all learnt: the runs other than ``hard`` (:meth:`_hard`)
        that sat at the random guess or whose loss did not fall."""
        if not self.above_learning:
            return []
        return [r for r in self.runs if r not in hard and (
            r.failed or self._run_at_guess(r) or
            not _decreased(objectives.series(r.history, "loss")))]

    def why_dead(self) -> list[str]:
        """What the dead runs (:meth:`_dead`) showed, for the reasons column: the verdict
        ``borderline`` or ``dead`` with no failure named read as if nothing happened."""
        out = set()
        for run in self._dead(self._hard()):
            if run.failed:
                continue  # its own reason is in the column
            out.add("at the random guess" if self._run_at_guess(run) else "loss did not fall")
        return sorted(out)

    def _run_at_guess(self, run: TrialRecord) -> bool:
        """A stable run whose last tenth of losses sits in the random-guess band."""
        if self.guess is None or run.status != OK:
            return False
        baseline, tolerance = self.guess
        losses = objectives.series(run.history, "loss")
        if not losses:
            return False
        tail = statistics.fmean(losses[-max(1, len(losses) // 10):])
        return abs(tail - baseline) <= tolerance * abs(baseline)

    def at_guess(self) -> bool:
        """Every stable run's last tenth of losses averages within the flat band of the
        random guess: a loss that started above it (1.78 against ln 4) and fell to it
        decreased, and learnt nothing."""
        stable = [r for r in self.runs if r.status == OK and objectives.series(r.history, "loss")]
        return bool(stable) and all(self._run_at_guess(r) for r in stable)


def _decreased(losses: list[float]) -> bool:
    """The last tenth's mean below DECREASE x the first loss, the untrained model's: an
    explosion early in the run that partly recovers is no progress, and a fast learner
    whose first tenth already fell most of the way is (against the first tenth's mean,
    identical runs at grad_clip 0 and 5 read as "too slow").

    Example:
        >>> fast = [1.0, 0.5] + [0.45] * 18
        >>> _decreased(fast), _decreased([1.0, 8.0, 6.0, 3.0] + [0.95] * 16)
        (True, False)
    """
    if len(losses) < 4:
        return False
    k = max(1, len(losses) // 10)
    return statistics.fmean(losses[-k:]) < DECREASE * losses[0]


def cells(book: TrialBook, param: str, second: str | None) -> list[Cell]:
    """Group the stability runs by grid point, in grid order."""
    grouped: dict[tuple[Any, ...], Cell] = {}
    rules = book.sweep.spec.rules
    guess = (rules.baseline_loss, rules.flat_tolerance) \
        if rules.baseline_loss is not None else None
    for rec in book.trials.values():
        if rec.role != ROLE:
            continue
        key = (rec.values.get(param),) + ((rec.values.get(second),) if second else ())
        grouped.setdefault(key, Cell(key, guess=guess)).runs.append(rec)
    if param == "lr":  # a seed at the guess above an LR that learnt is dead, not slow
        learnt = [c.key for c in grouped.values()
                  if isinstance(c.key[0], (int, float)) and c.verdict() == "stable"]
        for cell in grouped.values():
            cell.above_learning = isinstance(cell.key[0], (int, float)) and any(
                k[1:] == cell.key[1:] and k[0] < cell.key[0] for k in learnt)
    return list(grouped.values())


def boundary(rows: list[Cell]) -> tuple[Cell | None, Cell | None]:
    """The last stable cell before the first failing one along the first knob, and that one."""
    ordered = sorted(rows, key=lambda c: _order(c.key[0]))
    last_ok: Cell | None = None
    for cell in ordered:
        v = cell.verdict()
        if v in ("stable", "too slow"):
            last_ok = cell
        elif last_ok is not None and v in ("explodes", "fails", "borderline", "dead"):
            return last_ok, cell
    return last_ok, None


def _order(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, (int, float)) else (1, str(value))


def best_quality(rows: list[Cell], quality: Quality | None) -> Cell | None:
    """The ``stable`` cell with the best mean quality (None when none reported one)."""
    scored = [c for c in rows if c.verdict() == "stable" and c.mean_quality(quality) is not None]
    if not scored or quality is None:
        return None
    return min(scored, key=lambda c: _sign(quality) * c.mean_quality(quality))


def _sign(quality: Quality) -> float:
    return 1.0 if quality.mode == "min" else -1.0


def verdicts(rows: list[Cell], quality: Quality | None = None) -> dict[tuple[Any, ...], str]:
    """Each cell's verdict, with ``stable, poor`` for a stable cell more than POOR_GAP worse
    than the best stable cell."""
    best = best_quality(rows, quality)
    top = best.mean_quality(quality) if best else None
    out = {}
    for cell in rows:
        verdict, mean = cell.verdict(), cell.mean_quality(quality)
        if verdict == "stable" and quality and top is not None and mean is not None \
                and quality.gap(mean, top) > POOR_GAP:
            verdict = "stable, poor"
        out[cell.key] = verdict
    return out


def recommend(rows: list[Cell], quality: Quality | None = None) -> tuple[Any, str]:
    """A value of the first knob with a safety margin below the boundary, and why.

    Among the safe stable cells it picks the best mean quality; without a quality
    metric, the largest safe value.
    """
    below, above = boundary(rows)
    stable = sorted((c for c in rows if c.verdict() == "stable"), key=lambda c: _order(c.key[0]))
    if not stable:
        return None, "no grid value was stable on every seed and learning: widen the grid"
    if above is None:
        held = [c for c in sorted(rows, key=lambda c: _order(c.key[0]))
                if c.verdict() in ("stable", "too slow")]
        return _pick(stable, quality, f"no value failed up to {label(held[-1].key[:1])}; the "
                     "boundary lies above the grid (extend the grid to find the cliff)",
                     "stable values")
    edge = below.key[0] if below is not None and below.verdict() == "stable" else stable[-1].key[0]
    if not isinstance(edge, (int, float)):
        return edge, f"the last stable value before the boundary is {edge}"
    where = f"boundary between {edge:g} (stable) and {above.key[0]:g} ({above.verdict()})"
    if below is not None and below.key[0] != edge and isinstance(below.key[0], (int, float)):
        where = (f"boundary between {below.key[0]:g} ({below.verdict()}) and "
                 f"{above.key[0]:g} ({above.verdict()}); the last stable value below it is "
                 f"{edge:g}")
    safe = [c for c in stable if isinstance(c.key[0], (int, float))
            and c.key[0] <= edge / SAFETY_MARGIN]
    if safe:
        return _pick(safe, quality, where, f"stable grid values at least {SAFETY_MARGIN:g}x "
                     "below the last stable one")
    return edge, (f"{where}; no stable grid value lies {SAFETY_MARGIN:g}x below "
                  f"{edge:g}, so {edge:g} itself is recommended without margin: "
                  "add smaller grid values to get one")


def _pick(safe: list[Cell], quality: Quality | None, where: str, zone: str) -> tuple[Any, str]:
    """The best-quality cell's first-knob value among ``safe`` (sorted), else the largest."""
    largest = safe[-1].key[0]
    scored = [c for c in safe if c.mean_quality(quality) is not None]
    if quality is None or not scored:
        return largest, f"{where}; recommended: the largest of the {zone}"
    best = best_quality(scored, quality)
    top = best.mean_quality(quality)
    text = (f"{where}; recommended: the best mean {quality.metric} ({quality.mode}) among the "
            f"{zone}: {label(best.key)} with {top:.4g}")
    rivals = [c for c in scored if c.key[0] == largest]
    if best.key[0] == largest or not rivals:
        return best.key[0], text + ", which is also the largest safe value"
    runner = best_quality(rivals, quality)
    mean = runner.mean_quality(quality)
    return best.key[0], (text + f"; the largest safe value {label(runner.key)} is "
                         f"{quality.gap(mean, top):.0%} worse ({mean:.4g})"
                         + _untold(best, runner, quality))


def _untold(best: Cell, runner: Cell, quality: Quality) -> str:
    """A caveat when ``best`` leads ``runner`` by less than their seeds vary: the pick is
    then one of seed noise. '' when the lead is larger, or seeds do not vary."""
    seeds = [best.qualities(quality), runner.qualities(quality)]
    if min(map(len, seeds)) < 2:
        return ("; one seed per cell cannot tell a lead from seed noise: run --seeds 3 "
                "or more before you rely on it")
    lead = abs(best.mean_quality(quality) - runner.mean_quality(quality))
    spread = max(max(v) - min(v) for v in seeds)
    if lead < spread:
        return (f"; the lead ({lead:.3g}) is less than the seeds vary ({spread:.3g}): "
                "on these seeds the two are not told apart")
    return ""


def recommend_clip(rows: list[Cell], at: Any = None, quality: Quality | None = None,
                   clip_is_second: bool = False) -> tuple[float | None, str]:
    """grad_clip ≈ 90th percentile of stable runs' pre-clip norms, kept within 2-5x the
    median: of the runs at the first knob's value ``at`` (the one recommended: grad norms
    shrink as the LR grows, so the norms at another LR would clip too hard or never),
    else of every stable run. A grid whose second knob is grad_clip (``clip_is_second``)
    tested the values: its best stable cell at ``at`` gives it; when clips tie exactly
    (none engaged), the smallest clip above 0 among them; when no clip is best by less
    than its own seeds vary (another cell's mean within their range), the smallest clip
    above 0 within it."""
    if clip_is_second and at is not None:
        tested = [c for c in rows if c.key[0] == at and c.verdict() == "stable"]
        best = best_quality(tested, quality) if quality else None
        if best is None and tested:
            best = tested[0]
        tied = [c for c in tested if best is not None and quality is not None
                and c.mean_quality(quality) == best.mean_quality(quality)]
        guards = [c for c in tied if isinstance(c.key[1], (int, float)) and c.key[1] > 0]
        if len(tied) > 1 and guards:  # clips that never engaged: the tightest guards spikes
            tight = min(guards, key=lambda c: c.key[1])
            return tight.key[1], (
                f"the grid tested it: {', '.join(label((c.key[1],)) for c in tied)} tie "
                f"exactly at {label((at,))} (no clip engaged); the smallest, at no cost "
                "measured, guards against a spike")
        near = _within_spread(best, tested, quality) if best is not None and \
            best.key[1] == 0 else []
        if near:  # no clip is best by less than its own seeds vary: keep a guard
            tight = min(near, key=lambda c: c.key[1])
            return tight.key[1], (
                f"the grid tested it: no clip is the best stable cell at {label((at,))}, and "
                f"{label((tight.key[1],))} is within its seeds' spread (means "
                f"{best.mean_quality(quality):.4g} and {tight.mean_quality(quality):.4g}): "
                "at no cost measured, the clip guards against a spike")
        if best is not None:
            return best.key[1], (f"the grid tested it: {label(best.key)} is the best stable "
                                 f"cell at {label((at,))}")
    def norms(cells: list[Cell]) -> list[float]:
        return [v for c in cells for r in c.runs if r.status == OK
                for v in objectives.series(r.history, "grad_norm")]

    there = norms([c for c in rows if at is not None and c.key[0] == at])
    if there:
        return clip_from_norms(there, f"stable runs at {label((at,))}")
    return clip_from_norms(norms(rows), "stable runs")


def _within_spread(best: Cell, cells: list[Cell], quality: Quality | None) -> list[Cell]:
    """The cells with a clip above 0 whose mean quality lies within ``best``'s seeds'
    range (its worst to best seed)."""
    if quality is None:
        return []
    own = best.qualities(quality)
    if len(own) < 2:
        return []
    low, high = min(own), max(own)
    return [c for c in cells if isinstance(c.key[1], (int, float)) and c.key[1] > 0
            and (mean := c.mean_quality(quality)) is not None and low <= mean <= high]


def clip_from_norms(norms: list[float], runs: str) -> tuple[float | None, str]:
    """grad_clip ≈ the 90th percentile of ``norms`` (pre-clip grad norms of the ``runs``
    that held), kept within 2-5x their median; None without norms."""
    if not norms:
        return None, f"no {runs.removesuffix('s')} reported grad_norm"
    p90 = float(np.percentile(norms, 90))
    median = float(np.median(norms))
    clip = min(max(p90, 2 * median), 5 * median)
    return clip, (f"90th percentile of the {len(norms)} pre-clip grad norms of the {runs} "
                  f"is {p90:.3g} (median {median:.3g}); kept within 2-5x the median: {clip:.3g}")


@dataclass(frozen=True)
class _Clipping:
    """How often one run clipped; its grad norm at the start, in its last half and at peak;
    the rule that stopped it (not one that means "not learning"), if any."""

    clip: float
    share: float
    start: float
    late: float
    peak: float
    stopped_by: str | None


def _clipping(run: TrialRecord, clip_knob: str) -> _Clipping | None:
    """The clipping of one run (None when it has no grad_clip > 0 or no finite grad norm).

    Its start is the median of the first START_REPORTS reports, at most the first quarter
    of a short run, so a run that blows up within a few steps starts where it began.
    """
    clip = run.values.get(clip_knob)
    norms = objectives.series(run.history, "grad_norm")
    if not isinstance(clip, (int, float)) or clip <= 0 or not norms:
        return None
    nonfinite = any(isinstance(v, (int, float)) and not math.isfinite(v)
                    for v in (h.get("grad_norm") for h in run.history))
    stopped = run.reason if run.status == UNSTABLE and not slow(run.reason, run.evidence) \
        else ("non-finite grad norm" if nonfinite else None)
    head = norms[:min(START_REPORTS, max(1, len(norms) // 4))]
    return _Clipping(clip, sum(n > clip for n in norms) / len(norms), statistics.median(head),
                     statistics.median(norms[len(norms) // 2:]),
                     math.inf if nonfinite else max(norms), stopped)


def clip_warnings(rows: list[Cell], clip_knob: str = "grad_clip") -> list[str]:
    """One line per grid point whose runs clipped on more than CLIP_WARN of their steps,
    naming the cause: a clip below the starting grad norm, or norms that grew (the LR)."""
    out = []
    for cell in rows:
        seen = [(r.seed, c) for r in cell.runs if (c := _clipping(r, clip_knob))]
        hits = [(seed, c) for seed, c in seen if c.share > CLIP_WARN]
        if hits:
            out.append(_clip_message(cell.key, hits))
    return out


def _clip_message(key: tuple[Any, ...], hits: list[tuple[int, _Clipping]]) -> str:
    """The warning for one grid point, from the medians over its clipping runs.

    The LR is blamed only when the norm grew: a rule stopped a run (or its norm went
    non-finite), or the median of the last half is NORM_GROWTH x above the start.
    """
    clip = hits[0][1].clip
    share = statistics.fmean(c.share for _, c in hits)
    start = statistics.median(c.start for _, c in hits)
    late = statistics.median(c.late for _, c in hits)
    stops = sorted({c.stopped_by for _, c in hits if c.stopped_by})
    seeds = ", ".join(str(seed) for seed, _ in hits)
    head = (f"{label(key)} (seed{'s' if len(hits) > 1 else ''} {seeds}): clipped on "
            f"{share:.0%} of steps")
    blame = f": the LR, not grad_clip {clip:g}, is the problem"
    if stops:
        peak = max(c.peak for _, c in hits)
        return (f"{head}; the grad norm rose from ~{start:.3g} at the start to a peak of "
                f"{peak:.3g} and {', '.join(stops)} stopped the run{blame}")
    if late > NORM_GROWTH * start:
        return (f"{head}; the grad norm grew from ~{start:.3g} at the start to ~{late:.3g} in "
                f"the last half{blame}")
    if start > clip:
        steps = "every step is" if share >= 0.99 else "most steps are"
        return (f"{head}; grad_clip {clip:g} is below the typical grad norm at start "
                f"(~{start:.3g}): {steps} clipped, so the clip acts as a normalisation; "
                f"raise grad_clip to ≈{start:.2g} or more")
    return (f"{head}; the grad norm settles above grad_clip {clip:g} (~{start:.3g} at the "
            f"start, ~{late:.3g} in the last half): raise grad_clip to ≈{late:.2g} if that "
            "level is normal for this model, or lower the LR")


def label(key: tuple[Any, ...]) -> str:
    """A grid point for people: floats with 6 significant digits, joined by ×."""
    return " × ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in key)


def table_rows(rows: list[Cell], names: list[str],
               quality: Quality | None = None) -> list[dict[str, Any]]:
    """One dict per grid point, for the CSV, the markdown and the terminal."""
    marks = verdicts(rows, quality)
    best = best_quality(rows, quality)
    top = best.mean_quality(quality) if best else None
    out = []
    for cell in sorted(rows, key=lambda c: tuple(_order(k) for k in c.key)):
        peak = cell.max_grad_norm
        out.append({**dict(zip(names, cell.key, strict=True)),
                    "max_grad_norm": peak if peak is None or math.isfinite(peak) else str(peak),
                    "loss_decreased": cell.loss_decreased(),
                    "stable_seeds": f"{sum(r.status == 'ok' for r in cell.runs)}/{len(cell.runs)}",
                    "reasons": ", ".join(cell.reasons + cell.why_dead()),
                    **_quality_columns(cell, quality, top), "verdict": marks[cell.key]})
    return out


def _quality_columns(cell: Cell, quality: Quality | None, top: float | None) -> dict[str, Any]:
    """``<metric>`` (mean), ``<metric>_min``, ``<metric>_max`` over the stable seeds and
    ``quality_gap`` (share worse than the best stable cell); none without a quality metric."""
    if quality is None:
        return {}
    values = cell.qualities(quality)
    mean = statistics.fmean(values) if values else None
    return {quality.metric: mean, f"{quality.metric}_min": min(values, default=None),
            f"{quality.metric}_max": max(values, default=None),
            "quality_gap": None if mean is None or top is None else quality.gap(mean, top)}


def display_rows(table: list[dict[str, Any]], quality: Quality | None) -> list[dict[str, Any]]:
    """The table for people (terminal, markdown): the quality as ``mean (min–max)`` in one
    column and its gap as a percentage; the CSV keeps the numbers apart."""
    if quality is None:
        return table
    name = quality.metric
    out = []
    for row in table:
        row = dict(row)
        mean, low, high = row.pop(name), row.pop(f"{name}_min"), row.pop(f"{name}_max")
        gap = row.pop("quality_gap")
        verdict = row.pop("verdict")
        row[f"{name} (min–max)"] = "" if mean is None else f"{mean:.3g} ({low:.3g}–{high:.3g})"
        row["gap"] = "" if gap is None else f"{gap:+.0%}"
        row["verdict"] = verdict
        out.append(row)
    return out


def quality_note(rows: list[Cell], quality: Quality | None) -> str:
    """One line on the quality columns and the ``stable, poor`` threshold."""
    if quality is None:
        return "quality: the sweep has no objective metric"
    best = best_quality(rows, quality)
    if best is None:
        if any(c.verdict() == "stable" for c in rows):
            return f"quality: no stable cell reported {quality.metric}"
        return (f"quality: {quality.metric}, the mean over a cell's stable seeds; no cell is "
                "'stable' (learning, no seed failed), so there is no best to measure gaps from")
    return (f"quality: {quality.metric} ({quality.mode}; its last value per run; mean, min and "
            f"max over the stable seeds); best stable: {label(best.key)} with "
            f"{best.mean_quality(quality):.4g}; quality_gap = share worse than that"
            + (f" (of its improvement over the random-guess {quality.baseline:g})"
               if quality.baseline is not None else "") + "; "
            f"'stable, poor' = more than {POOR_GAP:.0%} worse")


def draw_map(rows: list[Cell], names: list[str], path, quality: Quality | None = None) -> None:
    """2-D stability map: first knob × second knob, each grid point coloured by verdict."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"stable": "#2a9d8f", "stable, poor": "#8ab17d", "too slow": "#e9c46a",
               "borderline": "#f4a261", "explodes": "#e76f51", "fails": "#d62828",
               "dead": "#264653",
               "crashed": "#6d597a"}
    marks = verdicts(rows, quality)
    xs = sorted({c.key[0] for c in rows}, key=_order)
    ys = sorted({c.key[1] for c in rows}, key=_order)
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(xs), 1.2 + 0.7 * len(ys)))
    for cell in rows:
        v = marks[cell.key]
        ax.scatter(xs.index(cell.key[0]), ys.index(cell.key[1]), s=500, c=colours[v],
                   edgecolors="black")
        ax.annotate(f"{cell.stable_share:.0%}", (xs.index(cell.key[0]), ys.index(cell.key[1])),
                    ha="center", va="center", fontsize=7)
    from sweeps.results.plots import plain

    ax.set_xticks(range(len(xs)), [plain(label((x,))) for x in xs], rotation=45)
    ax.set_yticks(range(len(ys)), [plain(label((y,))) for y in ys])
    ax.set_xlabel(plain(names[0]))
    ax.set_ylabel(plain(names[1]))
    for verdict, colour in colours.items():
        ax.scatter([], [], c=colour, label=verdict, edgecolors="black")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("stability map (share of seeds stable)")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
