"""The report's plots (matplotlib, Agg, no pyplot state), each written atomically as a PNG
with the mode of the report's other files.

Names, knob values, reasons and trial ids come from the sweep and its trainer: every such
string is drawn through :func:`plain`, so that matplotlib never reads ``$…$`` in it as math.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from sweeps.protocol import FAILED, OK, PRUNED, objective_column
from sweeps.rules.verdict import CRASH_REASONS, REASONS
from sweeps.state.atomic import write_bytes
from sweeps.terminal import clean

STATUS_COLOURS = {"ok": "#2ca02c", "unstable": "#e76f51", "crash": "#6d597a",
                  "pruned": "#b0b0b0"}
STATUS_MARKERS = {"ok": "o", "unstable": "X", "crash": "s", "pruned": "o"}
#: One colour per outcome: ok, pruned and each failure reason.
REASON_PALETTE = ("#d62728", "#ff7f0e", "#8c564b", "#1f77b4", "#e377c2", "#9467bd", "#bcbd22",
                  "#17becf", "#393b79", "#000000", "#637939", "#7b4173", "#843c39", "#8c6d31",
                  "#5254a3", "#ad494a")
OUTCOME_COLOURS = {OK: "#2ca02c", PRUNED: "#c0c0c0",
                   **dict(zip(REASONS, REASON_PALETTE, strict=False))}
TRIAL_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                 "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]
DPI = 100
MAX_POINTS = 2000


def save(fig: Figure, path: Path) -> Path:
    """Render ``fig`` to ``path`` as PNG, atomically and with the mode of every other
    results file (:func:`sweeps.state.atomic.write_bytes`: from the umask)."""
    FigureCanvasAgg(fig)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=DPI)
    write_bytes(path, png.getvalue())
    return path


def plain(text: object) -> str:
    r"""``text`` as matplotlib draws it literally: each ``$`` escaped (so a knob value such
    as ``$x^$`` is not parsed as math), control characters removed.

    Example:
        >>> plain("$x^2$ costs $5")
        '\\$x^2\\$ costs \\$5'
    """
    return clean(text).replace("$", r"\$")


def outcome(trials: pd.DataFrame) -> pd.Series:
    """``ok``, ``pruned`` or the failure reason (the status if no reason was recorded)."""
    reason = trials["reason"].fillna("").astype(str)
    status = trials["status"].fillna("").astype(str)
    return reason.where(reason != "", status)


def _finite(values: pd.Series) -> pd.Series:
    out = pd.to_numeric(values, errors="coerce")
    return out.where(np.isfinite(out))


def _auto_log(ax: Axes, axis: str, values: pd.Series, ratio: float = 100.0) -> None:
    v = values.dropna()
    if len(v) and (v > 0).all() and v.max() / v.min() > ratio:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")


def _label(name: str, mode: str | None) -> str:
    return f"{name} ({'lower' if mode != 'max' else 'higher'} is better)" if mode else name


def _scatter_by_status(ax: Axes, frame: pd.DataFrame, x: str, y: str) -> None:
    for status, colour in STATUS_COLOURS.items():
        part = frame[frame["status"] == status]
        if len(part):
            ax.scatter(part[x], part[y], c=colour, marker=STATUS_MARKERS[status],
                       s=22 if status == PRUNED else 36, alpha=0.9, zorder=2,
                       label=f"{status} ({len(part)})")


def non_dominated(frame: pd.DataFrame, x: str, y: str, signs: tuple[float, float]) -> pd.DataFrame:
    """The rows of ``frame`` no other row beats on both ``x`` and ``y`` (each times its
    sign: 1 to minimise, -1 to maximise), sorted by ``x``.

    Example:
        >>> f = pd.DataFrame({"q": [1.0, 2.0, 3.0, 2.5], "t": [3.0, 1.0, 0.5, 2.0]})
        >>> non_dominated(f, "q", "t", (1, 1))["q"].tolist()
        [1.0, 2.0, 3.0]
        >>> non_dominated(f, "q", "t", (-1, 1))["q"].tolist()  # q an accuracy
        [3.0]
    """
    a, b = frame[x] * signs[0], frame[y] * signs[1]
    keep = [not ((a <= a[i]) & (b <= b[i]) & ((a < a[i]) | (b < b[i]))).any()
            for i in frame.index]
    return frame[keep].sort_values(x)


def _ring_front(ax: Axes, front: pd.DataFrame, x: str, y: str, confirmed: set[str],
                signs: tuple[float, float] = (1, 1)) -> None:
    if not len(front):
        return
    line = non_dominated(front, x, y, signs)  # the line joins the front, not every candidate
    ax.plot(line[x], line[y], color="#555", lw=0.8, ls=":", zorder=1)
    is_conf = front["trial_id"].isin(confirmed)
    ax.scatter(front.loc[is_conf, x], front.loc[is_conf, y], s=170, facecolors="none",
               edgecolors="black", linewidths=2, zorder=3)
    ax.scatter(front.loc[~is_conf, x], front.loc[~is_conf, y], s=170, facecolors="none",
               edgecolors="#d62728", linewidths=1.5, linestyles="--", zorder=3)
    for _, row in front.iterrows():
        ax.annotate(str(row["front_rank"]), (row[x], row[y]), xytext=(7, 5),
                    textcoords="offset points", fontsize=8)


def _at_the_edge(ax: Axes, failed: pd.DataFrame, x: str) -> None:
    """Failed trials (drawn at the penalty value Optuna was told, which would squash the
    rest into a corner) as crosses on the top edge of axes scaled to the other trials."""
    xlim, ylim = ax.get_xlim(), ax.get_ylim()
    xs = failed[x].fillna(max(xlim)).clip(min(xlim), max(xlim))
    ax.scatter(xs, [max(ylim)] * len(xs), marker="X", c=STATUS_COLOURS["unstable"], s=36,
               clip_on=False, zorder=3, label=f"failed ({len(failed)}), on the top edge")
    ax.set_xlim(xlim)
    ax.set_ylim(ylim)


def pareto_plot(search: pd.DataFrame, pareto: pd.DataFrame, objectives: Sequence[str],
                modes: dict[str, str], path: Path) -> Path | None:
    """Quality vs the second objective (and vs step_time), front ringed; None if no data."""
    if not objectives:
        return None
    quality = objective_column(objectives[0])
    seconds = [o for o in objectives[1:2]] or (["instability"] if "instability" in search
                                               else [])
    seconds += [o for o in ("instability", "step_time") if o in objectives[2:]]
    panels = []
    for other in seconds:
        col = f"objective_{other}" if f"objective_{other}" in search else other
        if quality in search and col in search:
            panels.append((other, col))
    if not panels:
        return None
    frame = search.assign(**{c: _finite(search[c]) for c in {quality, *[c for _, c in panels]}})
    ranks = dict(zip(pareto.get("trial_id", []), pareto.get("front_rank", []), strict=False))
    confirmed = set(pareto.loc[pareto["confirmed"], "trial_id"]) if len(pareto) else set()
    fig = Figure(figsize=(6.4 * len(panels), 4.8), layout="constrained")
    drawn = False
    for ax, (other, col) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels,
                                strict=True):
        # a failed trial is drawn whatever it reported (its quality may be NaN)
        bad = frame["status"].isin(FAILED)
        part = frame[(frame[quality].notna() & frame[col].notna()) | bad]
        failed = part["status"].isin(FAILED)
        shown = part[~failed] if (~failed).any() else part.dropna(subset=[quality, col])
        _scatter_by_status(ax, shown, quality, col)
        front = part[part["trial_id"].isin(ranks)].assign(
            front_rank=lambda f: f["trial_id"].map(ranks))
        signs = tuple(-1.0 if modes.get(name) == "max" else 1.0
                      for name in (objectives[0], other))
        _ring_front(ax, front, quality, col, confirmed, signs)
        _auto_log(ax, "x", shown[quality])
        _auto_log(ax, "y", shown[col])
        if len(shown) < len(part):
            _at_the_edge(ax, part[failed], quality)
        note = "" if f"objective_{other}" in search else " — not an objective"
        ax.set_xlabel(plain(_label(objectives[0], modes.get(objectives[0]))))
        ax.set_ylabel(plain(_label(other, modes.get(other)) + note))
        ax.set_title(plain(f"{objectives[0]} vs {other}: {len(part)} search trials"),
                     fontsize=10)
        ax.grid(alpha=0.3)
        handles, _ = ax.get_legend_handles_labels()
        conf = front["trial_id"].isin(confirmed)
        if conf.any():
            handles.append(Line2D([], [], ls="", marker="o", ms=12, mfc="none", mec="black",
                                  mew=2, label=f"candidate, confirmed ({int(conf.sum())})"))
        if (~conf).any():
            handles.append(Line2D([], [], ls="", marker="o", ms=12, mfc="none", mec="#d62728",
                                  label=f"candidate, not confirmed ({int((~conf).sum())})"))
        ax.legend(handles=handles, fontsize=8, loc="best")
        drawn = drawn or len(part) > 0
    if not drawn:
        return None
    return save(fig, path)


@dataclass
class Axis:
    """Where each trial sits along one axis of the stability map."""

    positions: pd.Series
    ticks: list[float] | None = None
    labels: list[str] | None = None
    log: bool = False


def _fmt(v: object) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return f"{v:g}" if isinstance(v, float) else str(v)


def knob_axis(values: pd.Series, kind: str = "auto", zero_is_off: bool = False) -> Axis:
    """Positions of a knob's values: one slot per category (0 → "off" if ``zero_is_off``),
    else numbers on a log (``kind="log"``, or "auto" and positive over a wide range) or
    linear axis."""
    if kind == "categorical":
        present = values.dropna()
        num = pd.to_numeric(present, errors="coerce")
        cats = (sorted(num.unique()) if num.notna().all()
                else sorted(present.astype(str).unique()))
        key = num if num.notna().all() else present.astype(str)
        slot = {c: float(i) for i, c in enumerate(cats)}
        labels = ["off" if zero_is_off and isinstance(c, float) and c == 0 else plain(_fmt(c))
                  for c in cats]
        return Axis(key.map(slot).reindex(values.index), list(slot.values()), labels)
    num = _finite(values)
    pos = num.dropna()
    positive = bool(len(pos)) and bool((pos > 0).all())
    log = positive and (kind == "log" or kind == "auto" and pos.max() / pos.min() > 20)
    return Axis(num, log=log)


def _jitter(n: int, width: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-width, width, n)


def stability_map(search: pd.DataFrame, x: str, y: str | None, kinds: dict[str, str],
                  handed_ids: set[str], path: Path) -> Path | None:
    """Each search trial at its (x, y) knob values coloured by outcome; y=None: outcome rows.
    The configs handed over (in stable/) are ringed."""
    if x not in search or not len(search):
        return None
    frame = search.assign(outcome=outcome(search))
    xa = knob_axis(frame[x], kinds.get(x, "auto"), zero_is_off=x == "grad_clip")
    if y is None:
        names = [o for o in OUTCOME_COLOURS if o in set(frame["outcome"])]
        names += sorted(set(frame["outcome"]) - set(names))
        slot = {o: float(i) for i, o in enumerate(names)}
        ya = Axis(frame["outcome"].map(slot), list(slot.values()), [plain(n) for n in names])
    else:
        ya = knob_axis(frame[y], kinds.get(y, "auto"), zero_is_off=y == "grad_clip")
    xs = xa.positions + (_jitter(len(frame), 0.15, 1) if xa.ticks is not None else 0)
    ys = ya.positions + (_jitter(len(frame), 0.18, 2) if ya.ticks is not None else 0)
    ok = xs.notna() & ys.notna()
    if not ok.any():
        return None
    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.subplots()
    for name in frame.loc[ok, "outcome"].unique():
        sel = ok & (frame["outcome"] == name)
        marker = ("o" if name in ("ok", "pruned")
                  else "s" if name in CRASH_REASONS else "X")
        ax.scatter(xs[sel], ys[sel], c=OUTCOME_COLOURS.get(name, "#444444"), marker=marker,
                   s=28 if name == "pruned" else 55, edgecolors="white", linewidths=0.5,
                   label=plain(f"{name} ({int(sel.sum())})"), zorder=2)
    ring = ok & frame["trial_id"].isin(handed_ids)
    if ring.any():
        ax.scatter(xs[ring], ys[ring], s=190, facecolors="none", edgecolors="black",
                   linewidths=1.5, label="handed over (stable/)", zorder=3)
    for axis, spec, setter in ((xa, "x", ax.set_xscale), (ya, "y", ax.set_yscale)):
        if spec == "x" and axis.ticks is not None:
            ax.set_xticks(axis.ticks, axis.labels)
        elif axis.ticks is not None:
            ax.set_yticks(axis.ticks, axis.labels)
        elif axis.log:
            setter("log")
    ax.set_xlabel(plain(x + (" (log)" if xa.log else "")))
    ax.set_ylabel(plain("outcome" if y is None else y + (" (log)" if ya.log else "")))
    ax.set_title(plain(f"Stability map: {x} × {y or 'outcome'} ({int(ok.sum())} search "
                       "trials)"), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return save(fig, path)


@dataclass
class Curve:
    """One trial's history as drawn in a curves plot."""

    label: str
    history: pd.DataFrame
    stop_step: float | None = None


