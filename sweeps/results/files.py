"""The files a sweep leaves behind: trials.csv, pareto.csv, stable/*.yaml (or .json),
trials/*.csv."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from sweeps.protocol import (
    BASE_CONFIG,
    LOSS_AT_GUESS,
    LOSS_OFF_SCALE,
    LR_STILL_WARMING,
    OK,
    SELECTION,
    SELECTION_REASON,
    TRIAL_HEAD,
    objective_column,
    seed_column,
)
from sweeps.record import objectives
from sweeps.results.export import suffix, write_config
from sweeps.rules._history import finite_values
from sweeps.spec.loader import Sweep
from sweeps.spec.space import Categorical, fixed_value
from sweeps.state.atomic import replace_dir, write_text
from sweeps.trial.compile import EVIDENCE_KEYS, compile_mode

if TYPE_CHECKING:  # annotations only: the files are written without Ray Tune imported
    from sweeps.record.book import TrialBook, TrialRecord
    from sweeps.results.confirm import Confirmation, Selection


def trial_row(sweep: Sweep, book: TrialBook, rec: TrialRecord) -> dict[str, Any]:
    """One row of trials.csv."""
    steps = rec.history[-1].get("step") if rec.history else 0
    row: dict[str, Any] = dict(zip(TRIAL_HEAD, (
        rec.trial_id, rec.role, rec.status, rec.reason or "", rec.stop_step, rec.seed, steps,
        rec.retries), strict=True))
    row.update({k: rec.values.get(k) for k in sweep.space})
    for obj, value in zip(sweep.objectives, book.objective_values(rec, sweep.objectives),
                          strict=True):
        if obj.metric == "instability" and rec.flagged:
            value = max(objectives.FAILED_INSTABILITY, value or 0.0)  # as told to Optuna
        row[objective_column(obj.metric)] = value
    row.update(objectives.summary(rec.history))
    row["diagnosis"] = rec.diagnosis_text()
    row["evidence"] = json.dumps(rec.evidence, default=str) if rec.evidence else ""
    row.update(compile_columns(sweep, rec))
    if any(r.gpu_peak_mb is not None for r in book.trials.values()):
        row["gpu_peak_mb"] = rec.gpu_peak_mb  # only with CUDA: absent on a CPU-only sweep
    row["warnings"] = "; ".join(rec.warnings + ([fallback_warning(rec)]
                                                if rec.compile_fallback else []))
    return row


def compile_columns(sweep: Sweep, rec: TrialRecord) -> dict[str, Any]:
    """``compile_graphs`` … ``compile_cache_misses`` and ``compile_fallback`` (why a trial
    labelled compiled ran eagerly, else ""), for sweeps whose ``compile`` knob names a
    compiled mode and for any trial that compiled a graph."""
    ev = rec.compile or {}
    if not compiles(sweep) and not ev.get("graphs"):
        return {}
    out: dict[str, Any] = {f"compile_{k}": ev.get(k) for k in EVIDENCE_KEYS}
    out["compile_fallback"] = rec.compile_fallback or ""
    return out


def compiles(sweep: Sweep) -> bool:
    """Whether the sweep's ``compile`` knob can be a compiled mode."""
    knob = sweep.space.get("compile")
    if knob is None:
        return False
    modes = knob.choices if isinstance(knob, Categorical) else [fixed_value(knob)]
    return any(compile_mode(m) != "none" for m in modes)


def fallback_warning(rec: TrialRecord) -> str:
    """The warning of a trial labelled compiled that ran eagerly."""
    return (f"labelled compile={rec.values.get('compile')} but ran eagerly: "
            f"{rec.compile_fallback}; its step_time is not that mode's speed")


def trials_frame(sweep: Sweep, book: TrialBook, chosen: Selection | None = None) -> pd.DataFrame:
    """All trials, search first then re-runs, in the order they were created; a judged
    candidate's row also carries its verdict and quality on every seed."""
    judged = {c.trial_id: c for c in chosen.candidates} if chosen else {}
    rows = []
    for rec in book.trials.values():
        row = trial_row(sweep, book, rec)
        conf = judged.get(rec.trial_id)
        if conf is not None:
            row.update(seed_columns(conf))
        if chosen is not None and chosen.base_id is not None:
            row[BASE_CONFIG] = rec.trial_id == chosen.base_id
        rows.append(row)
    frame = pd.DataFrame(rows)
    for col in ("stop_step", "steps"):
        if col in frame:
            frame[col] = frame[col].astype("Int64")
    return frame


