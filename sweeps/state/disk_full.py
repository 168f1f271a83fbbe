"""A full disk (or quota) said in one line: which file, how much room is left, what next.

Out of space, a sweep fails wherever it happens to write (a journal, Ray Tune's state,
MLflow's database), often as an error of Ray or MLflow wrapping the ``OSError``; the
chain of tracebacks that follows says none of what a user needs. Nothing is lost: the
journals keep every finished trial, and ``sweeps resume DIR`` finishes the sweep once
there is room.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from sweeps.state.layout import MARKER_FILE
from sweeps.terminal import shell_word

#: ``errno`` values that mean "no room to write".
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})
#: How libraries that do not keep the ``OSError`` say it (SQLite: MLflow's database).
_NO_ROOM_TEXT = ("No space left on device", "Disk quota exceeded", "database or disk is full")


def no_room(exc: BaseException) -> OSError | None:
    """The out-of-space ``OSError`` in ``exc``'s chain (causes and contexts), if any."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in NO_ROOM:
            return current
        if any(text in str(current) for text in _NO_ROOM_TEXT):
            return OSError(errno.ENOSPC, "No space left on device")
        todo += [current.__cause__, current.__context__]
    return None


def _free(path: Path) -> str:
    for folder in [path, *path.parents]:
        if folder.exists():
            free = shutil.disk_usage(folder).free
            return f"{free / 2**20:.1f} MiB free on {folder}"
    return "free space unknown"


def _results_folder(path: Path) -> Path | None:
    return next((p for p in [path, *path.parents] if (p / MARKER_FILE).is_file()), None)


def message(error: OSError, folder: Path | None = None) -> str:
    """One line: the file that could not be written, the free space, and the fix."""
    where = Path(error.filename) if error.filename else None
    results = (_results_folder(where) if where is not None else None) or folder
    what = f"could not write {where}" if where is not None else \
        f"could not write into {results}" if results is not None else "could not write"
    room = _free(where.parent if where is not None else results or Path.cwd())
    ours = results is not None and (results / MARKER_FILE).is_file()
    then = (f"free some space, then `sweeps resume {shell_word(results)}` finishes the "
            "sweep (every finished trial is kept)" if ours
            else "free some space and run the command again")
    return f"error: disk full: {what} ({error.strerror or 'no space left'}; {room}); {then}"
