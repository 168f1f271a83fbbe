"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_text(path: Path, text: str, *, private: bool = False) -> None:
    """Write ``text`` to ``path`` atomically (:func:`write_bytes`), as UTF-8."""
    write_bytes(path, text.encode("utf-8"), private=private)


def write_bytes(path: Path, data: bytes, *, private: bool = False) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``; readable as
    the umask allows (results are for sharing: CSVs, YAMLs, the report and its images),
    or by this user alone (0600) when ``private``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:  # mkstemp makes 0600
        os.fchmod(fd, 0o600 if private else 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def replace_dir(path: Path, fill: Callable[[Path], None]) -> None:
    """Build a directory with ``fill(tmpdir)`` and swap it in for ``path`` whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        tmp.chmod(0o777 & ~_umask())
        fill(tmp)
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


#: What :func:`write_bytes` and :func:`replace_dir` leave when the process is killed
#: before their ``os.replace``: ``.<name>.<8 characters of mkstemp's>``, or ``.<name>.old``.
_LEFT_BEHIND = re.compile(r"\.(?P<name>.+)\.(?:[a-z0-9_]{8}|old)")


def remove_left_behind(folder: Path, subfolders: tuple[str, ...] = ()) -> list[Path]:
    """Delete the temporary files and folders a killed atomic write left in ``folder`` (and
    its ``subfolders``); call it only while the folder is held by this process. Returns
    what it removed."""
    removed = []
    for where in (folder, *(folder / sub for sub in subfolders)):
        if not where.is_dir() or where.is_symlink():
            continue
        for path in where.iterdir():
            if not _LEFT_BEHIND.fullmatch(path.name) or path.is_symlink():
                continue
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed
