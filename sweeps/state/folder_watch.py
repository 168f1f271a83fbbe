"""A results folder deleted or moved while its sweep runs: found at once, said plainly.

Every write of a running sweep goes by path, so a folder removed under it (``rm -rf
results/x`` from another shell) was recreated piece by piece (``ray/``, ``trials/``)
until the Optuna journal, read and never rewritten, raised ``FileNotFoundError`` deep in
Ray Tune: a traceback, exit 1, and a half folder that neither ``run`` (no marker) nor
``resume`` (no sweep) would take. :class:`FolderWatch` notes which folder the sweep
started in (device and inode) and raises :class:`FolderGone` the moment the path names
another or none; :func:`clear_remnant` then removes what the sweep wrote at the path
since, when nothing else is there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sweeps.state.layout import (
    CONFIRM_STAGE,
    INDUCTOR_CACHE,
    LOCK_FILE,
    MARKER_FILE,
    OWNER_FILE,
    RAY_DIR,
    STUDY_FILE,
    TRIALS_DIR,
)

#: What a running sweep may write at the path of a folder deleted under it.
REMNANT_NAMES = frozenset({RAY_DIR, TRIALS_DIR, STUDY_FILE, INDUCTOR_CACHE, LOCK_FILE,
                           OWNER_FILE})


class FolderGone(Exception):
    """The results folder was deleted or moved while the sweep ran; the CLI exits with 1."""

    exit_code = 1

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        super().__init__(
            f"the results folder {folder} was deleted or moved while the sweep ran, so "
            "nothing it ran from then on could be kept; the sweep stopped.\n  fix: "
            "`sweeps run FILE` starts it again; a folder you moved goes on from where it "
            "is now: `sweeps resume NEWDIR`")


def identity(folder: Path) -> tuple[int, int] | None:
    """``folder``'s (device, inode), None when there is no directory at the path."""
    try:
        st = os.stat(folder)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if os.path.isdir(folder) else None


class FolderWatch:
    """The results folder a sweep started in; :meth:`check` raises :class:`FolderGone`
    once its path names another folder or none, or its marker is gone (an ``rm -rf``
    that the sweep's own writes kept from removing the folder itself)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.started_in = identity(self.folder)
        self.marked = (self.folder / MARKER_FILE).is_file()

    @property
    def gone(self) -> bool:
        return self.started_in is not None and (
            identity(self.folder) != self.started_in or
            (self.marked and not (self.folder / MARKER_FILE).is_file()))

    def check(self) -> None:
        if self.gone:
            raise FolderGone(self.folder)


_CURRENT: list[FolderWatch] = []


@contextmanager
def watching(folder: Path) -> Iterator[FolderWatch]:
    """Watch ``folder`` (as it is now) while the block runs: :func:`check_current`."""
    _CURRENT.append(FolderWatch(folder))
    try:
        yield _CURRENT[-1]
    finally:
        _CURRENT.pop()


def check_current() -> None:
    """Raise :class:`FolderGone` when the folder being watched is gone (nothing watched:
    nothing to do)."""
    if _CURRENT:
        _CURRENT[-1].check()


def current_gone() -> bool:
    """Whether the folder being watched is gone."""
    return bool(_CURRENT) and _CURRENT[-1].gone


def clear_remnant(folder: Path) -> bool:
    """Remove ``folder`` when it is what a sweep wrote after its results folder was
    deleted: no marker, and nothing but :data:`REMNANT_NAMES` and Ray Tune's confirmation
    stage folders in it; whether it did. Anything else there is left alone."""
    folder = Path(folder)
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    if MARKER_FILE in names or not all(
            n in REMNANT_NAMES or (n.startswith(CONFIRM_STAGE) and (folder / n).is_dir())
            for n in names):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return not folder.exists()
