"""The LR schedule stepped through the whole budget, without training."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sweeps.preflight.findings import Finding
from sweeps.rules import lr_anomaly
from sweeps.rules.settings import RuleSettings

SchedulerHook = Callable[[dict, torch.optim.Optimizer], Any]

#: Relative slack before a schedule's peak counts as above the sampled LR.
PEAK_SLACK = 1e-6


def lr_curve(hook: SchedulerHook, config: dict[str, Any], lr: float,
             steps: int) -> list[float] | None:
    """The LR in the optimizer at each of ``steps`` optimizer steps (read before stepping);
    None for a schedule that follows a metric (``ReduceLROnPlateau``: no curve without
    training)."""
    param = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([param], lr=lr)
    scheduler = hook(config, optimizer)
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        return None
    lrs = []
    for _ in range(steps):
        lrs.append(float(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return lrs


def check_curve(lrs: list[float], lr: float, settings: RuleSettings,
                label: str) -> list[Finding]:
    """Findings for one LR curve: zero LR after warmup, unintended restarts, a peak above lr."""
    findings: list[Finding] = []
    history: list[dict[str, Any]] = []
    # the peak check below is climbs_past_lr's stricter form on a schedule built around lr
    settings = settings.model_copy(update={"sampled_lr": None})
    for step, value in enumerate(lrs, start=1):
        history.append({"step": step, "lr": value})
        verdict = lr_anomaly.check(history, settings)
        if verdict is not None:
            kind = verdict.evidence.get("kind", "lr_anomaly")
            fix = {"warm_restart": "step the scheduler once per optimizer step with a period of "
                   "max_steps (not per batch with a per-epoch period); if restarts are "
                   "intended, set rules.allow_lr_restarts: true",
                   "zero_lr": "check the scheduler's length and that the optimizer keeps an LR "
                   "when the scheduler is off"}.get(kind, "check the LR schedule")
            findings.append(Finding("schedule", "error", f"{label}: {kind} at step "
                                    f"{verdict.step} ({verdict.summary()})", fix,
                                    {"config": label, **verdict.to_dict()}))
            break
    peak = max(lrs) if lrs else 0.0
    if peak > lr * (1 + PEAK_SLACK):
        findings.append(Finding(
            "schedule", "error", f"{label}: the schedule peaks at {peak:.4g}, above the "
            f"sampled LR {lr:.4g}, so the lr knob does not set the LR the trial trains with",
            "make the schedule's peak the config's lr (e.g. OneCycleLR max_lr = lr)",
            {"config": label, "peak": peak, "lr": lr}))
    return findings
