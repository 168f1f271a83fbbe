"""MLflow tracking, written by the driver only (a sqlite file never sees two writers).

One parent run per sweep and one child run per trial, with the knobs as
params, every reported step as metrics, and tags for status, failure reason,
stop step, role and Pareto rank.

MLflow takes metric names of letters, digits, ``_ - . /`` and spaces only (and
no name that a path would normalise, e.g. ``a//b``). A trainer's other names
(``acc@1``) are logged under a legal name (``acc_1``; a clash with another name
gets ``_2``, ``_3``, ...), the mapping is the parent run's tag
``sweeps.metric_names`` (JSON) and ``tracking.txt``; trials.csv and the
histories keep the names as reported.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sweeps.protocol import SEARCH
from sweeps.record.book import TrialBook, TrialRecord
from sweeps.secrets import MASK, credentials_in, hide_credentials
from sweeps.spec.loader import Sweep

_BATCH = 900  # MLflow takes at most 1000 metrics per log_batch call
_MAX_KEY = 250  # MLflow's longest metric name
_ILLEGAL = re.compile(r"[^\w\-. /]")
_PROBE_TIMEOUT_S = 5.0


@dataclass
class Logged:
    """What :func:`log_sweep` logged."""

    run_id: str
    renamed: dict[str, str] = field(default_factory=dict)  # reported name -> MLflow name


def legal_name(name: str) -> str:
    """``name`` with what MLflow refuses in a metric name replaced by ``_`` (cut to
    MLflow's longest name first, so the cut cannot leave a path MLflow rewrites, ``a/``)."""
    out = _ILLEGAL.sub("_", name)[:_MAX_KEY]
    if posixpath.normpath(out) != out or out.startswith(("/", "..")) or out in ("", "."):
        out = out.replace("/", "_")  # a name a path would rewrite ("a//b", "a/./b", "a/")
        if out.startswith("..") or out in ("", "."):
            out = "_" + out
    return out[:_MAX_KEY]


def metric_names(names: Iterable[str]) -> dict[str, str]:
    """Every name -> the name MLflow logs it under: itself when legal, else
    :func:`legal_name`, with ``_2``, ``_3``, ... where two names would meet."""
    names = list(dict.fromkeys(names))
    out = {n: n for n in names if legal_name(n) == n}
    taken = set(out)
    for name in names:
        if name in out:
            continue
        base = legal_name(name)
        candidate, n = base, 1
        while candidate in taken:
            n += 1
            suffix = f"_{n}"
            candidate = base[:_MAX_KEY - len(suffix)] + suffix
        taken.add(candidate)
        out[name] = candidate
    return out


def tracking_uri(sweep: Sweep, uri: str | None = None) -> str:
    """``uri``, else ``MLFLOW_TRACKING_URI``, else ``results/<name>/mlflow.db``."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or \
        f"sqlite:///{Path(sweep.output_dir) / 'mlflow.db'}"


def scrub(text: str, uri: str) -> str:
    """``text`` (an error message) with the credentials of ``uri`` masked, in any URL in
    it and wherever they appear alone (:mod:`sweeps.secrets`)."""
    text = hide_credentials(text)
    for secret in credentials_in(uri):
        text = text.replace(secret, MASK)
    return text


def check_reachable(uri: str) -> None:
    """Raise ConnectionError at once when an http(s) tracking server does not answer a TCP
    connect (MLflow itself would retry for minutes), and ValueError when the local sqlite
    file is a symlink (state files are not followed through symlinks)."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "sqlite":
        path = Path(parsed.path[1:] if parsed.path.startswith("//") else parsed.path)
        if path.is_symlink():
            raise ValueError(f"{path} is a symlink; sweeps does not follow it")
        return
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return
    proxies = urllib.request.getproxies()
    if parsed.scheme in proxies and not urllib.request.proxy_bypass(parsed.hostname):
        return  # reached through a proxy: only MLflow's own request can tell
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=_PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise ConnectionError(f"the tracking server {parsed.hostname}:{port} does not answer "
                              f"({exc.strerror or exc})") from None


def log_sweep(sweep: Sweep, book: TrialBook, selection_tags: dict[str, dict[str, str]],
              uri: str | None = None, replaces: str | None = None) -> Logged:
    """Log the whole sweep; returns the parent run id and the metric names renamed for
    MLflow. ``selection_tags``: per trial id, the tags of its selection verdict and rank.
    ``replaces``: the parent run an earlier logging of this sweep made (a resume logs the
    whole sweep again): once the new one is logged, it and its trials' runs are deleted
    (MLflow's soft delete: ``mlflow runs restore`` brings them back), so the experiment
    holds the sweep once."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    target = tracking_uri(sweep, uri)
    check_reachable(target)
    # MLflow prints a "View run ... at: URL" line per run to a server: one per trial
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    names = metric_names(key for rec in book.trials.values() for entry in rec.history
                         for key in entry if key != "step")
    renamed = {k: v for k, v in names.items() if k != v}
    client = MlflowClient(tracking_uri=target)
    exp = client.get_experiment_by_name(sweep.name)
    exp_id = exp.experiment_id if exp else client.create_experiment(sweep.name)
    tags = {"sweeps.kind": "sweep", "sweeps.source": str(sweep.source or "")}
    if renamed:
        tags["sweeps.metric_names"] = json.dumps(renamed)[:8000]
    parent = client.create_run(exp_id, run_name=sweep.name, tags=tags)
    pid = parent.info.run_id
    try:
        counts: dict[str, int] = {}  # search trials by outcome; re-runs apart
        for rec in book.trials.values():
            key = f"trials_{rec.status}" if rec.role == SEARCH else \
                f"{rec.role.partition(':')[0]}_runs"  # confirm_runs, probe_runs, base_runs
            counts[key] = counts.get(key, 0) + 1
            _log_trial(client, exp_id, pid, rec, selection_tags.get(rec.trial_id, {}), names,
                       Metric, Param, RunTag)
        client.log_batch(pid, metrics=[
            Metric(k, float(v), int(time.time() * 1000), 0)
            for k, v in counts.items()],
            params=[Param("trials", str(sweep.spec.budget.trial_cap or "no cap")),
                    Param("max_steps", str(sweep.spec.budget.max_steps)),
                    Param("total_steps", str(sweep.spec.budget.total_steps)),
                    Param("trainer", sweep.spec.trainer)])
    except BaseException:
        try:  # leave no parent run RUNNING forever
            client.set_terminated(pid, "FAILED")
        except Exception:  # the first error is the one to report
            pass
        raise
    client.set_terminated(pid, "FINISHED")
    if replaces and replaces != pid:
        _delete_logged(client, exp_id, replaces)
    return Logged(pid, renamed)


def _delete_logged(client, exp_id: str, parent_id: str) -> None:
    """Soft-delete an earlier parent run and its children (gone already: nothing to do)."""
    from mlflow.exceptions import MlflowException

    try:
        children = client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{parent_id}'")
        for run in children:
            client.delete_run(run.info.run_id)
        client.delete_run(parent_id)
    except MlflowException:
        pass


def _log_trial(client, exp_id: str, parent_id: str, rec: TrialRecord,
               selection: dict[str, str], names: dict[str, str],
               Metric, Param, RunTag) -> None:  # noqa: N803
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
            metrics.append(Metric(names.get(key, key), float(value), now, step))
    params = [Param(k, str(v)) for k, v in rec.values.items()]
    tag_list = [RunTag(k, v) for k, v in tags.items() if k != "mlflow.parentRunId"]
    for i in range(0, max(len(metrics), 1), _BATCH):  # one call carries params and tags too
        first = i == 0
        client.log_batch(rid, metrics=metrics[i:i + _BATCH], params=params if first else [],
                         tags=tag_list if first else [])
    client.set_terminated(rid, "FAILED" if rec.failed else "FINISHED")


