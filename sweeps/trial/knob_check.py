"""Does the trainer read the knobs? Checked on the search trials as they end.

A ``write_back`` path the trainer never reads makes a sweep spend its budget on a knob
that does nothing; where the trials show it, the sweep stops after a few of them
(``sweeps run`` exits 2 naming the path):

- ``lr``: where the trainer reports ``lr`` (``sweeps.Monitor`` does), the reported peak
  LR scales with the sampled ``lr`` (a warmup or decay schedule scales it by the same
  factor in every trial). When trials whose sampled ``lr`` spans ten times or more all
  report the same peak, the knob does not reach the optimizer.
- ``warmup``: trials with a warmup above 0 whose reported LR never changed (a scheduler
  never stepped, or a warmup the trainer does not read).
- ``compile``: every trial records what torch compiled. When the trials labelled with a
  compiled mode all compiled no graph at all, the trainer never compiles (it does not
  read the compile knob's path, or never calls ``sweeps.compile_model``).

The same stop comes when the trainer never reports an objective's metric: two search
trials ran to their end without it (``bad_metric``) and none ever reported it, so every
further trial would too (``objectives.N.metric``, with the closest metric it did report);
and when a fresh-seed re-run repeats its search run's losses exactly (the trainer ignores
the trial's seed, :func:`seed_ignored`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sweeps.protocol import CRASH, SEARCH
from sweeps.record import objectives
from sweeps.record.book import TrialRecord
from sweeps.rules.settings import RuleSettings
from sweeps.trial.run import metric_hint, reported_metrics
from sweeps.trial.wiring import (
    WARMUP_NEVER_RAN_FIX,
    grad_norms_all_zero,
    warmup_never_ran,
    zero_norm_cause,
)

#: Sampled LRs must span at least this factor before the check can tell.
MIN_SPAN = 10.0
#: Reported peaks within this relative band count as "the same LR".
SAME_PEAK = 0.1
MIN_TRIALS = 3


def peaks(records: Iterable[TrialRecord]) -> list[tuple[float, float]]:
    """``(sampled lr, reported peak lr)`` of every finished search trial that has both and
    whose LR was not still rising when it ended (a trial stopped inside its warmup never
    reached its peak: OneCycleLR up to a fixed max_lr gave 0.00036 on a trial stopped at
    step 19 and 0.003 on every one that ran on)."""
    out = []
    for rec in records:
        sampled = rec.values.get("lr")
        reported = objectives.series(rec.history, "lr")
        if rec.role != SEARCH or not rec.finished or not reported or \
                not isinstance(sampled, (int, float)) or sampled <= 0 or max(reported) <= 0:
            continue
        if len(reported) > 1 and reported[-1] > reported[-2] * (1 + 1e-9):
            continue  # still rising: its peak is not the schedule's
        out.append((float(sampled) * rec.lr_scale, max(reported)))
    return out


def lr_ignored(records: Iterable[TrialRecord]) -> str | None:
    """Why the trainer's LR does not follow the ``lr`` knob, or None (see the module doc)."""
    pairs = peaks(records)
    if len(pairs) < MIN_TRIALS:
        return None
    sampled = [s for s, _ in pairs]
    reported = [r for _, r in pairs]
    if max(sampled) / min(sampled) < MIN_SPAN:
        return None
    if max(reported) > min(reported) * (1 + SAME_PEAK):
        return None
    return (f"{len(pairs)} search trials sampled lr from {min(sampled):.3g} to "
            f"{max(sampled):.3g}, and every one reported the same optimizer LR (peak "
            f"{max(reported):.3g}): the trainer does not read the lr knob's write_back path")