def _thin(frame: pd.DataFrame) -> pd.DataFrame:
    if len(frame) <= MAX_POINTS:
        return frame
    idx = np.unique(np.r_[np.linspace(0, len(frame) - 1, MAX_POINTS).astype(int)])
    return frame.iloc[idx]


def curves_plot(curves: Sequence[Curve], title: str, path: Path,
                baseline: float | None = None) -> Path | None:
    """loss, grad_norm (log) and lr vs step, one colour per trial, stop steps marked, and
    the random-guess loss (``baseline``) as a grey line on the loss panel."""
    if not curves:
        return None
    fig = Figure(figsize=(15, 4.6), layout="constrained")
    axes = fig.subplots(1, 3)
    fig.suptitle(plain(title), fontsize=11)
    for ax, key in zip(axes, ("loss", "grad_norm", "lr"), strict=True):
        seen: list[float] = []
        for i, curve in enumerate(curves):
            colour = TRIAL_COLOURS[i % len(TRIAL_COLOURS)]
            hist = curve.history
            step = (_finite(hist["step"]) if "step" in hist
                    else pd.Series(np.arange(1, len(hist) + 1), index=hist.index))
            label = plain(curve.label) if ax is axes[0] else None
            if key in hist:
                data = _thin(pd.DataFrame({"s": step, "v": _finite(hist[key])}).dropna())
                ax.plot(data["s"], data["v"], color=colour, lw=1.2, label=label)
                seen += data["v"].tolist()
                label = None
            if key == "loss" and "val_loss" in hist:
                val = pd.DataFrame({"s": step, "v": _finite(hist["val_loss"])}).dropna()
                ax.plot(val["s"], val["v"], color=colour, lw=1, ls="--", marker=".", ms=4)
                seen += val["v"].tolist()
            if curve.stop_step is not None and math.isfinite(curve.stop_step):
                ax.axvline(curve.stop_step, color=colour, ls=":", lw=1.2, label=label)
        if key == "loss" and baseline is not None and seen:
            ax.axhline(baseline, color="#888", ls="-.", lw=1)
            ax.annotate(f"random guess {baseline:g}", (0.01, baseline),
                        xycoords=("axes fraction", "data"), fontsize=8, color="#666",
                        va="bottom")
        values = pd.Series(seen, dtype=float)
        if key == "grad_norm" and (values > 0).any():
            ax.set_yscale("log")
        else:
            _auto_log(ax, "y", values, ratio=1e3)
        if not seen:
            ax.text(0.5, 0.5, f"{key} not reported", transform=ax.transAxes, ha="center",
                    color="#888")
        ax.set_title(key + (" (log)" if ax.get_yscale() == "log" else "")
                     + (" — dashed: val_loss" if key == "loss" else ""), fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(4, len(handles)),
                   fontsize=8, frameon=False)
    return save(fig, path)


