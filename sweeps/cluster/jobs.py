"""``sweeps submit`` and ``sweeps jobs status|logs|stop|list``: sweeps as Ray Jobs.

The project folder goes to the cluster as the job's ``working_dir``; the job runs
``python -m sweeps run <sweep file> [--output <storage>]`` on the head node, and that
driver's trials run on every node. Register the commands with :func:`add_commands`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rich import box
from rich.table import Table

from sweeps.cluster import auth
from sweeps.errors import ClusterNotReady, SpecError
from sweeps.terminal import console as make_console
from sweeps.terminal import shell_word
from sweeps.tune.compat import PACKAGING_LOGGER, WORKING_DIR_LOGGER

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
#: Ray loggers that print lines about every upload and websocket, and warn that .git and
#: .venv are not shipped (sweeps excludes them itself)
_CHATTY = {"ray.dashboard.modules.dashboard_sdk": logging.WARNING,
           "ray.dashboard.modules.job.sdk": logging.WARNING,
           PACKAGING_LOGGER: logging.WARNING, WORKING_DIR_LOGGER: logging.ERROR}
_NO_CLUSTER_FIX = ("start one (cluster/ray/start-local-cluster.sh), open the SSH tunnel to its "
                   "head (ssh -N -L 8265:127.0.0.1:8265 HEAD) or pass --address http://HOST:8265; "
                   "the head's Python needs ray[default] for the Jobs API")

console = make_console()  # job messages, metadata and names printed as text, cleaned
err_console = make_console(stderr=True)


def jobs_address(address: str | None) -> str:
    """The Jobs API URL: ``--address``, else ``$RAY_ADDRESS`` if it is an http(s) URL."""
    if not address:
        env = os.environ.get("RAY_ADDRESS", "")
        address = env if env.startswith(("http://", "https://")) else DEFAULT_ADDRESS
    address = address.strip().rstrip("/")
    if "://" not in address and address != "auto":
        address = f"http://{address}"
    if not address.startswith(("http://", "https://")):
        raise SpecError("--address", f"{address!r} is not the Jobs API (the head's dashboard "
                        "URL)", "pass --address http://HEAD:8265 (through an SSH tunnel: "
                        "http://127.0.0.1:8265)")
    return address


def _probe(url: str, headers: dict[str, str]) -> int:
    import requests

    try:
        return requests.get(f"{url}/api/jobs/", headers=headers, timeout=15).status_code
    except requests.RequestException as exc:
        reason = type(exc).__name__
        raise SpecError("--address", f"no Ray Jobs API answers at {url} ({reason})",
                        _NO_CLUSTER_FIX) from None


#: The fix for a token that must not go over plain http.
INSECURE_FIX = ("reach the head through an SSH tunnel (ssh -N -L 8265:127.0.0.1:8265 HEAD, then "
                "--address http://127.0.0.1:8265), or serve its dashboard over https "
                "(--address https://...), or pass --allow-insecure-token to send it anyway "
                "(on a network you trust)")


def connect(address: str | None, allow_insecure_token: bool = False) -> JobSubmissionClient:
    """A Jobs API client; sends the Ray auth token only if the cluster asks for it, and only
    over https or to this machine (a tunnel), unless ``allow_insecure_token`` (then warns).

    Plain http to another host exits 2 (:class:`SpecError`) when the cluster asks for the
    token: nothing carrying it is sent. Ray's own client, which adds the token to every
    request when ``RAY_AUTH_MODE=token`` is set, is kept from doing so there too."""
    from ray.job_submission import JobSubmissionClient

    for name, level in _CHATTY.items():
        logging.getLogger(name).setLevel(level)
    url = jobs_address(address)
    secure = auth.token_may_go_to(url)
    headers: dict[str, str] = {}
    status = _probe(url, headers)
    if status == 401:
        found = auth.find_token()
        if found is None:
            raise SpecError("--address", f"the cluster at {url} has Ray token authentication "
                            "on and no token was found here", "copy the head node's token "
                            "(`ray get-auth-token` there) to ~/.ray/auth_token, or set "
                            "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH")
        if not secure and not allow_insecure_token:
            raise SpecError("--address", f"the cluster at {url} asks for the Ray auth token, "
                            "and that URL is plain http to another machine: the token (which "
                            "lets its holder run any code on the cluster) would cross the "
                            "network readable by anyone on the way, so it was not sent",
                            INSECURE_FIX)
        if not secure:
            err_console.print(f"warning: sending the Ray auth token over plain http to {url} "
                              "(--allow-insecure-token): anyone on the network path can read "
                              "it and run code on the cluster")
        headers = {"Authorization": f"Bearer {found[0]}"}
        status = _probe(url, headers)
        if status in (401, 403):
            raise SpecError("--address", f"the cluster at {url} rejected the Ray auth token "
                            f"from {found[1]}", "use the head node's token (`ray "
                            "get-auth-token` there) via ~/.ray/auth_token, RAY_AUTH_TOKEN or "
                            "RAY_AUTH_TOKEN_PATH")
    if status == 404:
        raise SpecError("--address", f"{url} answers but has no Ray Jobs API",
                        "point --address at the Ray dashboard port of the head (default 8265)")
    if headers or secure or allow_insecure_token:
        return JobSubmissionClient(url, headers=headers)
    with auth.ray_token_off():
        return JobSubmissionClient(url, headers=headers)


def _unknown_job(job_id: str, url: str, exc: Exception) -> None:
    """Raise a SpecError (exit 2) if ``exc`` says there is no such job."""
    if "does not exist" in str(exc) or "404" in str(exc):
        raise SpecError("JOB", f"no job {job_id!r} on the cluster at {url}",
                        f"list the jobs with `sweeps jobs list --address {url}`") from exc


def status_of(client: JobSubmissionClient, job_id: str) -> str:
    """The job's status as a plain string (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED)."""
    try:
        return str(client.get_job_status(job_id).value)
    except RuntimeError as exc:
        _unknown_job(job_id, client.get_address(), exc)
        raise