def warmup_ignored(records: Iterable[TrialRecord]) -> str | None:
    """Why the ``warmup`` knob does nothing, or None: :data:`MIN_TRIALS` finished search
    trials with warmup above 0 reported one LR all run long
    (:func:`~sweeps.trial.wiring.warmup_never_ran`), and no such trial's LR moved."""
    shown, moved = [], False
    for rec in records:
        if rec.role != SEARCH or not rec.finished or rec.status == CRASH:
            continue
        warmup = rec.values.get("warmup")
        why = warmup_never_ran(warmup, rec.history)
        if why:
            shown.append((warmup, why))
        elif isinstance(warmup, (int, float)) and warmup >= 2 and \
                len(set(objectives.series(rec.history, "lr"))) > 1:
            moved = True
    if moved or len(shown) < MIN_TRIALS:
        return None
    low, high = min(w for w, _ in shown), max(w for w, _ in shown)
    return (f"{len(shown)} search trials with warmup {low:g} to {high:g} each reported one "
            f"LR from their first step to their last (e.g. {shown[0][1]})")


def _compiled_labels(records: Iterable[TrialRecord]) -> list[TrialRecord]:
    """The finished (not crashed) search trials labelled with a compiled mode that sent
    their compile evidence."""
    from sweeps.trial.compile import compile_mode

    return [rec for rec in records
            if rec.role == SEARCH and rec.finished and rec.status != CRASH
            and rec.compile is not None
            and compile_mode(rec.values.get("compile", "none")) != "none"]


def compile_ignored(records: Iterable[TrialRecord]) -> str | None:
    """Why the trainer does not compile what the ``compile`` knob asks, or None: the first
    :data:`MIN_TRIALS` search trials labelled with a compiled mode that finished (not
    crashed) and sent their compile evidence all compiled no graph."""
    labelled = _compiled_labels(records)
    if len(labelled) < MIN_TRIALS or any(rec.compile.get("graphs") for rec in labelled):
        return None
    modes = sorted({str(rec.values["compile"]) for rec in labelled})
    said = f"{len(labelled)} search trials were labelled compile={'/'.join(modes)} and " \
        "not one compiled a graph"
    if any(rec.compile.get("calls") for rec in labelled):
        error = next((str(rec.compile["error"]) for rec in labelled
                      if rec.compile.get("error")), None)
        return (f"{said}, though the trainer called sweeps.compile_model with the mode: "
                "torch.compile traced nothing of the model"
                + (f" ({error})" if error else "") + "; torch._dynamo skips some modules "
                "(nn.GRU and nn.LSTM unless torch._dynamo.config.allow_rnn is set) and runs "
                "code it cannot trace eagerly, so the knob does nothing")
    return (f"{said}: the trainer does not read the compile knob's write_back path (or "
            "never calls sweeps.compile_model), so the knob does nothing")


@dataclass(frozen=True)
class InertKnob:
    """A searched knob the trials show the trainer ignores (or an objective it never
    reports: ``where`` names that key): why, and the fix."""

    knob: str
    why: str
    fix: str
    where: str | None = None

    @property
    def key(self) -> str:
        return self.where or f"write_back.{self.knob}"


#: Search trials that ended without an objective's metric before the sweep stops.
UNREPORTED_TRIALS = 2


def unmeasured_gradients(records: Iterable[TrialRecord]) -> InertKnob | None:
    """:data:`UNREPORTED_TRIALS` finished search trials whose grad norm was 0 on every
    report (at least :data:`~sweeps.trial.wiring.ZERO_REPORTS`), and none that measured
    one: ``Monitor.measure`` runs where there is no gradient, or the model is dead
    (:func:`~sweeps.trial.wiring.zero_norm_cause`), and every verdict about gradients (and
    the collapse and LR rules that read them) judges nothing."""
    done = [r for r in records if r.role == SEARCH and r.finished and r.status != CRASH
            and any("grad_norm" in h for h in r.history)]
    zero = [r for r in done if grad_norms_all_zero(r.history)]
    if len(zero) < UNREPORTED_TRIALS or len(zero) < len(done):
        return None
    problem, fix = zero_norm_cause([h for r in zero for h in r.history])
    return InertKnob("", f"{len(zero)} search trials: {problem}", fix, where="trainer")


#: Training losses a fresh-seed re-run must repeat exactly, step for step, before the
#: trainer is called deaf to its seed (two seeds agreeing to the last bit on one is chance).
SAME_SEED_LOSSES = 3


