"""``sweeps try``: one trial in this process, no Ray, metrics printed as they come."""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Sequence
from typing import Any

import yaml
from rich.console import Console

from sweeps.errors import SpecError
from sweeps.protocol import (
    COMPILE_KEY,
    FINAL_KEY,
    REASON_KEY,
    RESULT_PREFIX,
    SEED_KEY,
    TRACEBACK_KEY,
)
from sweeps.rules.ended_ok import warnings_of
from sweeps.spec.config_paths import get_path, leaf_paths
from sweeps.spec.loader import HYDRA_MISSING, RESERVED_KEY, Sweep
from sweeps.spec.space import Categorical, Fixed, IntRange, LogUniform, Uniform, central_value
from sweeps.terminal import console as make_console
from sweeps.terminal import flagged
from sweeps.trial.compile import compile_mode, eager_fallback
from sweeps.trial.reporter import TrialReporter
from sweeps.trial.run import prepare_process, run_trainer


def parse_sets(pairs: Sequence[str]) -> dict[str, Any]:
    """``--set KNOB=VALUE`` pairs as values (YAML, and ``1e-5`` a number)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SpecError(f"--set {pair}", "not of the form knob=value", "write e.g. lr=1e-3")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:  # not YAML (a control character, a stray colon): the text
            value = raw
        if isinstance(value, str):  # YAML 1.1 reads 1e-5 (no dot) as text: a number is meant
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(f"--set {key.strip()}", f"{raw} is no finite number",
                            f"give a finite value, e.g. {key.strip()}=1e-3")
        out[key.strip()] = value
    return out


def try_values(sweep: Sweep, sets: dict[str, Any]) -> dict[str, Any]:
    """Knob values for a try: ``--set`` ones, else the base config's, else the range middle.
    A Hydra config group's option set (``optim=sgd``) brings its own file's values for the
    knobs not set, as ``python app.py optim=sgd`` would."""
    values = _try_values(sweep, sets)
    if not sweep.groups or not any(values[k] != sweep.base_value(k) for k in sweep.grouped):
        return values
    composed = sweep.base_for(values)
    given = {k for k in sets if k in sweep.space} | \
        {k for k, p in sweep.spec.write_back.items() if p in sets}
    for name, knob in sweep.space.items():
        if name in given or name in sweep.grouped or isinstance(knob, Fixed) or \
                name not in sweep.spec.write_back:
            continue
        own = get_path(composed, sweep.spec.write_back[name], None)
        if own is not None and own != HYDRA_MISSING:
            values[name] = own
    return values


def _try_values(sweep: Sweep, sets: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, knob in sweep.space.items():
        current = sweep.base_value(name)
        values[name] = knob.value if isinstance(knob, Fixed) else \
            current if current is not None else central_value(knob)
    knob_at = {path: knob for knob, path in sweep.spec.write_back.items() if knob in sweep.space}
    for key, value in sets.items():
        if key.split(".")[0] == RESERVED_KEY and key not in sweep.space:
            raise SpecError(f"--set {key}", f"'{RESERVED_KEY}' is reserved: sweeps fills it "
                            "with the trial's own seed, step count and device",
                            "use --seed S and --steps N (the device is the machine's)")
        if key in sweep.space:
            check_knob_value(sweep, key, value)
            values[key] = value
        elif key in knob_at:  # a knob's own path (opt.lr): the knob, or it would overwrite it
            check_knob_value(sweep, knob_at[key], value)
            values[knob_at[key]] = value
        elif key not in sweep.write_back_paths.values() and "." not in key and (
                near := difflib.get_close_matches(key, list(sweep.space), n=1)):
            # a knob's typo (lrr): a top-level key of that name would tune nothing
            raise SpecError(f"--set {key}", "is neither a knob nor a config path",
                            f"did you mean {near[0]}={_shown(value)}?")
        else:
            _check_config_value(sweep, key, value)
    return values


def _shown(value: Any) -> str:
    return "null" if value is None else str(value)


def new_path_notes(sweep: Sweep, sets: dict[str, Any]) -> list[str]:
    """A note per ``--set`` config path the base config lacks: it is added (a trainer may
    read it with a default), and a typo would set a key the trainer never reads."""
    notes = []
    for path, value in sets.items():
        if path in sweep.space or path in sweep.write_back_paths.values() \
                or not sweep.base_config or get_path(sweep.base_config, path, None) is not None:
            continue
        near = difflib.get_close_matches(path, leaf_paths(sweep.base_config), n=1,
                                         cutoff=0.8)
        top = "" if "." in path else \
            f" as a top-level key, not a knob (the knobs: {', '.join(sweep.space)})"
        notes.append(f"{path} is not in the base config: added for this try{top}"
                     + (f" (did you mean {near[0]}={_shown(value)}?)" if near else ""))
    return notes


def check_knob_value(sweep: Sweep, name: str, value: Any, flag: str = "--set") -> None:
    """A value a knob can take (from ``--set``, or ``flag``): a number for a range (a whole
    one for an ``int`` knob; outside the range is allowed, to try it), one of a
    categorical's choices (any number, when they are numbers)."""
    knob = sweep.space[name]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(knob, (LogUniform, Uniform)) and not number:
        raise SpecError(f"{flag} {name}", f"{_shown(value)!r} is not a number, and {name} is a "
                        f"{knob.type} knob", f"give a number, e.g. {name}={central_value(knob)}")
    if isinstance(knob, IntRange) and not (number and float(value).is_integer()):
        raise SpecError(f"{flag} {name}", f"{_shown(value)!r} is not a whole number, and {name} "
                        "is an int knob", f"give a whole number, e.g. {name}="
                        f"{central_value(knob)}")
    numeric = all(isinstance(c, (int, float)) and not isinstance(c, bool)
                  for c in knob.choices) if isinstance(knob, Categorical) else False
    if isinstance(knob, Categorical) and value not in knob.choices and \
            not (numeric and number):  # a number among numbers: tried like a range's
        raise SpecError(f"{flag} {name}", f"{_shown(value)!r} is not one of {name}'s choices",
                        "use one of " + ", ".join(_shown(c) for c in knob.choices))


