"""Starting and stopping Ray for a sweep.

``sweeps run`` without ``--address`` starts an embedded Ray on this machine. On a
machine other people use too, that Ray keeps to itself (measured with Ray 2.60; see
docs/security.md, "A shared machine"):

* **A private folder.** Ray's temp dir (its sockets, every log, the runtime_env agent's
  log with the environment variables Ray Tune copies into each trial, ``AWS_*`` among
  them, and every trainer's stdout and stderr) is ``<tmp>/sweeps-run-XXXXXXXX/ray``.
  Ray makes its own folders 0777 and its files 0644; the ``sweeps-run-*`` folder around
  them is made by :func:`tempfile.mkdtemp` (mode 0700, owned by the user), so no other
  local user can open anything inside. Ray's lock files (``RAY_TMPDIR``) go there too.
  ``<tmp>`` is ``$RAY_TMPDIR``, else ``$TMPDIR``, else ``/tmp``: the first that leaves
  Ray's Unix socket paths within 107 bytes. The folder is removed when the sweep ends
  (after ``ray.shutdown()``).
* **Loopback only.** Every port the embedded Ray opens (GCS, raylet, object manager, the
  driver's and workers' gRPC servers, the dashboard and runtime_env agents, metrics) is
  bound to 127.0.0.1: Ray's single-machine mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
  its default on macOS and Windows), which makes the node's address 127.0.0.1, and Ray
  binds its servers to loopback when the node's address is. The dashboard is off.
* **A token of its own.** Loopback ports are open to every local user, so the embedded
  Ray runs with Ray's token authentication and a token made for this run alone, kept in
  the private folder, rather than ``~/.ray/auth_token`` (which Ray writes 0644). A
  token or mode the user set (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``,
  ``RAY_AUTH_MODE``) is used as given.
* **Orphans.** A driver killed with SIGKILL leaves its folder and, for about 60 s, Ray's
  dashboard and runtime_env agents (the GCS, raylet and workers end within seconds). The
  next embedded start ends the processes of such a folder (found by the
  ``SWEEPS_RAY_SESSION`` variable in their environment, only the user's own processes,
  only folders whose driver is gone) and removes the folder.

With ``--address`` (or ``RAY_ADDRESS`` set, as in a job ``sweeps submit`` started) sweeps
connects to a cluster someone started; none of the above applies there (see cluster/ray
and docs/clusters.md).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sweeps.errors import SpecError
from sweeps.tune import compat

#: Environment every sweep driver sets before Ray Tune starts.
TUNE_ENV = {
    # Ray Tune's default CSV/JSON/TensorBoard loggers cost seconds per trial;
    # sweeps keeps its own per-trial history (trials/<id>.csv) instead.
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    # val_loss is reported only every few steps; results without it are normal.
    "TUNE_DISABLE_STRICT_METRIC_CHECKING": "1",
    "TUNE_MAX_PENDING_TRIALS_PG": "1",
    "RAY_AIR_NEW_OUTPUT": "0",
    # Ctrl-C (or SLURM's time-limit signal) ends the sweep with KeyboardInterrupt rather
    # than letting Tune return a partial search that would then be selected and exported;
    # `sweeps resume` continues it
    "TUNE_DISABLE_SIGINT_HANDLER": "1",
    # save the experiment state at least every 2 s (Ray's default is 10 s or more), so a
    # driver killed mid-sweep re-runs as little as possible on `sweeps resume`
    "TUNE_GLOBAL_CHECKPOINT_S": "2",
    # Ray's own "(raylet) A worker died …" lines reach the console and logs: without the
    # escape codes it wraps its prefix in (a log file kept them as ^[[33m)
    "RAY_COLOR_PREFIX": "0",
}

#: The last place the private folder may go.
FALLBACK_TMP = "/tmp"
#: Name prefix of an embedded Ray's private folder.
PREFIX = "sweeps-run-"
#: The variable every process of an embedded Ray inherits: the path of its private folder.
SESSION_VAR = "SWEEPS_RAY_SESSION"
#: The file in the private folder that names the driver owning it.
OWNER = "driver.json"
#: Set to 1 to keep the private folder (all of Ray's logs) after the run.
KEEP_VAR = "SWEEPS_KEEP_RAY_LOGS"
#: Ray's temp dir inside the private folder.
RAY_DIR = "ray"
#: Longest AF_UNIX socket path on Linux (108 bytes with the terminating NUL).
SOCKET_MAX = 107
#: The longest socket path Ray puts below its temp dir (a 7-digit pid in the session name).
_SOCKET_TAIL = len(f"/{RAY_DIR}/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store")
#: Ray's switch for its single-machine mode: the node's address is 127.0.0.1.
_SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_TOKEN_SETTINGS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def quiet_logs() -> None:
    """Silence the warnings Ray Tune and MLflow print about things sweeps does on purpose."""
    import logging

    # Tune's result analysis looks for the logger files sweeps turned off.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    logging.getLogger("ray.tune.tune").setLevel(logging.WARNING)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # "Token authentication is enabled for this Ray cluster": it is, on purpose
    logging.getLogger(compat.TOKEN_SETUP_LOGGER).setLevel(logging.ERROR)


@dataclass
class RaySession:
    """What :func:`ray_running` started: an embedded Ray's private folder, or nothing."""

    folder: Path | None = None  # None: connected to a running Ray, nothing of ours to clean

    @property
    def logs(self) -> Path | None:
        """Ray's log folder of this run (workers' stdout/stderr: ``worker-*.out|err``)."""
        return self.folder / RAY_DIR / "session_latest" / "logs" if self.folder else None