def seed_ignored(records: Iterable[TrialRecord]) -> InertKnob | None:
    """A candidate's re-run on a fresh seed (``confirm:<id>``) that reported the very same
    training losses as its search run on another seed, step for step: the trainer does not
    seed from ``config["sweep"]["seed"]`` (it takes a seed of its own config, or a fixed
    one), so every fresh seed repeats the search run and the race confirms nothing."""
    records = list(records)
    by_id = {r.trial_id: r for r in records}
    for rec in records:
        kind, _, owner = rec.role.partition(":")
        cand = by_id.get(owner) if kind == "confirm" and rec.finished else None
        if cand is None or cand.seed == rec.seed or not cand.finished:
            continue
        mine, theirs = _losses(rec.history), _losses(cand.history)
        if len(mine) >= SAME_SEED_LOSSES and mine == theirs[:len(mine)]:
            return InertKnob(
                "", f"trial {cand.trial_id} on seed {cand.seed} and its re-run on seed "
                f"{rec.seed} reported the very same losses on each of {len(mine)} steps: the "
                "trainer does not seed from the trial's seed, so every fresh seed repeats the "
                "search run and no config is confirmed on anything",
                "seed from config['sweep']['seed'] (torch.manual_seed(info['seed']), and your "
                "data order), not from a seed of your own config; a trainer meant to give "
                "one result whatever the seed: set confirm.seeds: 0", where="trainer")
    return None


def _losses(history: Sequence[dict]) -> list[tuple[int, float]]:
    """(step, loss) of every report that carries a training loss, in order."""
    return [(int(h.get("step", 0)), float(h["loss"])) for h in history
            if isinstance(h.get("loss"), (int, float)) and not isinstance(h.get("loss"), bool)]


def unreported_objective(records: Iterable[TrialRecord],
                         metrics: Sequence[str]) -> InertKnob | None:
    """An objective metric (of ``metrics``, the ones the trainer must report) that
    :data:`UNREPORTED_TRIALS` search trials ended without and no trial ever reported."""
    records = [r for r in records if r.role == SEARCH and r.finished]
    for index, metric in enumerate(metrics):
        if any(metric in h for r in records for h in r.history):
            continue
        ended = [r for r in records
                 if r.reason == "bad_metric" and r.evidence.get("metric") == metric]
        if len(ended) < UNREPORTED_TRIALS:
            continue
        seen = reported_metrics([h for r in records for h in r.history])
        hint = metric_hint(metric, seen, metrics)
        return InertKnob(metric, f"{len(ended)} search trials ran to their end and never "
                         f"reported {metric!r} (they reported: {', '.join(seen) or 'nothing'})",
                         f"{hint}Name a metric your trainer reports, or report "
                         f"{metric!r} from it", where=f"objectives.{index}.metric")
    return None


def inert_knob(records: Iterable[TrialRecord]) -> InertKnob | None:
    """The first searched knob the finished search trials show the trainer ignores."""
    records = list(records)
    why = lr_ignored(records)
    if why:
        return InertKnob("lr", why, "point write_back.lr at the key your trainer builds its "
                         "optimizer from (`sweeps try FILE --set lr=...` shows the LR it "
                         "reports)")
    why = warmup_ignored(records)
    if why:
        return InertKnob("warmup", why, WARMUP_NEVER_RAN_FIX)
    why = compile_ignored(records)
    if why:
        called = any(rec.compile.get("calls") for rec in _compiled_labels(records))
        fix = "drop the knob (`compile: none` in search_space), or make the model one " \
            "torch.compile can trace" if called else \
            "point write_back.compile at the key your trainer passes to " \
            "sweeps.compile_model(model, mode), or drop the knob: `compile: none` in " \
            "search_space"
        return InertKnob("compile", why, fix)
    return None


#: Finished search trials that must all start far above ``baseline_loss`` before it is
#: called wrong.
BASELINE_TRIALS = 3


