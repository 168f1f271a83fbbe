"""``sweeps audit DIR``: were the rules right to stop those trials?

A finished sweep's stopped search trials (status ``unstable``; with ``--pruned``
also the ones ASHA cut) are re-run in this process, without Ray, to the full
budget on their own seed and knob values, with the rules only watching
(:class:`sweeps.trial.reporter.TrialReporter` with ``observe=True``): the trainer is
never stopped, and the first verdict the rules would have given is recorded.
Each re-run is then judged on how it really ended:

* ``recovered``: finite, and its final quality (the sweep's first objective) is
  within ``margin`` of the best ``ok`` search trial's, measured with
  :func:`sweeps.record.objectives.quality_gap` (a share of the best's improvement over
  the quality objective's ``baseline``, default ``rules.baseline_loss``): a false alarm;
* ``failed``: it went non-finite, crashed, ended no better than the random-guess
  baseline (within ``rules.flat_tolerance`` x the baseline of it, or on its wrong side:
  the quality objective against its ``baseline``, or, for a ``max`` objective without
  one, the training loss against ``rules.baseline_loss``), or ended worse than it
  started;
* ``poor``: learning and finite, but outside the margin.

Per rule, precision is the share of the audited stops that did not recover
(1 - recovered / audited); the strict share is failed / audited. Results go to
``DIR/audit.csv``, ``DIR/audit.md`` and ``DIR/audit/<trial_id>.csv`` (each
re-run's history).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeps.errors import SpecError
from sweeps.protocol import CRASH, OK, PRUNED, SEARCH, UNSTABLE
from sweeps.record.objectives import gap_scale, metric_value, quality_gap, series
from sweeps.rules._history import finite_num, newest_finite
from sweeps.rules.flat_at_baseline import label_guess
from sweeps.rules.settings import RuleSettings
from sweeps.state import saved_sweep
from sweeps.state import seal as state_seal
from sweeps.state.atomic import replace_dir, write_text
from sweeps.terminal import echo as echo_clean

if TYPE_CHECKING:
    import pandas as pd

    from sweeps.spec.loader import Sweep

DEFAULT_SAMPLE = 10
DEFAULT_MARGIN = 0.10
OUTCOMES = ("recovered", "poor", "failed")
#: The ``reason`` an ASHA-stopped (pruned) trial without a diagnosis is audited under: the
#: scheduler's cut for trailing quality, not a verdict of the rules (so it has no precision).
#: A pruned trial the rules diagnosed is audited under ``pruned · <rule>``, a verdict.
#: Metrics whose non-finite value makes a re-run ``failed`` (not ``grad_norm``: fp16 AMP
#: skips steps with overflowing gradients on purpose).
FINITE_KEYS = ("loss", "val_loss")
_SAFE_ID = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass
class Rerun:
    """One stopped trial re-run to full length, and how it ended."""

    trial_id: str
    reason: str
    stop_step: int | None
    values: dict[str, Any]
    seed: int
    history: list[dict[str, Any]] = field(default_factory=list)
    status: str = OK                  # ok | crash
    verdict_reason: str = ""            # the first verdict the rules gave in the re-run
    verdict_step: int | None = None
    error: str = ""                     # a crash's traceback
    quality: float | None = None
    gap: float | None = None
    outcome: str = ""
    why: str = ""
    held_until: int | None = None       # the last step the stop's condition still held

    @property
    def steps(self) -> int:
        return int(self.history[-1]["step"]) if self.history else 0


@dataclass
class AuditResult:
    """What ``run_audit`` did: the re-runs, the per-rule table and the files."""

    reruns: list[Rerun]
    rows: pd.DataFrame
    rules: pd.DataFrame
    metric: str
    mode: str
    best: float | None
    best_from: str
    steps: int
    files: list[Path]
    notes: list[str]


# ---------------------------------------------------------------- choosing trials


def read_trials(folder: Path) -> pd.DataFrame:
    """trials.csv with ids and categorical knob values kept as text (only empty cells
    are missing, so a choice spelt ``none`` or ``NA`` stays what it was)."""
    import pandas as pd

    try:
        frame = pd.read_csv(folder / "trials.csv", dtype={"trial_id": str},
                            keep_default_na=False, na_values=[""])
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as exc:
        raise SpecError("DIR/trials.csv", f"{folder / 'trials.csv'} is not a readable CSV "
                        f"({exc})", "give the results folder of a finished sweep") from exc
    missing = [c for c in ("trial_id", "status") if c not in frame]
    if missing:
        raise SpecError("DIR/trials.csv", f"{folder / 'trials.csv'} has no column "
                        f"{', '.join(missing)}", "give the results folder of a finished sweep")
    for col, default in (("role", SEARCH), ("reason", ""), ("status", "")):
        frame[col] = frame[col].fillna(default).astype(str) if col in frame else default
    return frame


def stopped_trials(trials: pd.DataFrame, pruned: bool = False) -> pd.DataFrame:
    """The search trials a rule stopped (and, with ``pruned``, those ASHA stopped), with
    ``reason`` set to ``pruned · <rule>`` (or ``pruned``) for the latter; in trials.csv order."""
    statuses = (UNSTABLE, PRUNED) if pruned else (UNSTABLE,)
    out = trials[(trials["role"] == SEARCH) & trials["status"].isin(statuses)].copy()
    diagnoses = out["diagnosis"] if "diagnosis" in out else [""] * len(out)
    out["reason"] = [_pruned_reason(d) if s == PRUNED else (r or UNSTABLE)
                     for s, r, d in zip(out["status"], out["reason"], diagnoses, strict=True)]
    return out


def _pruned_reason(diagnosis: Any) -> str:
    """``pruned · collapse`` for a pruned trial the rules diagnosed, else ``pruned``."""
    text = diagnosis if isinstance(diagnosis, str) else ""
    rule = text.split(" ", 1)[0] if text.strip() else ""
    return f"{PRUNED} · {rule}" if rule else PRUNED


def pick(stopped: pd.DataFrame, n: int) -> pd.DataFrame:
    """At most ``n`` trials, round-robin over the reasons so that every reason is
    represented; the most common reason goes first (ties: by name), trials of a reason
    in trials.csv order. Deterministic."""
    counts = stopped["reason"].value_counts()
    order = sorted(counts.index, key=lambda r: (-int(counts[r]), str(r)))
    queues = [list(stopped.index[stopped["reason"] == r]) for r in order]
    chosen: list[Any] = []
    while len(chosen) < n and any(queues):
        for queue in queues:
            if queue and len(chosen) < n:
                chosen.append(queue.pop(0))
    return stopped.loc[chosen]


def knob_values(sweep: Sweep, row: Mapping[str, Any]) -> dict[str, Any]:
    """The trial's knob values as the search gave them, from its row in trials.csv."""
    from sweeps.results.files import cell_text
    from sweeps.spec.space import Categorical, Fixed, IntRange

    values: dict[str, Any] = {}
    for name, knob in sweep.space.items():
        if knob.is_fixed():
            continue  # trial_values adds the fixed ones
        raw = row.get(name)
        missing = raw is None or (isinstance(raw, float) and math.isnan(raw))
        if isinstance(knob, Categorical):
            if missing and None in knob.choices:
                values[name] = None
                continue
            match = [c for c in knob.choices if c is not None and
                     (c == raw or str(c) in (str(raw), cell_text(raw)) or
                      _same_number(c, raw))]
            if match:
                values[name] = match[0]
                continue
        elif not missing and not isinstance(knob, Fixed):
            try:
                number = float(raw)
            except (TypeError, ValueError):
                pass
            else:
                values[name] = int(round(number)) if isinstance(knob, IntRange) else number
                continue
        raise SpecError(f"DIR/trials.csv: trial {row.get('trial_id')}",
                        f"column {name!r} holds {raw!r}, not a value of the knob {name}",
                        "audit the results folder the sweep wrote, with its own sweep.yaml")
    return values


