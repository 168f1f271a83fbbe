"""Running every preflight check for a sweep."""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Any

from sweeps.preflight.compile_check import check_modes, shared_compiles
from sweeps.preflight.findings import Finding
from sweeps.preflight.input_check import check_batch
from sweeps.preflight.schedule_check import check_curve, lr_curve
from sweeps.spec.loader import Sweep
from sweeps.spec.space import Categorical, Fixed, IntRange, LogUniform, Uniform, central_value
from sweeps.spec.trainer_loader import load_trainer, on_sys_path
from sweeps.trial.run import trial_settings

SCHEDULER_HOOK = "lr_scheduler"
BATCH_HOOK = "sample_batch"


def _hook(sweep: Sweep, target: str | None, name: str, key: str) -> Any:
    if target:
        return load_trainer(target, sweep.trainer_paths, key=key)
    module = importlib.import_module(sweep.spec.trainer.partition(":")[0])
    return getattr(module, name, None)


def _representative(sweep: Sweep) -> list[dict[str, Any]]:
    """Knob values to check hooks with: range middles; both ends and the middle of a
    searched lr (a schedule with an absolute floor or peak can climb past a low lr),
    each with both ends of a searched warmup."""
    values = {name: central_value(k) for name, k in sweep.space.items()}
    if "compile" in values:
        values["compile"] = "none"
    out = [values]
    lr = sweep.space.get("lr")
    if isinstance(lr, (LogUniform, Uniform)):
        out = [{**values, "lr": v} for v in (lr.low, values["lr"], lr.high)]
    warmup = sweep.space.get("warmup")
    if isinstance(warmup, (IntRange, Uniform, LogUniform)):  # steps, or a share of them
        out = [{**v, "warmup": w} for v in out for w in (warmup.low, warmup.high)]
    return out


def _compile(sweep: Sweep, findings: list[Finding]) -> Sweep:
    knob = sweep.space.get("compile")
    if knob is None:
        return sweep
    modes = list(knob.choices) if isinstance(knob, Categorical) else [knob.value]
    usable, found = check_modes([str(m) for m in modes], gpu_requested=sweep.spec.resources.gpu > 0,
                                timeout=sweep.spec.preflight.compile_timeout)
    findings.extend(found)
    findings.extend(shared_compiles(sweep.space, [str(m) for m in usable]))
    if usable == modes:
        return sweep
    if not usable:
        usable = ["none"]
    new = Fixed(type="fixed", value=usable[0]) if len(usable) == 1 else \
        Categorical(type="categorical", choices=usable)
    return replace(sweep, space={**sweep.space, "compile": new})


def _hook_failed(key: str, hook: str, exc: Exception) -> Finding:
    """The error finding of a preflight hook that raised on the trial's config."""
    return Finding("hooks", "error", f"{key}: {hook} raised {type(exc).__name__}: {exc}",
                   f"make it run on the trial's config (a {hook} of your own in the trainer "
                   f"module may call it with the arguments it needs, docs/preflight.md), or "
                   f"remove {key} from the sweep file")


def run_preflight(sweep: Sweep) -> tuple[Sweep, list[Finding]]:
    """All checks; returns the sweep to run (unusable compile modes dropped) and the findings.
    The trainer's folders are on ``sys.path`` while its hooks are imported and run (a hook
    may import the trainer's own modules when called), and only then."""
    with on_sys_path(sweep.trainer_paths):
        return _checks(sweep)


def _checks(sweep: Sweep) -> tuple[Sweep, list[Finding]]:
    findings: list[Finding] = []
    sweep = _compile(sweep, findings)
    steps = sweep.spec.budget.max_steps
    sched = _hook(sweep, sweep.spec.preflight.scheduler, SCHEDULER_HOOK, "preflight.scheduler")
    batch = _hook(sweep, sweep.spec.preflight.batch, BATCH_HOOK, "preflight.batch")
    for values in _representative(sweep):
        config = sweep.trial_config(values, trial_id="preflight", seed=sweep.spec.seed)
        label = _label(values)
        if sched is not None and "lr" in values:
            try:
                lrs = lr_curve(sched, config, float(values["lr"]), steps)
            except Exception as exc:  # noqa: BLE001 - the user's hook
                findings.append(_hook_failed("preflight.scheduler", SCHEDULER_HOOK, exc))
            else:
                if lrs is None:
                    findings.append(Finding(
                        "schedule", "info", "the LR schedule was not checked: "
                        "ReduceLROnPlateau follows a metric, which preflight does not train "
                        "to see (the rules judge the LR the trials report)"))
                    break
                findings.extend(check_curve(lrs, float(values["lr"]),
                                            trial_settings(sweep, values), label or "config"))
    checked = [v for v in _representative(sweep) if "lr" in v] if sched is not None else []
    if checked and not any(f.check in ("schedule", "hooks") for f in findings):
        findings.append(Finding("schedule", "info", f"the LR schedule is sane over "
                                f"{steps} steps at {len(checked)} knob settings: "
                                + "; ".join(_label(v) for v in checked)))
    if sched is None:
        findings.append(Finding("schedule", "info", "the LR schedule was not checked: the "
                                f"trainer module has no {SCHEDULER_HOOK}(config, optimizer)",
                                "add the hook (docs/preflight.md) to have it checked"))
    if batch is not None:
        config = sweep.trial_config(_representative(sweep)[0], trial_id="preflight",
                                    seed=sweep.spec.seed)
        try:
            sample = batch(config)
        except Exception as exc:  # noqa: BLE001 - the user's hook
            findings.append(_hook_failed("preflight.batch", BATCH_HOOK, exc))
        else:
            found = check_batch(sample, sweep.spec.preflight.input_limit)
            findings.extend(found or [Finding("inputs", "info", "every input feature is on a "
                                              "sane scale")])
    else:
        findings.append(Finding("inputs", "info", "the input scale was not checked: the "
                                f"trainer module has no {BATCH_HOOK}(config)",
                                "add the hook (docs/preflight.md) to have it checked"))
    return sweep, _dedupe(findings)


def _label(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in values.items() if k in ("lr", "warmup"))


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen, out = set(), []
    for f in findings:
        if (f.check, f.message) not in seen:
            seen.add((f.check, f.message))
            out.append(f)
    return out