def seed_columns(conf: Confirmation) -> dict[str, Any]:
    """A candidate's verdict and per-seed quality, as trials.csv and pareto.csv show them."""
    metric = conf.quality.metric
    row: dict[str, Any] = {SELECTION: conf.verdict, SELECTION_REASON: conf.fragile_reason
                           or "", f"{metric}_mean": conf.mean, f"{metric}_worst": conf.worst,
                           f"{metric}_shared_mean": conf.shared_mean,
                           f"{metric}_spread": _finite_or_none(conf.spread)}
    row.update({seed_column(metric, seed): value for seed, value in conf.by_seed.items()})
    return row


#: A text cell starting with one of these is a formula to a spreadsheet.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value: Any) -> Any:
    """``value`` with a leading ``'`` when it is text a spreadsheet would run as a formula
    (an error message or a knob value from a trainer); numbers, and text that reads as a
    number such as ``-0.5``, are untouched.

    Example:
        >>> safe_cell("=HYPERLINK(1)"), safe_cell("-0.5"), safe_cell(-3), safe_cell("ok")
        ("'=HYPERLINK(1)", '-0.5', -3, 'ok')
    """
    if not isinstance(value, str) or not value.startswith(FORMULA_STARTS):
        return value
    try:
        float(value)
        return value
    except ValueError:
        return "'" + value


def cell_text(value: Any) -> Any:
    """The text :func:`safe_cell` was given, for a cell read back from a CSV file."""
    if isinstance(value, str) and value[:1] == "'" and value[1:].startswith(FORMULA_STARTS):
        return value[1:]
    return value


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    """Write ``frame`` atomically, its header and text cells made safe for spreadsheets
    (:func:`safe_cell`: a metric name is a header cell, and as much the trainer's text as
    an error message; :func:`cell_text` reads either back)."""
    text_columns = frame.select_dtypes(include=["object", "string"]).columns
    frame = frame.copy()
    for column in text_columns:
        frame[column] = frame[column].map(safe_cell)
    frame.columns = [safe_cell(c) for c in frame.columns]
    write_text(path, frame.to_csv(index=False))


def write_histories(folder: Path, book: TrialBook) -> None:
    """Each trial's metric history as trials/<id>.csv, and its traceback as <id>.error.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    for rec in book.trials.values():
        if rec.history:
            write_csv(folder / f"{rec.trial_id}.csv", pd.DataFrame(rec.history))
        if rec.error:
            write_text(folder / f"{rec.trial_id}.error.txt", rec.error)


def _finite_or_none(x: float | None) -> float | str | None:
    if x is None:
        return None
    return x if math.isfinite(x) else str(x)


def _confirmation_text(sweep: Sweep, conf: Confirmation) -> str:
    if conf.planned == 0:
        text = "UNCONFIRMED (confirm.seeds: 0): ran on its search seed only"
    else:
        spread = "-" if conf.spread is None else f"{conf.spread:.1%}"
        text = (f"stable on {conf.seeds_passed}/{conf.planned} extra seeds {conf.seeds}, "
                f"worst seed {spread} from the best (tolerance {conf.tolerance:.0%})")
    if conf.probe_planned:
        text += f"; LR x{sweep.spec.confirm.lr_probe:g} probe: {conf.probe_status or 'not run'}"
        if conf.lr_sensitivity is not None and math.isfinite(conf.lr_sensitivity):
            text += f" (LR sensitivity {conf.lr_sensitivity:+.3g})"
        text += f"; margin {conf.margin}"
        if conf.narrow and conf.planned > sweep.spec.confirm.seeds:
            text += (f": held on {conf.planned} fresh seeds instead of "
                     f"{sweep.spec.confirm.seeds} (confirm.narrow_seeds)")
    return text


def _quality_text(conf: Confirmation) -> str:
    search = "" if not conf.searched else " (search)" if conf.search.status == OK else \
        f" (search, {conf.search.status} at step {conf.search.stop_step or '?'}: not counted)"
    seeds = ", ".join(f"{s}{search if s == conf.search.seed else ''}: "
                      + ("-" if v is None else f"{v:.4g}") for s, v in conf.by_seed.items())
    mean = "-" if conf.mean is None else f"{conf.mean:.4g}"
    worst = "-" if conf.worst is None else f"{conf.worst:.4g}"
    shared = "" if conf.shared_mean is None else (
        f" ({conf.shared_mean:.4g} on fresh seeds {', '.join(map(str, conf.shared_seeds))}, "
        "which every handed-over config ran: the rank compares these)")
    return (f"{seeds}; mean over fresh seeds {mean}{shared}, worst seed {worst} (of every "
            "seed counted)")


#: Share of reports clipped past which a hand-over's header says the clip sets the step.
CLIPPED_THROUGHOUT = 0.9


def clipped_throughout(rec: TrialRecord) -> str | None:
    """Said of a config whose search run was clipped on at least :data:`CLIPPED_THROUGHOUT`
    of the reports that carry ``clipped``: the clip, not the LR, set its step size (a
    loss summed over a batch of 512 rather than averaged gave grad norms 80-780 against
    a clip of 5 on every step), so the config holds at that clip and that gradient scale
    only. None otherwise."""
    flags = finite_values(rec.history, "clipped", 0, len(rec.history))
    clipped = sum(f > 0 for f in flags)
    if len(flags) < 10 or clipped < CLIPPED_THROUGHOUT * len(flags):
        return None
    clip = rec.values.get("grad_clip")
    norms = sorted(finite_values(rec.history, "grad_norm", 0, len(rec.history)))
    ratio = ""
    if norms and isinstance(clip, (int, float)) and clip > 0:
        ratio = f", its median grad norm {norms[len(norms) // 2] / clip:.3g}x grad_clip {clip:g}"
    return (f"clipped on {clipped / len(flags):.0%} of its steps{ratio}: the clip, not the "
            "LR, sets the step size; a loss summed over the batch rather than averaged "
            "gives this, and the config then holds at this clip only")


def provenance(sweep: Sweep, chosen: Selection, rank: int, conf: Confirmation,
               rec: TrialRecord, values: list[float | None]) -> dict[str, Any]:
    """The YAML header of one handed-over config."""
    metric = conf.quality.metric
    kind = "confirmed" if conf.confirmed else "UNCONFIRMED"
    out: dict[str, Any] = {
        "rank": f"{rank} of {len(chosen.handed_over)} {kind} configs, by mean {metric} over "
                + ("the fresh seeds every one of them ran" if conf.shared_mean is not None
                   else "fresh seeds"),
        "trial": f"{rec.trial_id} (search seed {rec.seed})" if conf.searched else
                 f"{rec.trial_id} (your base config's own values: off the search space, "
                 "run on the fresh seeds only)",
        f"{metric} by seed": _quality_text(conf),
        "search objectives" if conf.searched else f"objectives on seed {rec.seed}":
            {o.metric: v for o, v in zip(sweep.objectives, values, strict=True)},
        "knobs": dict(rec.values),
        "confirmation": _confirmation_text(sweep, conf),
    }
    if any(o.metric == "instability" for o in sweep.objectives):
        out["instability is"] = ("log10 of the search run's largest grad-norm jump over "
                                 "its running median, +0.1 per loss spike: 0.3 or less is "
                                 "steady, 1 a tenfold jump the run came through")
    base = chosen.base
    if base is not None and base.mean is not None:
        out["base config"] = base.summary()
        tie = chosen.base_tie() if rank == 1 else None
        if tie:
            out["base config"] += f"; {tie.removeprefix(f'the top config ({rec.trial_id}) ')}"
    elif base is not None and (unjudged := base.not_compared()):
        out["base config"] = unjudged
    if rec.values.get("grad_clip") == 0:
        out["NOTE"] = ("grad_clip 0 means no clipping: a script that calls "
                       "clip_grad_norm_(params, 0) scales every gradient to zero; skip the "
                       "clip at 0")
    clipping = clipped_throughout(rec)
    if clipping:
        out["clipping"] = clipping
    line = chosen.base_line() if rank == 1 else None
    if line:  # "your base config: held and nothing beat it: …"
        out["your base config"] = line.removeprefix("your base config ")
    warnings = [chosen.base_warning() if rank == 1 else None]
    if any(w.startswith(LR_STILL_WARMING) for w in rec.warnings):
        warnings.append("its LR was still rising (or had never risen) at the end of its "
                        "search run, under half the sampled lr: the warmup never ended "
                        "(trials.csv's warnings say by how much); check that your scheduler "
                        "steps once per step (Lightning: \"interval\": \"step\")")
    if any(w.startswith(LOSS_OFF_SCALE) for w in rec.warnings):
        warnings.append("its training loss stayed many times the random guess from its "
                        "warmup to its end on the search seed (trials.csv's warnings say how "
                        "many): it is on another scale than the guess (summed over the "
                        "batch?), so the rules could not judge it against the guess; report "
                        "the mean over the batch, or set rules.baseline_loss to its own guess")
    if any(w.startswith(LOSS_AT_GUESS) for w in rec.warnings):
        declared = sweep.spec.rules.baseline_loss  # None: the guess came from the labels
        guess = "the labels' own guess" if declared is None else \
            f"rules.baseline_loss {declared:g}"
        warnings.append(f"its training loss sat at the random guess ({guess}) from its "
                        "warmup to its end on "
                        f"the search seed: by its loss it learnt nothing; its {metric} is "
                        "what the model scores barely trained (if the quality objective's "
                        "baseline is below what an untrained model scores, e.g. 1 / classes "
                        "for a probe on learnt features, raise it to that)")
    if any(warnings):
        out["WARNING"] = "; ".join(w for w in warnings if w)
    return out


def write_front(sweep: Sweep, book: TrialBook,
                chosen: Selection) -> tuple[pd.DataFrame, list[Path]]:
    """pareto.csv (every judged candidate, handed-over ones first in rank order) and stable/
    (the handed-over configs: confirmed, or unconfirmed when no seeds were planned)."""
    out = sweep.output_dir
    rows: list[dict[str, Any]] = []
    for conf in chosen.candidates:
        rec = book.trials[conf.trial_id]
        row: dict[str, Any] = {"rank": None, "trial_id": conf.trial_id,
                               "on_front": conf.on_front}
        row.update({k: rec.values.get(k) for k in sweep.space})
        values = book.objective_values(rec, sweep.objectives)
        row.update({o.metric: v for o, v in zip(sweep.objectives, values, strict=True)})
        row["objectives_seed"] = rec.seed  # the seed whose run the columns above are of
        row["objectives_steps"] = rec.last_step  # fewer than the fresh seeds' when ASHA cut it
        row.update(seed_columns(conf))
        row.update({"seeds_passed": conf.seeds_passed, "seeds_run": len(conf.seeds),
                    "seeds_planned": conf.planned,
                    "seed_failures": "; ".join(conf.seed_reasons),
                    "lr_probe": conf.probe_status or "",
                    "lr_probe_reason": conf.probe_reason or "",
                    "lr_sensitivity": _finite_or_none(conf.lr_sensitivity),
                    "lr_margin": conf.margin if conf.probe_planned else "",
                    "confirmed": conf.confirmed, "yaml": ""})
        rows.append(row)

    paths: list[Path] = []

    def fill(tmp: Path) -> None:
        for rank, (conf, row) in enumerate(zip(chosen.handed_over, rows, strict=False),
                                           start=1):
            rec = book.trials[conf.trial_id]
            name = f"rank-{rank:02d}-{rec.trial_id}{suffix(sweep)}"
            write_config(tmp / name, sweep, rec.values, provenance(
                sweep, chosen, rank, conf, rec, book.objective_values(rec, sweep.objectives)))
            row["rank"], row["yaml"] = rank, f"stable/{name}"
            paths.append(out / "stable" / name)

    replace_dir(out / "stable", fill)
    frame = pd.DataFrame(rows)
    if len(frame):
        frame["rank"] = frame["rank"].astype("Int64")
    write_csv(out / "pareto.csv", frame)
    return frame, paths