def wait_for_end(client: JobSubmissionClient, job_id: str, poll: float = 1.0) -> str:
    """Poll until the job reaches a terminal status; return it."""
    while (status := status_of(client, job_id)) not in TERMINAL:
        time.sleep(poll)
    return status


async def _tail(client: JobSubmissionClient, job_id: str, out: TextIO, seen: list[int]) -> None:
    async for chunk in client.tail_job_logs(job_id):
        out.write(chunk)
        out.flush()
        seen[0] += len(chunk)


def follow(client: JobSubmissionClient, job_id: str, out: TextIO | None = None) -> str:
    """Stream the job's log to ``out`` (stdout) until it ends; return its final status.

    Uses the Jobs API's log stream (a websocket); where that fails (a proxy), polls.
    """
    out = out or sys.stdout
    seen = [0]
    try:
        asyncio.run(_tail(client, job_id, out, seen))
    except Exception:  # noqa: BLE001 - any stream failure: fall back to polling
        while True:
            status = status_of(client, job_id)
            logs = client.get_job_logs(job_id)
            out.write(logs[seen[0]:])
            out.flush()
            seen[0] = len(logs)
            if status in TERMINAL:
                break
            time.sleep(2.0)
    return wait_for_end(client, job_id)


def _when(ms: int | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    return "" if not ms else datetime.fromtimestamp(ms / 1000).strftime(fmt)


def _duration(start: int | None, end: int | None) -> str:
    if not start:
        return ""
    seconds = int(((end or time.time() * 1000) - start) / 1000)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def cmd_submit(args: argparse.Namespace) -> int:
    from sweeps.cluster.package import build

    sub = build(args.file, workdir=Path.cwd(), project_dir=args.project_dir,
                storage=args.storage, preflight=not args.no_preflight, pip=args.pip or [],
                env_pairs=args.env or [])
    if args.dry_run:
        return print_dry_run(sub)
    client = connect(args.address, args.allow_insecure_token)
    try:
        job_id = submit_when_ready(client, sub.kwargs())
    except ValueError as exc:
        if "exceeds the maximum size" not in str(exc):
            raise
        raise SpecError("--project-dir", str(exc).split(". To exclude")[0],
                        "add large files or folders to .rayignore (or .gitignore), or keep "
                        "data outside the project folder") from exc
    print(job_id, flush=True)
    where = f"{str(sub.metadata['sweeps.storage']).rstrip('/')}/{sub.sweep_name}"
    at = f" --address {client.get_address()}"  # the hints reach this cluster, no other
    err_console.print(f"submitted sweep '{sub.sweep_name}' ({sub.sweep_path}) from "
                      f"{sub.project_dir} to {client.get_address()}\n"
                      f"  command: {sub.entrypoint}\n  results: {where}\n"
                      f"  follow: sweeps jobs logs {job_id} --follow{at}   "
                      f"stop: sweeps jobs stop {job_id}{at}")
    if not args.wait:
        return 0
    try:
        status = follow(client, job_id)
    except KeyboardInterrupt:
        err_console.print(f"stopped following; job {job_id} goes on "
                          f"(sweeps jobs stop {job_id}{at} ends it)")
        raise
    err_console.print(f"job {job_id}: {status}")
    if status == "FAILED":
        _explain_failure(client, job_id)
    return 0 if status == "SUCCEEDED" else 1


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def print_dry_run(sub: Any) -> int:
    """``submit --dry-run``: the files the upload would hold (stdout, one path a line, as
    Ray would pack them), and what else would be sent (stderr). Contacts nothing."""
    from sweeps.cluster.package import left_out_secrets, shipped_files

    project = sub.project_dir
    files = shipped_files(project, sub.runtime_env["excludes"])
    total = sum((project / f).stat().st_size for f in files)
    for f in files:
        print(f.as_posix())
    renv = sub.runtime_env
    lines = [f"dry run: sweep '{sub.sweep_name}' ({sub.sweep_path}) not submitted; the job "
             f"would ship {len(files)} file(s), {_size(total)}, from {project} (listed above: "
             "after sweeps' excludes and the project's .gitignore / .rayignore, as Ray packs "
             "them)", f"  command: {sub.entrypoint}"]
    if renv.get("env_vars"):
        lines.append(f"  environment: {', '.join(sorted(renv['env_vars']))}")
    if renv.get("pip"):
        lines.append(f"  pip: {' '.join(renv['pip'])}")
    secrets = left_out_secrets(project, files)
    if secrets:
        shown = ", ".join(p.as_posix() for p in secrets[:8]) + (
            ", ..." if len(secrets) > 8 else "")
        lines.append(f"  never shipped (secrets): {shown}")
    err_console.print("\n".join(lines))
    return 0


#: How long ``sweeps submit`` waits for a head's job agent to come up (seconds).
AGENT_WAIT = 60.0
#: The Jobs API's answer while the head's job agent is not up yet.
NO_AGENT = "No available agent to submit job"
#: What a job's log holds when the cluster's Python has no sweeps.
NO_SWEEPS = "No module named 'sweeps'"


def submit_when_ready(client: Any, kwargs: dict[str, Any], wait: float = AGENT_WAIT,
                      sleep: Any = time.sleep) -> str:
    """``client.submit_job``, retried with backoff while the head's job agent is not up
    (right after ``ray start --head`` the Jobs API answers before its agent); after
    ``wait`` seconds one clear error."""
    delay, waited = 1.0, 0.0
    while True:
        try:
            return client.submit_job(**kwargs)
        except RuntimeError as exc:
            if NO_AGENT not in str(exc):
                raise
            if waited >= wait:
                raise ClusterNotReady(
                    f"the Ray head at {client.get_address()} still has no job agent after "
                    f"{waited:.0f} s (it answers '{NO_AGENT}'); check `ray status` on the "
                    "head, or restart it with `ray start --head`") from exc
            sleep(delay)
            waited += delay
            delay = min(delay * 2, 10.0)


def _explain_failure(client: Any, job_id: str) -> None:
    """Say how to fix a job that failed because the cluster's Python has no sweeps."""
    try:
        logs = client.get_job_logs(job_id)
    except Exception:  # noqa: BLE001 - an explanation is a courtesy, never a new failure
        return
    if NO_SWEEPS in logs:
        err_console.print(
            "the job's Python has no sweeps: the Ray head runs jobs in the Python it was "
            "started from. Start the head from the environment where sweeps is installed "
            "(`ray start --head` with that environment active), or let the job install it: "
            "`sweeps submit ... --pip sweeps` (or a path/URL pip can install).")


#: The resume line a job's driver prints when it stops (``interrupted_line``).
_RESUME_LINE = re.compile(r"sweeps resume \S+(?: \S+)*? --address (\S+?)`")


def _gcs_address_logged(client: Any, job_id: str) -> str | None:
    """The cluster's GCS address as the job's driver printed it in its resume line, None
    when its logs have none (a driver that never got to print it)."""
    try:
        logs = client.get_job_logs(job_id)
    except Exception:  # noqa: BLE001 - a courtesy: the placeholder stands in for it
        return None
    found = _RESUME_LINE.findall(logs or "")
    return found[-1] if found else None


def cmd_status(args: argparse.Namespace) -> int:
    client = connect(args.address, args.allow_insecure_token)
    try:
        info = client.get_job_info(args.job)
    except RuntimeError as exc:
        _unknown_job(args.job, client.get_address(), exc)
        raise
    status = str(info.status.value)
    console.print(f"{args.job}: {status}")
    meta = info.metadata or {}
    storage, name = meta.get("sweeps.storage"), meta.get("sweeps.sweep")
    results = f"{str(storage).rstrip('/')}/{name}" if storage and name else storage
    rows: list[tuple[str, Any]] = [
        ("sweep", name), ("file", meta.get("sweeps.file")),
        ("results", results), ("message", info.message),
        ("command", info.entrypoint), ("started", _when(info.start_time)),
        ("ended", _when(info.end_time)), ("duration", _duration(info.start_time, info.end_time)),
        ("driver exit code", getattr(info, "driver_exit_code", None)),
    ]
    for key, value in rows:
        if value not in (None, ""):
            console.print(f"  {key}: {value}")
    storage, name = meta.get("sweeps.storage"), meta.get("sweeps.sweep")
    if status in ("FAILED", "STOPPED") and storage and name:
        folder = shell_word(f"{storage.rstrip('/')}/{name}")
        gcs = _gcs_address_logged(client, args.job)
        where = shell_word(gcs) if gcs else "HOST:PORT (the cluster's GCS address, not " \
            "this http:// one; docs/clusters.md)"
        console.print(f"  continue: sweeps resume {folder} --address {where}")
    if status == "FAILED":
        _explain_failure(client, args.job)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    client = connect(args.address, args.allow_insecure_token)
    status_of(client, args.job)  # a clear error for an unknown job
    if args.follow:
        status = follow(client, args.job)
        err_console.print(f"job {args.job}: {status}")
        return 0
    sys.stdout.write(client.get_job_logs(args.job))
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    client = connect(args.address, args.allow_insecure_token)
    before = status_of(client, args.job)
    if before in TERMINAL:
        console.print(f"{args.job} is not running ({before})")
        return 0
    client.stop_job(args.job)
    console.print(f"{args.job}: stop requested (was {before}); "
                  f"`sweeps jobs status {args.job}` shows when it has ended")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    client = connect(args.address, args.allow_insecure_token)
    jobs = sorted((j for j in client.list_jobs() if j.submission_id),
                  key=lambda j: j.start_time or 0)
    table = Table(title=f"Jobs submitted to {client.get_address()}", box=box.SIMPLE,
                  pad_edge=False)
    table.add_column("job", no_wrap=True)
    for col in ("status", "started", "duration"):  # the sweep's name is in the job id
        table.add_column(col, no_wrap=True)
    for job in jobs:
        table.add_row(job.submission_id or "", str(job.status.value),
                      _when(job.start_time, "%m-%d %H:%M"),
                      _duration(job.start_time, job.end_time))
    console.print(table)
    return 0


def _address_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=None,
                   help="the head's Jobs API (dashboard) URL; default: $RAY_ADDRESS if it is "
                        f"an http(s) URL, else {DEFAULT_ADDRESS}")
    p.add_argument("--allow-insecure-token", action="store_true",
                   help="send the Ray auth token even over plain http to another machine "
                        "(by default it goes only over https or to 127.0.0.1, e.g. an SSH "
                        "tunnel's end)")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``submit`` and ``jobs {status,logs,stop,list}`` on the CLI's subparsers."""
    p = sub.add_parser("submit", help="run a sweep on a standing Ray cluster (Ray Jobs API)")
    p.add_argument("file", help="sweep file (YAML), inside the project folder")
    _address_arg(p)
    p.add_argument("--storage", default=None,
                   help="results root on the cluster: a folder every node can reach "
                        "(default: 'results' in the job's working dir on the head)")
    p.add_argument("--project-dir", default=None,
                   help="folder shipped as the job's working dir (default: current folder)")
    p.add_argument("--wait", action="store_true",
                   help="follow the job's log to its end; exit 0 if it SUCCEEDED, else 1")
    p.add_argument("--no-preflight", action="store_true",
                   help="skip the preflight checks on the cluster")
    p.add_argument("--pip", nargs="+", action="extend", metavar="PKG",
                   help="extra pip packages the job's runtime env installs")
    p.add_argument("--env", action="append", metavar="K=V",
                   help="environment variable for the job and its workers; repeatable")
    p.add_argument("--dry-run", action="store_true",
                   help="list the files the job would ship (and its command); contact "
                        "nothing, submit nothing")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("jobs", help="status, logs, stop or list of submitted sweeps")
    jobs = p.add_subparsers(dest="jobs_command", required=True)
    for name, func, text in (("status", cmd_status, "status and details of a job"),
                             ("logs", cmd_logs, "a job's log"),
                             ("stop", cmd_stop, "stop a running job")):
        q = jobs.add_parser(name, help=text)
        q.add_argument("job", help="job id (as printed by sweeps submit)")
        _address_arg(q)
        if name == "logs":
            q.add_argument("--follow", action="store_true", help="stream it until the job ends")
        q.set_defaults(func=func)
    q = jobs.add_parser("list", help="all jobs on the cluster")
    _address_arg(q)
    q.set_defaults(func=cmd_list)
