"""Shared helpers of the bench/ scripts: machine info, results files, tables, baselines.

Not a test module: every script in bench/ prints a markdown table and writes
``bench/results/<script>.json`` with the raw figures.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: Where each script writes ``<name>.json`` (``BENCH_RESULTS`` to move it).
RESULTS = Path(os.environ.get("BENCH_RESULTS", ROOT / "bench" / "results"))
#: Sweep outputs and Ray Tune experiment folders of the benchmarks go here, not into the repo.
SCRATCH = Path(os.environ.get("BENCH_SCRATCH", "/tmp/sweeps-bench"))

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def machine() -> dict[str, Any]:
    """nproc, CPU model, RAM, load and library versions."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    versions = {}
    for name in ("ray", "optuna", "torch", "mlflow"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001
            versions[name] = None
    return {"nproc": os.cpu_count(), "cpu": cpu, "ram_gb": ram_gb,
            "loadavg": os.getloadavg(), "python": platform.python_version(),
            "platform": platform.platform(), **versions}


def save(name: str, payload: dict[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` (NaN/inf as strings)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"script": name, "argv": sys.argv, "when": time.strftime("%Y-%m-%d %H:%M:%S"),
               "machine": machine(), **payload}
    path.write_text(json.dumps(_plain(payload), indent=1, default=str))
    return path


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def table(rows: Sequence[Mapping[str, Any]], floatfmt: str = ".3g") -> str:
    from tabulate import tabulate

    return tabulate([dict(r) for r in rows], headers="keys", tablefmt="github",
                    floatfmt=floatfmt, missingval="–")


def median(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def spread(xs: Sequence[float]) -> str:
    xs = [x for x in xs if x is not None]
    return f"{min(xs):.4g}–{max(xs):.4g}" if xs else "–"


def first_verdict(history: Sequence[Mapping[str, Any]], settings) -> Any:
    """The first verdict ``sweeps.rules.evaluate`` gives over the prefixes of ``history``
    (what the in-trial judge would have said on each report), or None."""
    from sweeps import rules

    for i in range(1, len(history) + 1):
        verdict = rules.evaluate(history[:i], settings)
        if verdict is not None:
            return verdict
    return None


class Collector:
    """A Ray Tune callback keeping each trial's results and the order trials ended in."""

    def __new__(cls, *args, **kwargs):  # build the real subclass lazily (ray import)
        from ray.tune import Callback

        class _Collector(Callback):
            def __init__(self) -> None:
                self.history: dict[str, list[dict[str, Any]]] = {}
                self.config: dict[str, dict[str, Any]] = {}
                self.order: list[str] = []
                self.end: dict[str, float] = {}
                self.start: dict[str, float] = {}
                self.errors: set[str] = set()

            def on_trial_start(self, iteration, trials, trial, **info):
                self.start.setdefault(trial.trial_id, time.perf_counter())

            def on_trial_result(self, iteration, trials, trial, result, **info):
                self.history.setdefault(trial.trial_id, []).append(
                    {k: v for k, v in result.items() if k != "config"})
                self.config[trial.trial_id] = dict(trial.config)

            def _end(self, trial):
                if trial.trial_id not in self.end:
                    self.order.append(trial.trial_id)
                    self.end[trial.trial_id] = time.perf_counter()
                    self.config[trial.trial_id] = dict(trial.config)

            def on_trial_complete(self, iteration, trials, trial, **info):
                self._end(trial)

            def on_trial_error(self, iteration, trials, trial, **info):
                self.errors.add(trial.trial_id)
                self._end(trial)

        return _Collector()


def tune_report_adapter(metric: str = "val_loss") -> Callable[[dict[str, Any]], None]:
    """What a user writes to call a ``train(config, report)`` trainer from Ray Tune.

    Ray's OptunaSearch reads ``result[metric]`` on every result (KeyError otherwise),
    so the adapter carries the newest value of ``metric`` forward (the training loss
    before the first evaluation); ``metric_fresh`` = 1 marks the reports that held it.
    """
    from ray import tune

    last: dict[str, float] = {}

    def report(metrics: dict[str, Any]) -> None:
        out = {k: (float(v) if hasattr(v, "item") else v) for k, v in metrics.items()}
        if metric in out:
            last[metric] = out[metric]
            out["metric_fresh"] = 1
        else:
            out[metric] = last.get(metric, out.get("loss", float("nan")))
            out["metric_fresh"] = 0
        tune.report(out)

    return report


def trainer_history(results: Sequence[Mapping[str, Any]],
                    metric: str = "val_loss") -> list[dict[str, Any]]:
    """A plain Ray Tune trial's results back as the trainer's reports (carried metric out)."""
    out = []
    for r in results:
        m = dict(r)
        if m.pop("metric_fresh", 1) == 0:
            m.pop(metric, None)
        out.append(m)
    return out


def plain_asha(sweep):
    """The ASHA a plain Ray Tune baseline gets: sweeps' own settings (max_t, grace,
    reduction factor 3) on the sweep's first objective, counted in reports."""
    from ray.tune.schedulers import ASHAScheduler

    budget, first = sweep.spec.budget, sweep.objectives[0]
    return ASHAScheduler(metric=first.metric, mode=first.mode, time_attr="training_iteration",
                         max_t=budget.max_steps, grace_period=budget.asha_grace,
                         reduction_factor=3)


def tune_space(sweep) -> dict[str, Any]:
    """The sweep's search space as Ray Tune sample functions (for random search)."""
    from ray import tune

    from sweeps.spec import space as sp

    out: dict[str, Any] = {}
    for name, knob in sweep.space.items():
        if knob.is_fixed():
            continue
        kind = knob.type
        if kind == "loguniform":
            out[name] = tune.loguniform(knob.low, knob.high)
        elif kind == "uniform":
            out[name] = tune.uniform(knob.low, knob.high)
        elif kind == "int":
            step = getattr(knob, "step", 1) or 1
            if getattr(knob, "log", False):
                out[name] = tune.lograndint(knob.low, knob.high + 1)
            else:
                out[name] = tune.qrandint(knob.low, knob.high, step)
        elif kind == "categorical":
            out[name] = tune.choice(list(knob.choices))
        else:
            raise ValueError(f"no tune equivalent for {name}: {knob}")
    assert set(out) == set(sp.optuna_space(sweep.space)), (out, sweep.space)
    return out