def _same_number(a: Any, b: Any) -> bool:
    try:
        return not isinstance(a, bool) and float(a) == float(b)
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------- re-running


def rerun(sweep: Sweep, run: Rerun, steps: int) -> Rerun:
    """Run the trainer once to ``steps`` with the rules only observing, from a clean compiler
    state (the re-runs share one process); a trainer exception ends the re-run as ``crash``."""
    import json

    from sweeps.protocol import (
        EVIDENCE_KEY,
        REASON_KEY,
        SEED_KEY,
        STATUS_KEY,
        STOP_STEP_KEY,
        TRACEBACK_KEY,
    )
    from sweeps.trial.run import run_trainer

    observed: list[dict[str, Any]] = []  # the result carrying the first verdict, the last one

    def sink(result: dict[str, Any]) -> None:
        if result.get(REASON_KEY) and result.get(STATUS_KEY) != CRASH and not observed:
            observed.append(result)
        final.clear()
        final.update(result)

    final: dict[str, Any] = {}
    reporter = run_trainer(sweep, {**run.values, SEED_KEY: run.seed}, run.trial_id, sink,
                           gpu_ids=None, observe=True, max_steps=steps)
    if final.get(STATUS_KEY) == CRASH:
        evidence = json.loads(final.get(EVIDENCE_KEY) or "{}")
        error = evidence.get("error")
        run.status = CRASH
        run.why = f"{final[REASON_KEY]}: {error}" if error else str(final[REASON_KEY])
        run.error = final.get(TRACEBACK_KEY)
    run.history = reporter.history
    if observed:
        run.verdict_reason = observed[0][REASON_KEY]
        run.verdict_step = int(observed[0].get(STOP_STEP_KEY, observed[0]["step"]))
    return run


