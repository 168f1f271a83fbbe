"""``sweeps try``: one trial in this process, no Ray, metrics printed as they come."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

from sweeps.errors import SpecError
from sweeps.protocol import COMPILE_KEY, FINAL_KEY, REASON_KEY, RESULT_PREFIX, SEED_KEY
from sweeps.spec.loader import Sweep
from sweeps.spec.space import Fixed, central_value
from sweeps.terminal import console as make_console
from sweeps.terminal import flagged
from sweeps.trial.compile import compile_mode, eager_fallback
from sweeps.trial.reporter import TrialReporter
from sweeps.trial.run import prepare_process, run_trainer


def try_values(sweep: Sweep, sets: dict[str, Any]) -> dict[str, Any]:
    """Knob values for a try: ``--set`` ones, else the base config's, else the range middle."""
    values: dict[str, Any] = {}
    for name, knob in sweep.space.items():
        current = sweep.base_value(name)
        values[name] = knob.value if isinstance(knob, Fixed) else \
            current if current is not None else central_value(knob)
    knob_at = {path: knob for knob, path in sweep.spec.write_back.items() if knob in sweep.space}
    for key, value in sets.items():
        if key in sweep.space:
            values[key] = value
        elif key in knob_at:  # a knob's own path (opt.lr): the knob, or it would overwrite it
            values[knob_at[key]] = value
        elif key not in sweep.spec.write_back.values() and "." not in key:
            raise SpecError(f"--set {key}", "is neither a knob nor a dotted config path",
                            f"use one of {', '.join(sweep.space)} or e.g. training.batch_size")
    return values


def try_trial(sweep: Sweep, sets: dict[str, Any], *, steps: int | None = None,
              seed: int | None = None, every: int = 25,
              console: Console | None = None) -> TrialReporter:
    """Run one trial in-process and print its metrics and any verdict (metric names,
    values and errors come from the trainer: printed as text, cleaned)."""
    console = console or make_console()
    values = try_values(sweep, sets)
    extra = {k: v for k, v in sets.items() if k not in sweep.space}
    if steps is not None:
        sweep = _with_budget(sweep, steps)
    if extra:
        sweep = _with_base(sweep, extra)
    console.print("try: " + ", ".join(f"{k}={v}" for k, v in {**values, **extra}.items()))
    prepare_process(sweep, int(sweep.spec.resources.cpu), shared_cache=False)

    evidence: dict[str, Any] = {}

    def sink(result: dict[str, Any]) -> None:
        if result.get(COMPILE_KEY):
            evidence.update(json.loads(result[COMPILE_KEY]))
        if result.get(FINAL_KEY):
            return
        step = result.get("step", 0)
        if step % max(1, every) == 0 or "val_loss" in result or REASON_KEY in result:
            shown = {k: v for k, v in result.items() if not k.startswith(RESULT_PREFIX)}
            console.print("  " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else
                                           f"{k}={v}" for k, v in shown.items()))

    seed = seed if seed is not None else sweep.spec.seed
    console.print(f"seed {seed}, {sweep.spec.budget.max_steps} steps")
    config = {**values, SEED_KEY: seed}
    reporter = run_trainer(sweep, config, "try", sink)
    unfollowed = lr_not_followed(values.get("lr"), reporter.history)
    if unfollowed:
        console.print(flagged("error", f": {unfollowed} (write_back.lr: "
                              f"'{sweep.spec.write_back.get('lr')}'); the sweep would tune "
                              "nothing"))
    if evidence.get("graphs") or compile_mode(values.get("compile")) != "none":
        console.print(compile_line(values.get("compile"), evidence))
    if reporter.verdict is None:
        console.print(f"no rule fired over {len(reporter.history)} reports: stable")
    else:
        console.print(flagged("stopped", f": {reporter.verdict.summary()}"))
    return reporter


def compile_line(mode: Any, ev: dict[str, Any]) -> str:
    """``compile: 1 graph(s), 0 recompile(s), …`` and, for a compiled label that ran
    eagerly, why."""
    line = (f"compile: {ev.get('graphs', 0)} graph(s), {ev.get('recompiles', 0)} "
            f"recompile(s), {ev.get('graph_breaks', 0)} graph break(s), cache "
            f"{ev.get('cache_hits', 0)} hit / {ev.get('cache_misses', 0)} miss")
    why = eager_fallback(compile_mode(mode), ev)
    return line + (f"; WARNING: labelled compile={mode} but ran eagerly: {why}" if why else "")


#: The optimizer's peak LR must lie within this factor of the sampled lr (a schedule's
#: warmup may not reach the peak in a short try; a LR that ignores the knob is far off).
LR_FOLLOW_FACTOR = 100.0


def lr_not_followed(sampled: Any, history: list[dict[str, Any]]) -> str | None:
    """Why the LR the trainer reports does not follow the sampled ``lr``, or None."""
    from sweeps.record import objectives

    if not isinstance(sampled, (int, float)) or sampled <= 0:
        return None
    reported = objectives.series(history, "lr")
    if not reported or max(reported) <= 0:
        return None
    ratio = max(reported) / float(sampled)
    if 1 / LR_FOLLOW_FACTOR <= ratio <= LR_FOLLOW_FACTOR:
        return None
    return (f"the optimizer's LR (peak {max(reported):.3g}) does not follow the sampled lr "
            f"{float(sampled):.3g}: the trainer does not read the lr knob's path")


def _with_budget(sweep: Sweep, steps: int) -> Sweep:
    from dataclasses import replace

    budget = sweep.spec.budget.model_copy(update={"max_steps": steps})
    return replace(sweep, spec=sweep.spec.model_copy(update={"budget": budget}))


def _with_base(sweep: Sweep, paths: dict[str, Any]) -> Sweep:
    from dataclasses import replace

    from sweeps.spec.config_paths import with_values

    return replace(sweep, base_config=with_values(sweep.base_config, paths))
