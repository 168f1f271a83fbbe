"""The output of a trial whose worker process died, kept in the results folder.

A trainer's stdout and stderr go to Ray's worker logs (``worker-<id>-<job>-<pid>.out``
and ``.err``) in the embedded Ray's private folder, which is removed when the sweep ends
(:mod:`sweeps.tune.session`). A trainer that raises leaves its traceback in
``trials/<id>.error.txt`` (so does ``sys.exit`` or ``os._exit``, caught in the trial);
one whose process died (a segfault, the OOM killer, a signal) leaves only what it
printed. So when Ray Tune reports a trial's worker dead, the tail of that worker's logs
is copied to ``trials/<id>.worker.log`` by ``sweeps.tune.callbacks.WorkerLogs`` (mode 0600:
a trainer's output is for its user alone), one section per attempt; the trial's evidence
names it (``output``).

Against a Ray cluster (``--address``) the worker logs stay on the node that ran the trial,
in the cluster's own temp folder: nothing is copied.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

#: The most of each log copied (its end: where a process that died wrote last).
TAIL_BYTES = 1 << 20
_PID = re.compile(r"^\s*pid: (\d+)\s*$", re.MULTILINE)


def worker_log_path(folder: Path, trial_id: str) -> Path:
    """Where the output of trial ``trial_id``'s dead worker is kept."""
    return folder / f"{trial_id}.worker.log"


def worker_pid(trial: Any) -> int | None:
    """The pid of the worker process that ran ``trial``: from its last result, or from the
    error Ray Tune wrote for it (``ActorDiedError`` names the dead actor's pid)."""
    pid = (trial.last_result or {}).get("pid")
    if isinstance(pid, int):
        return pid
    try:
        text = Path(trial.error_file).read_text(errors="replace") if trial.error_file else ""
    except OSError:
        return None
    found = _PID.search(text)
    return int(found.group(1)) if found else None


def _tail(path: Path, limit: int = TAIL_BYTES) -> tuple[bytes, int]:
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - limit))
        return fh.read(), size


def keep_worker_output(logs: Path, pid: int, dest: Path, attempt: str) -> bool:
    """Append the tails of worker ``pid``'s ``.out`` and ``.err`` logs in ``logs`` to
    ``dest`` (created 0600). Returns whether there was any log of that worker."""
    found = sorted(logs.glob(f"worker-*-{pid}.out")) + sorted(logs.glob(f"worker-*-{pid}.err"))
    if not found:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as out:
        if out.tell() == 0:
            out.write(b"# Output of this trial's worker process, copied from Ray's logs when "
                      b"the trial failed. A worker runs trial after trial: lines before this "
                      b"trial's own may be an earlier trial's.\n")
        for path in found:
            data, size = _tail(path)
            stream = "stdout" if path.suffix == ".out" else "stderr"
            cut = f", its last {len(data)} of {size} bytes" if len(data) < size else ""
            out.write(f"=== {attempt}: {stream} of worker process {pid} ({path.name}{cut}) "
                      "===\n".encode())
            out.write(data if data.endswith(b"\n") or not data else data + b"\n")
    return True