_CURRENT: RaySession | None = None


def current() -> RaySession | None:
    """The embedded Ray this process runs now, or None (none, or a cluster's Ray)."""
    return _CURRENT


def temp_base() -> Path:
    """The folder the private folder goes in: ``$RAY_TMPDIR``, ``$TMPDIR`` or ``/tmp``,
    the first that is a writable folder short enough for Ray's socket paths."""
    tried = []
    for var in ("RAY_TMPDIR", "TMPDIR", None):
        base = os.environ.get(var, "") if var else FALLBACK_TMP
        if not base:
            continue
        where = f"${var}={base}" if var else base
        longest = len(os.fsencode(os.path.join(base, PREFIX + "x" * 8))) + _SOCKET_TAIL
        if longest > SOCKET_MAX:
            tried.append(f"{where} (Ray's socket paths under it would be {longest} bytes, "
                         f"over the {SOCKET_MAX} bytes a Unix socket path may have)")
        elif not (os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK)):
            tried.append(f"{where} (not a writable folder)")
        else:
            return Path(base)
    raise SpecError("TMPDIR", "found no folder for the embedded Ray's private temp folder: "
                    + "; ".join(tried), "set TMPDIR to a short, writable local folder "
                    "(e.g. /tmp or /dev/shm)")


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _driver_alive(owner: dict) -> bool:
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return True  # not ours to judge
    ticks = start_ticks(pid)
    return ticks is not None and ticks == owner.get("start")


def session_pids(folder: Path) -> list[int]:
    """The user's own processes of the embedded Ray in ``folder``; never this process.

    A process is one if it inherited :data:`SESSION_VAR` naming ``folder``, or if it is a
    Ray process (``gcs_server``, ``raylet``, ``ray::*``, Python running Ray's own code)
    holding a file in ``folder`` open: Ray redirects every process's stdout and stderr to
    its logs there. The second test is needed because Ray's agents and workers rename
    themselves (``setproctitle``), which can overwrite the start of the environment
    that ``/proc/<pid>/environ`` shows."""
    mark = f"{SESSION_VAR}={folder}".encode()
    inside = f"{folder}{os.sep}"
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            if mark in (entry / "environ").read_bytes().split(b"\0") or (
                    _is_ray(entry) and _holds_file_in(entry, inside)):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _is_ray(proc: Path) -> bool:
    comm = (proc / "comm").read_text().strip()
    if comm in ("gcs_server", "raylet") or comm.startswith("ray::"):
        return True
    return comm.startswith("python") and any(
        f"{os.sep}ray{os.sep}".encode() in arg
        for arg in (proc / "cmdline").read_bytes().split(b"\0")[1:3])


def _holds_file_in(proc: Path, inside: str) -> bool:
    links = [proc / "cwd"] + list((proc / "fd").iterdir())
    for link in links:
        try:
            if os.readlink(link).startswith(inside):
                return True
        except OSError:
            continue
    return False