def random_guesses(sweep: Sweep, history: Sequence[Mapping[str, Any]]
                   ) -> list[tuple[str, str, float]]:
    """``(metric, mode, random guess)`` a re-run's end is judged against, first first: the
    quality objective (its ``baseline``, else ``rules.baseline_loss`` for a ``min`` one),
    the other objectives with a declared ``baseline``, then the training loss
    (``rules.baseline_loss``). The guess the re-run's class labels show replaces a
    declared one where it is nearer the truth, as the rules take it
    (:func:`~sweeps.rules.flat_at_baseline.label_guess`): ``label_entropy`` for the loss
    and a ``min`` objective with no ``baseline`` of its own, ``label_majority`` for an
    accuracy's baseline in [0, 1] below it."""
    loss = label_guess(history, RuleSettings(baseline_loss=sweep.spec.rules.baseline_loss)
                       ).baseline_loss
    out: list[tuple[str, str, float]] = []
    for i, objective in enumerate(sweep.objectives):
        guess = objective.baseline
        if guess is None and i == 0 and objective.mode == "min":
            guess = loss
        if guess is not None and objective.mode == "max":
            guess = label_guess(history, RuleSettings(
                quality_metric=objective.metric, quality_mode="max",
                quality_baseline=guess)).quality_baseline
        if guess is not None:
            out.append((objective.metric, objective.mode, guess))
    if loss is not None:
        out.append(("loss", "min", loss))
    return out


