"""MLflow tracking, written by the driver only (a sqlite file never sees two writers).

One parent run per sweep and one child run per trial, with the knobs as
params, every reported step as metrics, and tags for status, failure reason,
stop step, role and Pareto rank.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from sweeps.book import TrialBook, TrialRecord
from sweeps.spec import Sweep

_BATCH = 900  # MLflow takes at most 1000 metrics per log_batch call


def tracking_uri(sweep: Sweep, uri: str | None = None) -> str:
    """``uri``, else ``MLFLOW_TRACKING_URI``, else ``results/<name>/mlflow.db``."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or \
        f"sqlite:///{Path(sweep.output_dir) / 'mlflow.db'}"


def log_sweep(sweep: Sweep, book: TrialBook, selection_tags: dict[str, dict[str, str]],
              uri: str | None = None) -> str:
    """Log the whole sweep; returns the parent run id. ``selection_tags``: per trial id,
    the tags of its selection verdict and rank."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri(sweep, uri))
    exp = client.get_experiment_by_name(sweep.name)
    exp_id = exp.experiment_id if exp else client.create_experiment(sweep.name)
    parent = client.create_run(exp_id, run_name=sweep.name, tags={
        "sweeps.kind": "sweep", "sweeps.source": str(sweep.source or "")})
    pid = parent.info.run_id
    counts: dict[str, int] = {}
    for rec in book.trials.values():
        counts[rec.status] = counts.get(rec.status, 0) + 1
        _log_trial(client, exp_id, pid, rec, selection_tags.get(rec.trial_id, {}), Metric,
                   Param, RunTag)
    client.log_batch(pid, metrics=[Metric(f"trials_{k}", float(v), int(time.time() * 1000), 0)
                                   for k, v in counts.items()],
                     params=[Param("trials", str(sweep.spec.budget.trial_cap or "no cap")),
                             Param("max_steps", str(sweep.spec.budget.max_steps)),
                             Param("total_steps", str(sweep.spec.budget.total_steps)),
                             Param("trainer", sweep.spec.trainer)])
    client.set_terminated(pid, "FINISHED")
    return pid


def _log_trial(client, exp_id: str, parent_id: str, rec: TrialRecord,
               selection: dict[str, str], Metric, Param, RunTag) -> None:  # noqa: N803
    tags = {"mlflow.parentRunId": parent_id, "sweeps.status": rec.status,
            "sweeps.role": rec.role, "sweeps.seed": str(rec.seed)}
    if rec.reason:
        tags.update({"sweeps.reason": rec.reason, "sweeps.stop_step": str(rec.stop_step)})
    tags.update(selection)
    run = client.create_run(exp_id, run_name=rec.trial_id, tags={"mlflow.parentRunId": parent_id})
    rid = run.info.run_id
    now = int(time.time() * 1000)
    metrics = []
    for entry in rec.history:
        step = int(entry.get("step", 0))
        for key, value in entry.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            metrics.append(Metric(key, float(value), now, step))
    params = [Param(k, str(v)) for k, v in rec.values.items()]
    tag_list = [RunTag(k, v) for k, v in tags.items() if k != "mlflow.parentRunId"]
    for i in range(0, max(len(metrics), 1), _BATCH):  # one call carries params and tags too
        first = i == 0
        client.log_batch(rid, metrics=metrics[i:i + _BATCH], params=params if first else [],
                         tags=tag_list if first else [])
    client.set_terminated(rid, "FAILED" if rec.failed else "FINISHED")