VERDICT_COLOURS = {"confirmed": "#2ca02c", "unconfirmed": "#8fbf8f", "fragile": "#e76f51",
                   "poor": "#f4a261", "incomplete": "#b0b0b0", "base config": "#1f77b4"}


@dataclass
class SeedRow:
    """One candidate (or the base config) in the per-seed plot."""

    label: str
    verdict: str
    search: float | None
    fresh: list[float]


def seed_plot(rows: Sequence[SeedRow], metric: str, mode: str, path: Path) -> Path | None:
    """A dot per seed for each candidate: hollow the search seed, filled the fresh seeds,
    a bar at the fresh-seed mean; None if there is nothing to show."""
    rows = [r for r in rows if r.search is not None or r.fresh]
    if not rows:
        return None
    fig = Figure(figsize=(7.5, 0.9 + 0.42 * len(rows)), layout="constrained")
    ax = fig.subplots()
    every: list[float] = []
    for y, row in enumerate(reversed(rows)):
        colour = VERDICT_COLOURS.get(row.verdict, "#555555")
        fresh = [v for v in row.fresh if math.isfinite(v)]
        if fresh:
            ax.scatter(fresh, [y] * len(fresh), c=colour, s=36, zorder=3)
            ax.plot([float(np.mean(fresh))] * 2, [y - 0.3, y + 0.3], c=colour, lw=2)
        if row.search is not None and math.isfinite(row.search):
            ax.scatter([row.search], [y], facecolors="none", edgecolors=colour, s=60,
                       linewidths=1.5, zorder=3)
            fresh.append(row.search)
        every += fresh
    ax.set_yticks(range(len(rows)), [plain(f"{r.label} ({r.verdict})")
                                     for r in reversed(rows)], fontsize=8)
    _auto_log(ax, "x", pd.Series(every), ratio=20.0)
    ax.set_xlabel(plain(_label(metric, mode)))
    ax.grid(alpha=0.3, axis="x")
    ax.legend(handles=[
        Line2D([], [], ls="", marker="o", mfc="none", mec="#555555", label="search seed"),
        Line2D([], [], ls="", marker="o", c="#555555", label="fresh seeds"),
        Line2D([], [], ls="-", c="#555555", lw=2, label="fresh-seed mean")],
        fontsize=8, loc="best")
    ax.set_title(plain(f"{metric} on every seed, handed-over configs first"), fontsize=10)
    return save(fig, path)