def judge(run: Rerun, metric: str, mode: str, best: float | None,
          baseline: float | None, tolerance: float, margin: float,
          loss_baseline: float | None = None,
          guesses: Sequence[tuple[str, str, float]] | None = None) -> Rerun:
    """Set the re-run's quality, gap, outcome and why (see the module docstring).

    ``baseline`` is the quality metric's random-guess value (gaps are shares of the
    improvement over it; "ended at the random guess" is judged on the metric against it,
    an accuracy within ``tolerance`` x |baseline| above it); ``loss_baseline`` the
    training loss's, judged instead for a metric with no ``baseline``. ``guesses``
    (:func:`random_guesses`) replaces both for that judgement: the first of them the
    re-run reported is judged."""
    hist = run.history
    run.quality = metric_value(hist, metric) if hist else None
    reported = [h[metric] for h in hist if isinstance(h.get(metric), float)]
    if reported and _non_finite(reported[-1]):
        run.quality = reported[-1]  # it ended non-finite: not its last finite value
    run.gap = None
    if best is not None and run.quality is not None and math.isfinite(run.quality):
        run.gap = quality_gap(run.quality, best, mode, baseline)
    if run.status == CRASH:
        run.outcome, run.why = "failed", run.why or "crash"
        return run
    for key in dict.fromkeys((*FINITE_KEYS, metric)):
        bad = next((h for h in hist if _non_finite(h.get(key))), None)
        if bad is not None:
            run.outcome = "failed"
            run.why = f"{key} went non-finite ({bad[key]}) at step {bad['step']}"
            return run
    if run.quality is None or not math.isfinite(run.quality):
        run.outcome, run.why = "failed", f"never reported a finite {metric}"
        return run
    if guesses is None:  # the metric against its random guess, else the training loss
        guesses = [(metric, mode, baseline)] if baseline is not None else \
            [("loss", "min", loss_baseline)] if loss_baseline is not None else []
    judged, value, guess, higher_better = metric, None, None, False
    for name, way, level in guesses:
        value = run.quality if name == metric else (series(hist, name) or [None])[-1]
        if value is not None:
            judged, guess, higher_better = name, level, way == "max"
            break
    at_guess = guess is not None and value is not None and (
        value <= guess + tolerance * abs(guess) if higher_better
        else no_better_than_guess(value, guess, tolerance))
    if at_guess:
        run.outcome = "failed"
        run.why = (f"ended at {judged} {value:.4g}, no better than the random-guess "
                   f"{guess:.4g} (band {tolerance:g} x baseline)")
        return run
    worse = _worse_than_start(hist, metric, mode)
    if worse:
        run.outcome, run.why = "failed", worse
        return run
    if run.gap is None:
        run.outcome, run.why = "poor", "no reference quality to compare with"
    elif run.gap <= margin:
        run.outcome = "recovered"
        run.why = (f"{metric} {run.quality:.4g} within {margin:.0%} of the best {best:.4g}"
                   f"{_of_what(best, mode, baseline)}")
    else:
        run.outcome = "poor"
        run.why = (f"{metric} {run.quality:.4g} is {run.gap:.0%} worse than the best "
                   f"{best:.4g}{_of_what(best, mode, baseline)}")
    return run


def _of_what(best: float, mode: str, baseline: float | None) -> str:
    """What a quality gap is a share of, when it is the best's improvement over the random
    guess (:func:`sweeps.record.objectives.gap_scale`)."""
    if baseline is None or abs(baseline - best) != gap_scale(best, mode, baseline):
        return ""
    return f" (a share of its improvement over the random guess {baseline:.4g})"


def held_until(run: Rerun, settings: RuleSettings) -> int | None:
    """The last step of the re-run through which the condition its stop named held,
    unbroken from the stop on: ``collapse``, every report's spread ratio below
    ``collapse_ratio``; ``flat_at_baseline``, the training loss's (else ``val_loss``'s)
    running mean over ``smoothing`` reports within ``flat_tolerance`` x
    ``baseline_loss`` of the random guess or above it (the labels' own guess where nearer,
    :func:`~sweeps.rules.flat_at_baseline.label_guess`); ``divergence``, the running mean
    of the training loss kept at least half its climb (above halfway from the lowest
    running mean before the stop, or the first loss, to the running mean at the stop).
    None for the other reasons, or when the re-run has nothing to show it. A stop whose
    run ended poor was still right about the state it named when that held for most of
    the run; a loss that exploded at step 2 and trained on to a fair loss was not.

    Example:
        >>> run = Rerun("t", "collapse", 2, {}, 0, history=[
        ...     {"step": s, "pred_std": r, "target_std": 1.0}
        ...     for s, r in enumerate([0.01, 0.01, 0.02, 0.05, 0.5, 0.01], start=1)])
        >>> held_until(run, RuleSettings())
        4
    """
    from sweeps.rules import collapse

    if run.stop_step is None:
        return None
    after = [h for h in run.history if int(h.get("step", 0)) >= run.stop_step]
    if run.reason == "collapse":
        marks = [(int(h["step"]), ratio < settings.collapse_ratio) for h in after
                 if (ratio := collapse.spread_ratio(h)) is not None]
    elif run.reason == "flat_at_baseline" and \
            (settings := label_guess(run.history, settings)).baseline_loss is not None:
        key = "loss" if any("loss" in h for h in run.history) else "val_loss"  # as the rule
        marks = [(step, no_better_than_guess(mean, settings.baseline_loss,
                                              settings.flat_tolerance))
                 for step, mean in _running(run.history, key, settings.smoothing)
                 if step >= run.stop_step]
    elif run.reason == "divergence":
        means = _running(run.history, "loss", settings.smoothing)
        before = [m for step, m in means if step < run.stop_step]
        after = [(step, m) for step, m in means if step >= run.stop_step]
        if not after:
            return None
        first = [next(v for h in run.history if (v := finite_num(h, "loss")) is not None)]
        floor = min([*before, *first, after[0][1]])
        half = floor + 0.5 * (after[0][1] - floor)
        marks = [(step, m >= half) for step, m in after]
    else:
        return None
    last = None
    for step, held in marks:
        if not held:
            break
        last = step
    return last