def end_processes(pids: list[int], grace: float = 1.0) -> None:
    """SIGTERM, then SIGKILL to what is left after ``grace`` seconds (the agents a killed
    driver leaves behind ignore SIGTERM: measured, still up 10 s after it)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        live = [p for p in pids if is_alive(p)]
        for pid in live:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait
        while live and time.monotonic() < deadline:
            time.sleep(0.1)
            live = [p for p in live if is_alive(p)]
        if not live:
            return


def is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def reap_orphans(base: Path) -> list[Path]:
    """End the processes of embedded Rays whose driver died (SIGKILL, out of memory, a
    reboot) and remove their folders; return those folders. Only folders in ``base``
    named ``sweeps-run-*``, owned by this user, mode 0700, with a driver record of this
    host whose process is gone; a folder kept on purpose (``SWEEPS_KEEP_RAY_LOGS``) stays."""
    reaped = []
    try:
        candidates = [p for p in base.iterdir() if p.name.startswith(PREFIX)]
    except OSError:
        return reaped
    for folder in candidates:
        try:
            st = folder.lstat()
            owner = json.loads((folder / OWNER).read_text())
        except (OSError, ValueError):
            continue
        if (not folder.is_dir() or folder.is_symlink() or st.st_uid != os.getuid()
                or st.st_mode & 0o777 != 0o700 or not isinstance(owner, dict)
                or owner.get("host") != socket.gethostname() or owner.get("kept")
                or _driver_alive(owner)):
            continue
        end_processes(session_pids(folder))
        shutil.rmtree(folder, ignore_errors=True)
        reaped.append(folder)
    return reaped


def _private_folder() -> Path:
    base = temp_base()
    for folder in reap_orphans(base):
        print(f"note: ended what was left of an earlier sweep's Ray, whose driver was "
              f"killed, and removed its folder {folder}", file=sys.stderr)
    folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base))
    st = folder.lstat()
    if st.st_uid != os.getuid() or st.st_mode & 0o777 != 0o700:  # mkdtemp's promise
        raise RuntimeError(f"{folder} is not a private folder (mode {st.st_mode & 0o777:o})")
    _write_owner(folder, kept=False)
    return folder


def _write_owner(folder: Path, kept: bool) -> None:
    record = {"pid": os.getpid(), "start": start_ticks(os.getpid()),
              "host": socket.gethostname(), "kept": kept}
    (folder / OWNER).write_text(json.dumps(record) + "\n")


class _Env:
    """Set environment variables for a while; put the old values back after."""

    def __init__(self) -> None:
        self.saved: dict[str, str | None] = {}

    def set(self, key: str, value: str) -> None:
        self.saved.setdefault(key, os.environ.get(key))
        os.environ[key] = value

    def restore(self) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _token_for_this_run(folder: Path, env: _Env) -> bool:
    """Make a token for this run alone in the private folder, unless the user set one
    (or turned token authentication off). Returns whether it did."""
    if any(os.environ.get(k) for k in _TOKEN_SETTINGS):
        return False
    import secrets

    path = folder / "auth_token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(32))
    env.set("RAY_AUTH_MODE", "token")
    env.set("RAY_AUTH_TOKEN_PATH", str(path))
    _reload_token()
    return True


def _reload_token() -> None:
    """Ray caches its config and the token at import: read them again (Ray's own way)."""
    compat.reload_ray_config()
    compat.reset_ray_token_cache()


#: Seconds a cluster's GCS port has to accept a TCP connection before ``--address`` is
#: called wrong (Ray itself retries for many minutes, deaf to Ctrl-C).
ADDRESS_TIMEOUT_S = 5.0


def check_address(address: str | None) -> None:
    """A SpecError naming ``--address`` when nothing accepts a TCP connection at it
    (``host:port`` or ``ray://host:port``; ``auto`` and ``local`` are Ray's to find).
    Called before a results folder is touched.

    Example:
        >>> check_address("cluster-head")
        Traceback (most recent call last):
        ...
        sweeps.errors.SpecError: --address: 'cluster-head' is not host:port. ...
        >>> check_address("http://127.0.0.1:8265")
        Traceback (most recent call last):
        ...
        sweeps.errors.SpecError: --address: 'http://127.0.0.1:8265' is the Jobs API's URL ...
    """
    if address is None or address in ("auto", "local"):
        return
    if address.startswith(("http://", "https://")):
        raise SpecError("--address", f"{address!r} is the Jobs API's URL (the dashboard); "
                        "this command connects to the cluster itself",
                        "give the cluster's GCS address host:port (the one its start script "
                        "or `ray start --head` printed, e.g. 10.0.0.5:6379); http:// "
                        "addresses are for `sweeps submit` and `sweeps jobs` "
                        "(docs/clusters.md)")
    where = address.removeprefix("ray://")
    host, sep, port = where.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise SpecError("--address", f"{address!r} is not host:port",
                        "give the cluster's GCS address, e.g. 10.0.0.5:6379 (docs/clusters.md)")
    try:
        socket.create_connection((host.strip("[]"), int(port)),
                                 timeout=ADDRESS_TIMEOUT_S).close()
    except OSError as exc:
        raise SpecError("--address", f"nothing answers at {where} ({exc.strerror or exc})",
                        "start the cluster first, or give its head's GCS address (the "
                        "host:port `ray start --head` printed; docs/clusters.md)") from None


@contextmanager
def ray_running(address: str | None = None, num_cpus: int | None = None,
                num_gpus: int | None = None) -> Iterator[RaySession]:
    """Connect to ``address``, or start an embedded Ray in a private folder, bound to
    127.0.0.1, with a token of its own (see the module's docstring); stop and remove
    what we started."""
    global _CURRENT
    compat.check_versions()  # before Ray is started: a clear message, not a late failure
    import ray

    for key, value in TUNE_ENV.items():
        os.environ.setdefault(key, value)  # a value the user exported wins
    quiet_logs()
    session = RaySession()
    if ray.is_initialized():  # a caller (a test, a notebook) started Ray: use it as it is
        yield session
        return
    kwargs: dict = {"log_to_driver": False, "configure_logging": True,
                    "logging_level": "ERROR"}
    if address or os.environ.get("RAY_ADDRESS"):  # a job's driver has RAY_ADDRESS set
        from sweeps.cluster.auth import enable_for_driver

        enable_for_driver(address)  # send the cluster's token if it uses token auth
        with _sigterm_kept(), _not_started(address or os.environ.get("RAY_ADDRESS")):
            ray.init(address=address or None, **kwargs)
        try:
            yield session
        finally:
            ray.shutdown()
        return
    env = _Env()
    was_single = own_token = None
    try:
        session.folder = _private_folder()
        env.set(SESSION_VAR, str(session.folder))
        env.set("RAY_TMPDIR", str(session.folder))
        env.set(_SINGLE_MACHINE, "0")
        was_single = compat.set_ray_single_machine(True)
        own_token = _token_for_this_run(session.folder, env)
        with _sigterm_kept(), _not_started(None):
            ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                     _temp_dir=str(session.folder / RAY_DIR), **kwargs)
        _CURRENT = session
        yield session
    finally:
        _CURRENT = None
        try:
            if ray.is_initialized():
                ray.shutdown()
        finally:
            env.restore()
            compat.set_ray_single_machine(was_single)
            if own_token:
                _reload_token()
            if session.folder is not None:
                _clean_up(session)


@contextmanager
def _not_started(address: str | None) -> Iterator[None]:
    """``ray.init`` failing (a node that timed out starting on a loaded machine, a cluster
    that does not answer) as one :class:`~sweeps.errors.RayNotStarted` line: nothing ran."""
    from sweeps.errors import RayNotStarted

    try:
        yield
    except Exception as exc:  # noqa: BLE001 - any way Ray fails to start is this error
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        if address:
            raise RayNotStarted(f"could not connect to the Ray cluster at {address} "
                                f"({first}); nothing ran. Check the address (`sweeps jobs "
                                "status` prints it) and that the cluster is up") from exc
        raise RayNotStarted(f"the embedded Ray did not start ({first}); nothing ran. On a "
                            "loaded machine its processes can time out starting: run the "
                            "command again") from exc


@contextmanager
def _sigterm_kept() -> Iterator[None]:
    """Keep the command's SIGTERM handler across ``ray.init``, which replaces it twice: in
    Python by a bare ``sys.exit``, and below Python by its core worker's crash handler,
    which aborts the driver (exit 134, no line on how to continue; measured 3 of 3)."""
    import threading

    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if callable(before):
            signal.signal(signal.SIGTERM, before)


def _clean_up(session: RaySession) -> None:
    """End what is left of the embedded Ray and remove its folder (or keep it, if asked)."""
    folder = session.folder
    assert folder is not None
    end_processes(session_pids(folder))
    if os.environ.get(KEEP_VAR, "") not in ("", "0"):
        _write_owner(folder, kept=True)
        print(f"note: Ray's logs of this run are kept in {folder} (readable by you alone, "
              f"{KEEP_VAR} is set); delete the folder when done", file=sys.stderr)
        return
    shutil.rmtree(folder, ignore_errors=True)
