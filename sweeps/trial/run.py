"""The Ray Tune function trainable that runs one trial of a user's trainer."""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Sequence
from typing import Any

from sweeps.errors import Terminated
from sweeps.protocol import (
    COMPILE_KEY,
    CRASH,
    FINAL_KEY,
    FLAT_PATIENCE_KEY,
    GPU_PEAK_KEY,
    LR_SCALE_KEY,
    OK,
    ROLE_KEY,
    RUN_KEY,
    SEED_KEY,
    STATUS_KEY,
    TRACEBACK_KEY,
    probe_role,
)
from sweeps.rules.settings import RuleSettings
from sweeps.rules.verdict import Verdict
from sweeps.spec.loader import Sweep
from sweeps.spec.space import fixed_values, warmup_steps
from sweeps.spec.trainer_loader import add_search_paths, load_trainer
from sweeps.state.layout import INDUCTOR_CACHE
from sweeps.trial import gpu
from sweeps.trial.compile import compile_evidence, reset_compiler
from sweeps.trial.failures import (
    TrainerExit,
    classify,
    error_line,
    exit_verdict,
    format_exception,
    process_exit_raises,
)
from sweeps.trial.reporter import TrialHeld, TrialReporter, TrialStopped, unstable_fields


def flat_config(config: dict[str, Any]) -> dict[str, Any]:
    """A trial's config with a re-run's ``_run`` entry lifted up (re-runs are handed over
    so by the searcher and :func:`sweeps.tune.experiments.run_configs`)."""
    run = config.get(RUN_KEY)
    if isinstance(run, dict):
        return {**{k: v for k, v in config.items() if k != RUN_KEY}, **run}
    return dict(config)


def is_probe(config: dict[str, Any]) -> bool:
    """Whether a (flat) trial config is a candidate's LR probe: it asks only whether the
    config is stable at ``lr × confirm.lr_probe``, so it holds once the rules could tell."""
    return str(config.get(ROLE_KEY, "")).startswith(probe_role(""))


def trial_values(sweep: Sweep, config: dict[str, Any]) -> dict[str, Any]:
    """Knob values of one trial: the sampled ones plus the fixed ones."""
    values = fixed_values(sweep.space)
    values.update({k: v for k, v in config.items() if k in sweep.space})
    scale = config.get(LR_SCALE_KEY)
    if scale and "lr" in values:
        values["lr"] = float(values["lr"]) * float(scale)
    return values


def trial_settings(sweep: Sweep, values: dict[str, Any],
                   flat_patience: int | None = None) -> RuleSettings:
    """Rule settings for one trial, from its knob values (``trial_values``: the lr
    already times the LR probe's scale).

    The warmup knob (steps, or a share of them below 1: :func:`~sweeps.spec.space.warmup_steps`)
    says when warmup ends: lr_anomaly does not judge a zero LR during
    warmup, and collapse does not judge predictions before warmup has ended (a model may
    start collapsed and recover). The lr knob is the ``sampled_lr`` lr_anomaly's
    climbs_past_lr compares the optimizer's LR with. ``flat_patience`` (a fresh-seed
    re-run's, :data:`~sweeps.protocol.FLAT_PATIENCE_KEY`) lengthens flat_at_baseline's.
    The quality objective's declared ``baseline`` lets flat_at_baseline see a model that
    learns while its loss sits at the random guess (``quality_*``).
    """
    rules = sweep.spec.rules
    update: dict[str, Any] = {}
    warmup = warmup_steps(values.get("warmup"), sweep.spec.budget.max_steps)
    if warmup is not None:
        update.update(warmup_steps=warmup,
                      collapse_min_step=max(rules.collapse_min_step, warmup))
    lr = values.get("lr")
    if isinstance(lr, (int, float)) and not isinstance(lr, bool) and 0 < lr < math.inf:
        update["sampled_lr"] = float(lr)
    quality = sweep.objectives[0] if sweep.objectives else None
    if quality is not None and quality.baseline is not None and quality.metric != "loss":
        update.update(quality_metric=quality.metric, quality_mode=quality.mode,
                      quality_baseline=float(quality.baseline))
    if flat_patience is not None and flat_patience > rules.flat_patience:
        update["flat_patience"] = int(flat_patience)
    return rules.model_copy(update=update) if update else rules


def prepare_process(sweep: Sweep, threads: int, *, shared_cache: bool = True) -> None:
    """Per-process setup for running trials: the trainer's folders on ``sys.path``, torch
    threads and, with ``shared_cache``, the compile cache the sweep's trials share in its
    results folder (``sweeps try`` keeps torch's own: it must leave nothing in a results
    folder that ``sweeps run`` would refuse)."""
    import torch

    add_search_paths(sweep.trainer_paths)

    torch.set_num_threads(max(1, threads))
    if shared_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(sweep.output_dir / INDUCTOR_CACHE)


def run_trainer(sweep: Sweep, config: dict[str, Any], trial_id: str, sink,
                checkpoint_sink=None, checkpoint_path: str | None = None,
                gpu_ids: list[Any] | None = None, *, observe: bool = False,
                max_steps: int | None = None, hold: bool = False) -> TrialReporter:
    """Run the user's trainer once with a judging ``report``; never raises for trainer errors.

    The last result handed to ``sink`` always carries the trial's outcome
    (``sweeps/status`` and, for failures, reason, stop step and evidence). The trial starts
    from a clean compiler state (a reused worker keeps nothing of earlier trials but the
    on-disk compile cache), and a result carries ``sweeps/compile`` (the compile evidence,
    JSON) whenever that evidence changed since the previous one.

    ``gpu_ids`` are the GPUs Ray assigned to the trial: the trainer finds them, and the
    device to use (``cuda:0`` or ``cpu``, see :func:`sweeps.trial.gpu.trial_device`), in the
    config's ``sweep`` section. With CUDA present every result carries the trial's peak GPU
    memory (``sweeps/gpu_peak_mb``), counted from the trial's start.

    The one runner of a trial: Ray Tune's trainable, ``sweeps try`` and ``sweeps audit``
    call it. ``observe``: the rules only watch (``sweeps audit``: the first verdict is in
    the result that carries it, the run goes on); ``max_steps``: another step budget;
    ``hold``: the run asks only whether it is stable (an LR probe) and ends ``ok`` once
    the rules' windows closed with no verdict (:mod:`sweeps.trial.horizon`).
    """
    reset_compiler()
    gpu.reset_peak()
    sink, checkpoint_sink = _with_compile_evidence(sink, checkpoint_sink)
    values = trial_values(sweep, config)
    seed = int(config.get(SEED_KEY, sweep.spec.seed))
    trainer = load_trainer(sweep.spec.trainer, sweep.trainer_paths)
    required = trainer_metrics(sweep)
    steps = int(max_steps or sweep.spec.budget.max_steps)
    settings = trial_settings(sweep, values, config.get(FLAT_PATIENCE_KEY))
    reporter = TrialReporter(settings, sink, observe=observe,
                             checkpoint_sink=checkpoint_sink, required=required,
                             hold_max_steps=steps if hold and not observe else None)
    trial_config = sweep.trial_config(values, trial_id=trial_id, seed=seed,
                                      max_steps=max_steps)
    trial_config["sweep"]["checkpoint"] = checkpoint_path
    gpu_ids = list(gpu_ids or [])
    trial_config["sweep"].update(gpu_ids=gpu_ids, device=gpu.trial_device(
        gpu_ids, gpu_requested=sweep.spec.resources.gpu > 0))
    try:
        with process_exit_raises():
            trainer(trial_config, reporter)
    except TrialHeld:  # stable through every window: no quality is asked of it
        sink({**reporter.history[-1], STATUS_KEY: OK, FINAL_KEY: 1})
        return reporter
    except TrialStopped:
        return reporter
    except (SystemExit, TrainerExit) as exc:
        if reporter.ended_by_sink or isinstance(exc, Terminated):
            raise  # Ray Tune ending a trial it stopped, from inside report; or SIGTERM
        return _crashed(reporter, sink, exit_verdict(exc, _last_step(reporter)))
    except Exception as exc:  # noqa: BLE001 - every trainer error becomes a trial outcome
        reason, error = classify(exc), error_line(exc)
        verdict = Verdict(reason, _last_step(reporter),
                          {"error": gpu.with_peak(error) if reason == "oom" else error})
        return _crashed(reporter, sink, verdict, format_exception(exc))
    if reporter.verdict is not None and not reporter.observe:
        return reporter  # a rule fired and the trainer (or its framework) ended quietly
    if not reporter.history:
        return _crashed(reporter, sink, Verdict("crash", 0, {
            "error": "the trainer returned without calling report"}))
    missing = [m for m in required if not any(m in h for h in reporter.history)]
    if missing:
        return _crashed(reporter, sink, Verdict("bad_metric", _last_step(reporter), {
            "metric": missing[0],
            "error": "; ".join(unreported(missing[0], reporter.history, required))}))
    sink({**reporter.history[-1], STATUS_KEY: OK, FINAL_KEY: 1})
    return reporter


def unreported(metric: str, history: list[dict[str, Any]],
               others: Sequence[str] = ()) -> tuple[str, str]:
    """Why a trial that never reported objective ``metric`` ended (what it did report),
    and the fix (the closest of those, :func:`metric_hint`; ``others``: the sweep's other
    objectives)."""
    seen = reported_metrics(history)
    return (f"the trainer never reported {metric!r}, an objective of the sweep (it reported: "
            f"{', '.join(seen) or 'nothing'})",
            f"{metric_hint(metric, seen, others)}Report it, or name a reported metric in "
            "objectives")


#: Metrics sweeps' own Monitor and callbacks report: never the objective a user meant.
MONITOR_METRICS = frozenset({
    "grad_norm", "nonfinite_grads", "dead_params", "frozen_params", "zeroed_grads",
    "grads_absent", "clipped",
    "clipped_before_measure", "lr", "step_time", "compile_s", "pred_std", "target_std",
    "label_entropy", "label_majority"})
#: A metric measured on held-out data, by its name (``val_loss``, ``eval/acc``, ``test_mse``).
HELD_OUT = re.compile(r"(val|valid|validation|eval|evaluation|test|dev|holdout)[_/.\-]",
                      re.IGNORECASE)


def metric_hint(metric: str, seen: Sequence[str], others: Sequence[str] = ()) -> str:
    """``did you mean 'X'? `` for the reported metric closest to ``metric``, leaving out
    sweeps' own (:data:`MONITOR_METRICS`) and the sweep's ``others`` objectives; for a
    held-out metric only held-out ones (a training loss in its place would tune for the
    training data), and when there is none, that no held-out metric was reported.

    Example:
        >>> metric_hint("val_loss", ["loss", "lr", "val/mse", "val_r2"], ["val_r2"])
        "did you mean 'val/mse'? "
        >>> metric_hint("val_loss", ["val_acc", "val_mse", "loss"])
        "did you mean one of 'val_mse', 'val_acc'? "
        >>> metric_hint("val_loss", ["grad_norm", "loss", "train_loss"])[:50]
        'no held-out metric was reported (only loss, train_'
    """
    pool = [m for m in seen if m not in MONITOR_METRICS and m not in others and m != metric]
    held_out = HELD_OUT.match(metric) is not None
    if held_out:
        kept = [m for m in pool if HELD_OUT.match(m)]
        if not kept:
            return (f"no held-out metric was reported (only {', '.join(pool) or 'nothing'}, "
                    "from the training data: tuning on it would fit the training set); is "
                    "the validation run, and its value passed to report? ")
        near = difflib.get_close_matches(metric, kept, n=len(kept), cutoff=0.0)
        if len(near) > 1:
            return f"did you mean one of {', '.join(map(repr, near))}? "
    else:
        near = difflib.get_close_matches(metric, pool, n=1, cutoff=0.5)
    return f"did you mean {near[0]!r}? " if near else ""


def reported_metrics(history: list[dict[str, Any]]) -> list[str]:
    """The numeric metrics a history's reports carried (not ``step``), sorted."""
    return sorted({k for h in history for k, v in h.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"})


#: Objective metrics sweeps measures itself rather than reading from reports.
MEASURED_METRICS = frozenset({"instability", "step_time"})


def trainer_metrics(sweep: Sweep) -> tuple[str, ...]:
    """The objective metrics the trainer itself must report."""
    return tuple(o.metric for o in sweep.objectives if o.metric not in MEASURED_METRICS)


def _last_step(reporter: TrialReporter) -> int:
    return int(reporter.history[-1]["step"]) if reporter.history else 0


def _crashed(reporter: TrialReporter, sink, verdict: Verdict,
             traceback: str | None = None) -> TrialReporter:
    """End the trial as ``crash`` with ``verdict``: the final result repeats the last report."""
    reporter.verdict = verdict
    extra = {TRACEBACK_KEY: traceback} if traceback else {}
    sink({**(reporter.history[-1] if reporter.history else {"step": 0}), FINAL_KEY: 1,
          **unstable_fields(verdict, status=CRASH), **extra})
    return reporter


def _with_compile_evidence(sink, checkpoint_sink):
    """``sink`` and ``checkpoint_sink`` adding the compile evidence to a result when it
    changed (compilation happens in the first steps, so a few results carry it) and always
    to the final one, and the peak GPU memory so far to every result when CUDA is present."""
    import json

    sent: list[str] = [""]

    def add(result: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps(compile_evidence(), sort_keys=True)
        if text != sent[0] or result.get(FINAL_KEY):
            sent[0] = text
            result = {**result, COMPILE_KEY: text}
        peak = gpu.peak_mb()
        return result if peak is None else {**result, GPU_PEAK_KEY: peak}

    def with_evidence(result: dict[str, Any]) -> None:
        sink(add(result))

    def checkpoint_with_evidence(result: dict[str, Any], state: Any) -> None:
        checkpoint_sink(add(result), state)

    return with_evidence, (checkpoint_with_evidence if checkpoint_sink else None)