def baseline_off(records: Iterable[TrialRecord], settings: RuleSettings) -> InertKnob | None:
    """:data:`BASELINE_TRIALS` finished search trials, every one of whose first loss was
    ``explosion_factor`` x ``baseline_loss`` or more: the baseline is not the loss of
    predicting at random (0.05 where it is 0.5), and the rules that judge against it
    (divergence's explosion, flat_at_baseline, collapse) misread every trial. A sweep
    where some configs start far off and others near it (raw inputs against normalised
    ones) is not called wrong."""
    baseline, factor = settings.baseline_loss, settings.explosion_factor
    if baseline is None or baseline <= 0 or factor is None:
        return None
    firsts = first_values(records, "loss")
    if len(firsts) < BASELINE_TRIALS or min(firsts) < factor * baseline:
        return None
    return InertKnob("", f"{len(firsts)} search trials started at a loss of "
                     f"{min(firsts):.3g} to {max(firsts):.3g}, {factor:g}x baseline_loss "
                     f"{baseline:g} or more, so divergence, flat_at_baseline and collapse "
                     "judge every trial against the wrong level",
                     "set rules.baseline_loss to the loss of predicting at random (ln of the "
                     "class count for cross-entropy, the target variance for MSE, pi/2 for "
                     "an angular loss); if it is that, the loss is on another scale (summed "
                     "over the batch, reduction='sum', is batch-size times the mean: report "
                     "the mean) or the model starts far off it (unnormalised inputs or "
                     "outputs): normalise them, or leave baseline_loss out",
                     where="rules.baseline_loss")


def first_values(records: Iterable[TrialRecord], key: str) -> list[float]:
    """The first finite ``key`` each finished search trial that did not crash reported."""
    return [v for r in records if r.role == SEARCH and r.finished and r.status != CRASH
            for v in [next((h[key] for h in r.history
                            if isinstance(h.get(key), (int, float))), None)]
            if v is not None and math.isfinite(v)]


def objective_baseline_off(records: Iterable[TrialRecord], objectives: Sequence[Any],
                           factor: float | None) -> InertKnob | None:
    """A ``min`` objective whose declared ``baseline`` is ``factor`` (``explosion_factor``)
    times below the first value :data:`BASELINE_TRIALS` finished search trials reported of
    it, every one: not its random guess (0.1 declared for a cross-entropy that starts at
    ln 10 = 2.3), so every gap measured against it (tolerance, poor, the floor below which
    a config learnt nothing) is off, and a config was handed over on it."""
    if factor is None:
        return None
    records = list(records)
    for index, obj in enumerate(objectives):
        baseline = getattr(obj, "baseline", None)
        if obj.mode != "min" or not isinstance(baseline, (int, float)) or baseline <= 0:
            continue
        firsts = first_values(records, obj.metric)
        if len(firsts) < BASELINE_TRIALS or min(firsts) < factor * baseline:
            continue
        return InertKnob("", f"{len(firsts)} search trials first reported {obj.metric} at "
                         f"{min(firsts):.3g} to {max(firsts):.3g}, {factor:g}x its baseline "
                         f"{baseline:g} or more: that is not what a random guess scores, and "
                         "every gap measured against it is off",
                         f"set objectives.{index}.baseline to what predicting at random "
                         "scores on it (ln of the class count for a cross-entropy, the target "
                         "variance for MSE), or leave it out (a loss takes "
                         "rules.baseline_loss); if it is that, the model starts far off it "
                         "(unnormalised inputs or targets)", where=f"objectives.{index}.baseline")
    return None


def sweep_problem(records: Iterable[TrialRecord], metrics: Sequence[str],
                  settings: RuleSettings | None = None,
                  objectives: Sequence[Any] = ()) -> InertKnob | None:
    """What the finished search trials show makes the sweep pointless, if anything: a
    knob the trainer ignores, an objective metric (of ``metrics``) it never reports, a
    gradient it never measures, a trainer deaf to its seed, or a ``baseline_loss`` (of
    ``settings``) or an objective's ``baseline`` (of ``objectives``) far below every
    trial's start. The search starts no more trials, and the run exits 2."""
    records = list(records)
    factor = settings.explosion_factor if settings is not None else None
    return inert_knob(records) or unreported_objective(records, metrics) or \
        unmeasured_gradients(records) or seed_ignored(records) or \
        (baseline_off(records, settings) if settings is not None else None) or \
        objective_baseline_off(records, objectives, factor)