def _check_config_value(sweep: Sweep, path: str, value: Any) -> None:
    """A ``--set`` value for a config path of the same kind as the base config's there (a
    list for a list, a number for a number): a scalar where the trainer expects a list
    crashes it."""
    current = get_path(sweep.base_config, path, None)
    if current is None or value is None:
        return
    kinds = ((list, "a list, e.g. [0.9, 0.999]"), (dict, "a mapping, e.g. {a: 1}"))
    for kind, example in kinds:
        if isinstance(current, kind) and not isinstance(value, kind):
            raise SpecError(f"--set {path}", f"the base config holds {example.split(',')[0]} "
                            f"there ({current!r}), not {_shown(value)!r}",
                            f"give {example} (YAML flow syntax)")
    numeric = isinstance(current, (int, float)) and not isinstance(current, bool)
    if numeric and isinstance(value, str):
        raise SpecError(f"--set {path}", f"{value!r} is not a number, and the base config "
                        f"holds the number {current!r} there", f"give a number, e.g. "
                        f"{path}={current!r}")


def try_trial(sweep: Sweep, sets: dict[str, Any], *, steps: int | None = None,
              seed: int | None = None, every: int = 25,
              console: Console | None = None) -> TrialReporter:
    """Run one trial in-process and print its metrics and any verdict (metric names,
    values and errors come from the trainer: printed as text, cleaned)."""
    console = console or make_console()
    values = try_values(sweep, sets)
    notes = new_path_notes(sweep, sets)  # before the set paths join the base config
    extra = {k: v for k, v in sets.items() if k not in sweep.space}
    if steps is not None:
        sweep = _with_budget(sweep, steps)
    if extra:
        sweep = _with_base(sweep, extra)
    console.print("try: " + ", ".join(f"{k}={v}" for k, v in {**values, **extra}.items()))
    for note in notes:
        console.print(f"note: {note}")
    prepare_process(sweep, int(sweep.spec.resources.cpu), shared_cache=False)

    evidence: dict[str, Any] = {}
    tracebacks: list[str] = []

    def sink(result: dict[str, Any]) -> None:
        if result.get(COMPILE_KEY):
            evidence.update(json.loads(result[COMPILE_KEY]))
        if result.get(TRACEBACK_KEY):
            tracebacks.append(str(result[TRACEBACK_KEY]))
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
    for warning in reporter.warnings:
        console.print(flagged("warning", f" at step {warning['step']}: {warning['warning']}"))
    for text in tracebacks:  # the trainer raised: where, as Python tells it
        console.print(text.rstrip())
    if reporter.verdict is None:
        console.print(f"no rule fired over {len(reporter.history)} reports: stable")
        for warning in warnings_of(reporter.history, reporter.settings,
                                   sweep.objectives[0].metric):
            console.print(flagged("warning", f": {warning}"))
    elif reporter.verdict.reason != "bad_metric":  # the caller's error names the metric
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
    """Why the LR the trainer reports does not follow the sampled ``lr``, or None (also
    when a LR far below it still rose at the end: a warmup longer than the try).

    Example:
        >>> lr_not_followed(0.1, [{"lr": 1e-5}, {"lr": 1e-5}]) is not None
        True
        >>> lr_not_followed(0.1, [{"lr": 1e-5}, {"lr": 2e-5}]) is None
        True
    """
    from sweeps.record import objectives

    if not isinstance(sampled, (int, float)) or sampled <= 0:
        return None
    reported = objectives.series(history, "lr")
    if not reported or max(reported) <= 0:
        return None
    ratio = max(reported) / float(sampled)
    if 1 / LR_FOLLOW_FACTOR <= ratio <= LR_FOLLOW_FACTOR:
        return None
    if ratio < 1 and len(reported) > 1 and reported[-1] > reported[0] and \
            reported[-1] == max(reported):
        return None  # still warming up when the try ended: its peak is yet to come
    return (f"the optimizer's LR (peak {max(reported):.3g}) does not follow the sampled lr "
            f"{float(sampled):.3g}: the trainer does not read the lr knob's path")


def _with_budget(sweep: Sweep, steps: int) -> Sweep:
    from dataclasses import replace

    budget = sweep.spec.budget.model_copy(update={"max_steps": steps})
    return replace(sweep, spec=sweep.spec.model_copy(update={"budget": budget}))


def _with_base(sweep: Sweep, paths: dict[str, Any]) -> Sweep:
    from dataclasses import replace

    from sweeps.spec.config_paths import with_values

    groups = sweep.groups.mapped(lambda config: with_values(config, paths)) \
        if sweep.groups else None
    return replace(sweep, base_config=with_values(sweep.base_config, paths), groups=groups)