def _running(history: Sequence[Mapping[str, Any]], key: str, n: int
             ) -> list[tuple[int, float]]:
    """(step, mean of the newest ``n`` finite values of ``key`` up to it) per report."""
    out = []
    for i, h in enumerate(history):
        recent = newest_finite(history, key, 0, n, stop=i + 1)
        if recent:
            out.append((int(h["step"]), sum(recent) / len(recent)))
    return out


def no_better_than_guess(value: float, baseline: float, tolerance: float) -> bool:
    """Whether a loss is within ``tolerance`` x ``baseline`` of the random-guess
    ``baseline`` or above it: what the audit calls ending at the random guess."""
    return value >= baseline - tolerance * baseline


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _worse_than_start(hist: Sequence[Mapping[str, Any]], metric: str, mode: str) -> str:
    """Why the run ended worse than it started ('' if it did not): its quality metric's
    last value against its first (when reported at least twice), else the mean training
    loss of the last tenth of reports against the first tenth."""
    values = series(hist, metric)
    if len(values) >= 2:
        first, last = values[0], values[-1]
        if (last > first) if mode == "min" else (last < first):
            return f"ended worse than it started: {metric} {first:.4g} -> {last:.4g}"
        return ""
    losses = series(hist, "loss")
    if len(losses) >= 2:
        k = max(1, len(losses) // 10)
        first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
        if last > first:
            return f"ended worse than it started: mean loss {first:.4g} -> {last:.4g}"
    return ""


# ---------------------------------------------------------------- tables


def per_rule(rows: pd.DataFrame, stopped: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per reason: stopped in the search (when ``stopped`` is given), audited,
    recovered, poor, failed, precision (1 - recovered / audited) and failed share."""
    import pandas as pd

    out = []
    for reason in dict.fromkeys(rows["reason"]):
        part = rows[rows["reason"] == reason]
        n = len(part)
        counts = {o: int((part["outcome"] == o).sum()) for o in OUTCOMES}
        rec = {"rule": reason}
        if stopped is not None:
            rec["stopped"] = int((stopped["reason"] == reason).sum())
        verdict = n and reason != PRUNED  # ASHA's own cut is no verdict to be precise about
        rec.update({"audited": n, **counts,
                    "precision": 1 - counts["recovered"] / n if verdict else float("nan"),
                    "failed_share": counts["failed"] / n if n else float("nan"),
                    "state_held": _state_held(part)})
        out.append(rec)
    return pd.DataFrame(out)


def _state_held(part: pd.DataFrame) -> int | None:
    """How many of a rule's re-runs kept the state its stops named (``held_until``)
    through at least half of the rest of the run; None when the rule names no state."""
    if "held_until" not in part or not part["held_until"].notna().any():
        return None
    rest = part["steps"] - part["stop_step"]
    return int(((part["held_until"] - part["stop_step"]) >= rest / 2).fillna(False).sum())


def rule_line(rec: Mapping[str, Any]) -> str:
    """``flat_at_baseline: 5 audited, 4 failed, 1 poor, 0 recovered: precision 100 %``."""
    n = int(rec["audited"])
    of = f" of {int(rec['stopped'])}" if "stopped" in rec and int(rec["stopped"]) > n else ""
    head = (f"{rec['rule']}: {n}{of} audited, {int(rec['failed'])} failed, "
            f"{int(rec['poor'])} poor, {int(rec['recovered'])} recovered: ")
    if rec["rule"] == PRUNED:
        return head + "ASHA's cut for trailing quality, no verdict of the rules (no precision)"
    line = head + f"precision {percent(rec['precision'])}, strict {percent(rec['failed_share'])}"
    held = rec.get("state_held")
    if held is not None and not (isinstance(held, float) and math.isnan(held)):
        line += f"; the named state held through half the rest of the run in {int(held)} of {n}"
    return line


def percent(share: float | None) -> str:
    """A share as the audit prints it; ``-`` for none (ASHA's cuts have no precision).

    Example:
        >>> percent(0.666), percent(float("nan"))
        ('67 %', '-')
    """
    return "-" if share is None or math.isnan(share) else f"{100 * share:.0f} %"


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _md_table(frame: pd.DataFrame) -> str:
    def cell(v: Any) -> str:
        return _fmt(v).replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in rec) + " |"
            for rec in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def _rows(reruns: Sequence[Rerun], knobs: Sequence[str], metric: str) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame([{
        "trial_id": r.trial_id, "reason": r.reason, "stop_step": r.stop_step,
        **{k: r.values.get(k) for k in knobs}, "seed": r.seed, "steps": r.steps,
        "metric": metric, "quality": r.quality, "gap": r.gap, "outcome": r.outcome,
        "why": r.why, "held_until": r.held_until, "status": r.status,
        "rerun_reason": r.verdict_reason, "rerun_step": r.verdict_step} for r in reruns]).astype(
            {"stop_step": "Int64", "rerun_step": "Int64", "held_until": "Int64"})


def markdown(sweep_name: str, result: AuditResult, n_stopped: int, sample: int,
             margin: float, shown: pd.DataFrame) -> str:
    """audit.md: what was re-run, the definitions, the per-rule table and the rows."""
    table = result.rules.copy()
    table["precision"] = [percent(v) for v in table["precision"]]
    table["failed_share"] = [percent(v) for v in table["failed_share"]]
    ref = "none" if result.best is None else f"{result.best:.4g} ({result.best_from})"
    lines = [
        f"# Rule audit of sweep {sweep_name}", "",
        f"{len(result.reruns)} of the {n_stopped} stopped search trials (a sample of at most "
        f"{sample}, round-robin over the reasons) re-run in one process to {result.steps} "
        "steps on their own seed and knob values, with the rules only watching (never "
        "stopping the trainer).", "",
        f"Quality: {result.metric} ({result.mode}), its last reported value. Reference: the "
        f"best `ok` search trial, {ref}.", "",
        f"- **recovered**: finite, and within {margin:.0%} of the reference "
        "(`objectives.quality_gap`: a share of the reference's improvement over "
        "the objective's `baseline` (default `rules.baseline_loss`), else of its "
        "magnitude): a false alarm.",
        "- **failed**: went non-finite, crashed, ended no better than the random-guess "
        "baseline (within `rules.flat_tolerance` x the baseline of it, or on its wrong "
        "side: the objective against its `baseline`, or for a `max` objective without one "
        "the training loss against `rules.baseline_loss`), or ended worse than it started.",
        "- **poor**: learning and finite, but outside the margin.",
        "- **precision**: share of a rule's audited stops that did not recover "
        "(1 - recovered / audited); **failed_share**: the strict share that failed. "
        "`pruned · <rule>`: trials ASHA cut that the rules diagnosed (a verdict); "
        "`pruned`: trials ASHA cut for trailing quality with no diagnosis (no verdict, no "
        "precision).", "",
        *[f"Note: {n}" for n in result.notes], "" if result.notes else None,
        "## Per rule", "", _md_table(table), "",
        "## Re-runs", "",
        "`rerun_reason` / `rerun_step`: the first verdict the rules gave in the re-run. "
        "Histories: `audit/<trial_id>.csv`.", "",
        _md_table(shown), "",
    ]
    return "\n".join(line for line in lines if line is not None)


# ---------------------------------------------------------------- the command


def _can_write(folder: Path) -> None:
    """A SpecError naming DIR when the audit could not write its files into ``folder``
    (a read-only mount, another user's folder), found before the re-runs spend anything."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".audit-check-"):
            pass
    except OSError as exc:
        raise SpecError("DIR", f"{folder}: the audit cannot write its files there "
                        f"({exc.strerror})", "copy the folder somewhere you can write "
                        "(cp -a) and audit the copy (with --trust-state: a copy is another "
                        "folder)") from None


def run_audit(folder: Path, *, sample: int = DEFAULT_SAMPLE, steps: int | None = None,
              pruned: bool = False, margin: float = DEFAULT_MARGIN,
              echo: Callable[[str], None] = echo_clean,
              trust_state: bool = False) -> AuditResult | None:
    """Audit the stopped trials of the results folder ``folder`` (see the module
    docstring); None when there is nothing to audit (nothing is written then). The folder
    names the trainer to run, so it must be sealed by this account (``trust_state``:
    :mod:`sweeps.state.seal`)."""
    from sweeps.spec.trainer_loader import load_trainer
    from sweeps.trial.run import prepare_process

    folder = Path(folder)
    if sample < 1:
        raise SpecError("--sample", f"{sample} is below 1", "give e.g. --sample 10")
    if steps is not None and steps < 1:
        raise SpecError("--steps", f"{steps} is below 1", "give e.g. --steps 1000, or leave "
                        "it out for the sweep's budget.max_steps")
    if not margin >= 0:
        raise SpecError("--margin", f"{margin} is not >= 0", "give e.g. --margin 0.1 (10 %)")
    if not (folder / "trials.csv").is_file():
        raise SpecError("DIR", f"{folder} holds no finished sweep (no trials.csv)",
                        "give the results folder of a sweep, e.g. results/direction-demo")
    if not (folder / "sweep.yaml").is_file():
        raise SpecError("DIR", f"{folder} has a trials.csv but no sweep.yaml (the sweep as "
                        "it ran)", "give the results folder a sweep wrote, not a copy of "
                        "trials.csv alone")
    trials = read_trials(folder)
    stopped = stopped_trials(trials, pruned)
    chosen = pick(stopped, sample)
    if not len(chosen):
        kinds = "unstable or pruned" if pruned else "unstable"
        echo(f"nothing to audit: no search trial in {folder / 'trials.csv'} is {kinds}")
        return None
    state_seal.check(folder, trust=trust_state, command="audit")  # its trainer will run
    _can_write(folder)  # before any re-run: its files go there
    sweep = saved_sweep.read(folder)
    objective = sweep.objectives[0]
    metric, mode = objective.metric, objective.mode
    rules = sweep.spec.rules
    budget = steps or sweep.spec.budget.max_steps
    notes: list[str] = []
    if budget != sweep.spec.budget.max_steps:
        notes.append(f"re-runs go to {budget} steps, the search trials to "
                     f"{sweep.spec.budget.max_steps}: the reference quality is the search's")
    best, best_from = _reference(trials, metric, mode)
    runs = []
    for rec in chosen.to_dict(orient="records"):
        stop = rec.get("stop_step")
        if stop is None or (isinstance(stop, float) and math.isnan(stop)):
            stop = rec.get("steps")
        seed = rec.get("seed")
        runs.append(Rerun(
            str(rec["trial_id"]), str(rec["reason"]),
            None if stop is None or (isinstance(stop, float) and math.isnan(stop))
            else int(stop), knob_values(sweep, rec),
            sweep.spec.seed if seed is None or (isinstance(seed, float) and math.isnan(seed))
            else int(seed)))
    prepare_process(sweep, int(sweep.spec.resources.cpu))
    load_trainer(sweep.spec.trainer, sweep.trainer_paths)  # a trainer that does not import: exit 2
    echo(f"auditing {len(runs)} of {len(stopped)} stopped trial(s) of sweep '{sweep.name}': "
         f"each re-run to {budget} steps with the rules only watching")
    for i, run in enumerate(runs, start=1):
        rerun(sweep, run, budget)
        judge(run, metric, mode, best, sweep.quality_baseline, rules.flat_tolerance, margin,
              guesses=random_guesses(sweep, run.history))
        run.held_until = held_until(run, rules)
        pending = best is None and run.outcome != "failed"  # judged once every re-run is in
        echo(f"  {i}/{len(runs)} {run_line(run, metric, pending)}")
    if best is None:  # no ok search trial: the best re-run that did not fail is the reference
        good = [r.quality for r in runs if r.outcome != "failed" and r.quality is not None]
        if good:
            best = min(good) if mode == "min" else max(good)
            best_from = "no ok search trial: the best re-run"
            notes.append("no search trial finished ok; the best re-run is the reference")
            for run in runs:
                judge(run, metric, mode, best, sweep.quality_baseline, rules.flat_tolerance,
                      margin, guesses=random_guesses(sweep, run.history))
                echo(f"  judged against the best re-run: {run_line(run, metric)}")
    knobs = [k for k in sweep.space if not sweep.space[k].is_fixed()]
    rows = _rows(runs, knobs, metric)
    table = per_rule(rows, stopped)
    result = AuditResult(runs, rows, table, metric, mode, best, best_from, budget, [], notes)
    result.files = _write(folder, sweep.name, result, len(stopped), sample, margin)
    for rec in table.to_dict(orient="records"):
        echo(rule_line(rec))
    for note in notes:
        echo(f"note: {note}")
    echo("written: " + ", ".join(str(f) for f in result.files))
    return result


def run_line(run: Rerun, metric: str, pending: bool = False) -> str:
    """A re-run's line: what it ran and reached, and its outcome (``pending``: not yet,
    it is judged against the best re-run once every one is in)."""
    quality = "-" if run.quality is None else f"{run.quality:.4g}"
    ran = f"{run.trial_id} ({run.reason} @ {_fmt(run.stop_step)}): {run.steps} steps, " \
        f"{metric} {quality}"
    if pending:
        return f"{ran}: judged when every re-run is in (no search trial finished ok to " \
            "compare with)"
    held = ""
    if run.held_until is not None:
        state = {"collapse": "collapsed", "divergence": "the loss kept half its climb"
                 }.get(run.reason, "in the random-guess band")
        held = (f"; {state} through step {run.held_until} of {run.steps}"
                if run.held_until < run.steps else f"; {state} to the end")
    return f"{ran}: {run.outcome} ({run.why}{held})"


def _reference(trials: pd.DataFrame, metric: str, mode: str) -> tuple[float | None, str]:
    """The best quality among the ok search trials, and which trial had it."""
    import pandas as pd

    col = f"objective_{metric}"
    ok = trials[(trials["role"] == SEARCH) & (trials["status"] == OK)]
    if col not in ok or not len(ok):
        return None, ""
    values = pd.to_numeric(ok[col], errors="coerce")
    values = values[values.map(lambda v: math.isfinite(v) if pd.notna(v) else False)]
    if not len(values):
        return None, ""
    idx = values.idxmin() if mode == "min" else values.idxmax()
    return float(values[idx]), f"trial {ok.loc[idx, 'trial_id']}"


def _write(folder: Path, name: str, result: AuditResult, n_stopped: int, sample: int,
           margin: float) -> list[Path]:
    """audit/<id>.csv (swapped in whole), audit.csv and audit.md, each atomically."""
    import pandas as pd

    from sweeps.results.files import write_csv

    def fill(tmp: Path) -> None:
        for run in result.reruns:
            if not _SAFE_ID.fullmatch(run.trial_id):
                continue
            if run.history:  # numbers, under metric names: a header made safe too
                write_csv(tmp / f"{run.trial_id}.csv", pd.DataFrame(run.history))
            if run.error:
                write_text(tmp / f"{run.trial_id}.error.txt", run.error)

    replace_dir(folder / "audit", fill)
    write_csv(folder / "audit.csv", result.rows)
    shown = result.rows.drop(columns=["metric"]).rename(columns={"quality": result.metric})
    shown["gap"] = ["" if pd.isna(g) else f"{100 * g:+.1f} %" for g in shown["gap"]]
    write_text(folder / "audit.md", markdown(name, result, n_stopped, sample, margin, shown))
    return [folder / "audit.csv", folder / "audit.md", folder / "audit"]
