"""One owner per results folder.

``sweeps run``, ``resume``, ``stability`` and ``preflight`` hold an exclusive
``flock`` on ``<folder>/.sweeps.lock`` for as long as they work on the folder;
the owner (host, PID, start time, command) is written beside it to
``<folder>/.sweeps.owner``. A second command on a folder in use stops at once
with :class:`FolderInUse` (exit 2), naming the owner.

The kernel drops a ``flock`` when the process holding it ends, however it ends
(exit, exception, Ctrl-C, SIGKILL, out of memory), so a dead owner never blocks
anyone: its lock file stays, unlocked, and the next command takes it. The lock
file is never deleted (deleting a lock file while another process waits on it
lets two processes hold "the" lock on two inodes).

A results folder carries a marker file, ``.sweeps-results``, written when the
folder is first claimed. A folder that exists without the marker (or the
``sweep_state.json`` every earlier sweeps version wrote) and holds anything
else is someone else's: :class:`ForeignFolder` (exit 2), and nothing in it is
renamed, created or written.

A results folder, and the root it lies in, must be this user's alone: a folder another
user owns or can write (a world-writable ``--output`` root someone else created, say)
could have its ``stable/`` replaced, its lock planted, its owner file forged. Such a
folder is refused (:class:`SharedFolder`, exit 2, naming the owner and the mode) unless
the user allows it (``--allow-shared-folder``: :func:`allow_shared`). A root with the
sticky bit (``/tmp``, ``/scratch``) is fine: no one else can rename what is in it.

Network file systems: on NFS (v4, or v3 with ``lockd``) Linux turns ``flock``
into a byte-range lock the server arbitrates, so the lock holds across nodes;
an NFS mount with ``-o nolock`` or ``local_lock=all`` keeps locks node-local.
Lustre arbitrates ``flock`` across nodes only when mounted with ``-o flock``;
with ``-o localflock`` the lock is node-local, and with ``noflock`` ``flock``
fails (ENOSYS): the command then warns that it runs without the one-owner check
rather than refusing to run.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import shlex
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sweeps.errors import SpecError
from sweeps.secrets import hide_credentials
from sweeps.state import layout
from sweeps.state.atomic import write_text
from sweeps.terminal import echo_stderr, shell_word

LOCK_FILE = layout.LOCK_FILE
OWNER_FILE = layout.OWNER_FILE
MARKER_FILE = layout.MARKER_FILE
#: Files any sweeps version writes into a results folder it created (a folder holding one
#: of them without the marker is a results folder of an earlier version).
LEGACY_SIGNS = ("sweep_state.json",)
_BOOKKEEPING = frozenset({LOCK_FILE, OWNER_FILE, MARKER_FILE})
#: What sweeps itself may leave in a folder without its marker, and which command did.
_LEFT_BY_SWEEPS = {
    layout.INDUCTOR_CACHE: "a compile cache, which `sweeps try` used to keep there",
    layout.PREFLIGHT_MD: "`sweeps preflight`", layout.STABILITY_DIR: "`sweeps stability`"}
#: errno values of a file system without (working) ``flock``.
_NO_FLOCK = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL})


class FolderInUse(SpecError):
    """Another sweeps command holds the results folder (exit 2)."""


class ForeignFolder(SpecError):
    """The folder is not a sweeps results folder: nothing is renamed or written (exit 2)."""


class SharedFolder(SpecError):
    """Another user owns or can write the results folder or its root (exit 2)."""


#: Set by ``--allow-shared-folder``: a results folder others can write is used anyway.
_SHARED_ALLOWED = False


def allow_shared(allowed: bool = True) -> None:
    """Use results folders (and roots) another user owns or can write, for this process."""
    global _SHARED_ALLOWED
    _SHARED_ALLOWED = allowed


def _user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


@functools.lru_cache(maxsize=64)
def group_is_mine_alone(gid: int) -> bool:
    """Whether no other user is in group ``gid`` (a user-private group, as umask 002 uses)."""
    try:
        import grp
        import pwd

        me = _user_name(os.getuid())
        if any(member != me for member in grp.getgrgid(gid).gr_mem):
            return False
        return all(p.pw_uid == os.getuid() for p in pwd.getpwall() if p.pw_gid == gid)
    except (ImportError, KeyError):
        return False


def writable_by_others(info: os.stat_result) -> bool:
    """Whether another user may write the file or folder ``info`` describes: it is
    writable by all, or by a group with other members (a user-private group, as a
    ``umask 002`` account writes with, is this user's own)."""
    mode = info.st_mode
    return bool(mode & stat.S_IWOTH) or bool(
        mode & stat.S_IWGRP and not group_is_mine_alone(info.st_gid))


def others_can_change(path: Path, *, root: bool = False) -> str | None:
    """Why another user could change ``path`` (a folder), or None: owned by someone else
    (root aside, for a results root), writable by others, or by a group with other
    members; a sticky ``root`` may be writable by all."""
    info = path.stat()
    me, mode = os.getuid(), stat.S_IMODE(info.st_mode)
    if info.st_uid not in (me, 0 if root else me):
        return f"it belongs to {_user_name(info.st_uid)} (mode {mode:04o})"
    if root and info.st_mode & stat.S_ISVTX:
        return None
    if not writable_by_others(info):
        return None
    if mode & stat.S_IWOTH:
        return f"every user may write it (mode {mode:04o})"
    return f"its group may write it (mode {mode:04o}, group id {info.st_gid})"


def check_private(folder: Path) -> None:
    """Raise :class:`SharedFolder` when another user owns or can write ``folder`` or the
    root it lies in (see the module doc). Reads only."""
    if _SHARED_ALLOWED:
        return
    folder = Path(folder).absolute()
    for path, root in ((folder, False), (folder.parent, True)):
        if not path.is_dir():
            continue
        why = others_can_change(path, root=root)
        if why:
            what = "results root" if root else "results folder"
            raise SharedFolder(str(path), f"is a {what} another user could change: {why}; "
                               "they could replace stable/, plant a lock or forge the owner "
                               "file", "use a folder only you can write (chmod go-w, or "
                               "another --output), or pass --allow-shared-folder if you "
                               "trust every user who can write it")


@dataclass
class _Held:
    fd: int | None  # None: the file system has no flock, the folder is not locked
    depth: int
    command: str


_HELD: dict[str, _Held] = {}
_GUARD = threading.Lock()


def _key(folder: Path) -> str:
    return os.path.realpath(folder)


def _regular(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def is_results_folder(folder: Path) -> bool:
    """The folder carries the marker (or a file only sweeps writes)."""
    return _regular(folder / MARKER_FILE) or any(_regular(folder / f) for f in LEGACY_SIGNS)


def _other_fix(command: str) -> str:
    where = "another `output:` in the sweep file" + (
        " or --output PATH" if command == "run" else "")
    return where


def check_ours(folder: Path, command: str) -> None:
    """Raise :class:`ForeignFolder` when ``folder`` exists and is not a sweeps results
    folder (nor empty). Reads only."""
    folder = Path(folder)
    if not os.path.lexists(folder):
        return
    if not folder.is_dir():
        raise ForeignFolder(str(folder), "exists and is not a folder",
                            f"give {_other_fix(command)}, or move that file away yourself")
    if is_results_folder(folder):
        return
    others = sorted(p.name for p in folder.iterdir() if p.name not in _BOOKKEEPING)
    if others and all(name in _LEFT_BY_SWEEPS for name in others):
        left = "; ".join(f"{name}: {_LEFT_BY_SWEEPS[name]}" for name in others)
        raise ForeignFolder(
            str(folder), f"has no {MARKER_FILE} marker and holds only what sweeps itself "
            f"left there ({left})",
            f"mark it as a results folder: touch {shell_word(folder / MARKER_FILE)} "
            f"(or remove {', '.join(others)})")
    if others:
        shown = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
        raise ForeignFolder(
            str(folder), f"is not a sweeps results folder (it has no {MARKER_FILE} marker) and "
            f"holds other files ({shown}); sweeps neither renames nor writes into it",
            f"give {_other_fix(command)} or another `name:`, or move that folder away "
            f"yourself. If it is the results folder of an older sweeps version: touch "
            f"{shell_word(folder / MARKER_FILE)}")


def owner_text(folder: Path) -> str:
    """``sweeps run (PID 123 on host h, since 2024-01-01 12:00:00; ...)`` from the owner file,
    read only when it is this user's (another user's could name anyone)."""
    path = Path(folder) / OWNER_FILE
    try:
        uid = path.lstat().st_uid
        if uid != os.getuid() or path.is_symlink():
            return f"a sweeps command of {_user_name(uid)} (its owner file is not read)"
        info = json.loads(path.read_text())
        return (f"`sweeps {info['command']}` (PID {info['pid']} on host {info['host']}, since "
                f"{info['started']}; started as: {info['argv']})")
    except (OSError, ValueError, KeyError, TypeError):
        return "another sweeps command (its owner file is missing or unreadable)"


def in_use(folder: Path) -> str | None:
    """The owner of ``folder`` if another process holds it, else None. Creates nothing."""
    path = Path(folder) / LOCK_FILE
    if _key(Path(folder)) in _HELD:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return owner_text(Path(folder))
        return None
    finally:
        os.close(fd)
    return None


def _write_owner(folder: Path, command: str) -> None:
    """Who holds the folder, readable by this user alone."""
    write_text(folder / OWNER_FILE, json.dumps({
        "command": command, "host": socket.gethostname(), "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "argv": _argv(),
        "cwd": os.getcwd(), "user": _user()}, indent=2) + "\n", private=True)


def _argv() -> str:
    """The command line, as ``sweeps run FILE ...`` when it is the sweeps CLI, with the
    password of any URL in it (``--tracking-uri http://user:pw@host``) masked."""
    first = Path(sys.argv[0]).name if sys.argv else ""
    if first in ("sweeps", "__main__.py"):
        return hide_credentials(shlex.join(["sweeps", *sys.argv[1:]]))
    return hide_credentials(shlex.join(sys.argv))


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())


def _write_marker(folder: Path, command: str) -> None:
    if not _regular(folder / MARKER_FILE):
        write_text(folder / MARKER_FILE,
                   f"A sweeps results folder (first claimed by `sweeps {command}` on "
                   f"{time.strftime('%Y-%m-%d %H:%M:%S %z')}).\nsweeps only renames or writes "
                   "into folders that carry this file.\n")


def _lock(folder: Path, command: str, warn: Callable[[str], None]) -> int | None:
    """Take the lock of ``folder`` (created if missing) without waiting; returns its fd."""
    check_ours(folder, command)
    check_private(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(str(folder), f"cannot create the results folder "
                        f"({exc.strerror or exc})", "give a results folder you own and can "
                        "write to (--output DIR, or output: in the sweep file)") from exc
    path = folder / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        why = "it is a symlink" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        raise SpecError(str(path), f"cannot open the results folder's lock file ({why})",
                        "give a results folder you own and can write to") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            os.close(fd)
            raise FolderInUse(
                str(folder), f"in use by {owner_text(folder)}",
                f"wait for it to finish (or stop it), or give this command "
                f"{_other_fix(command)}") from None
        if exc.errno not in _NO_FLOCK:
            os.close(fd)
            raise
        os.close(fd)
        fd = None
        warn(f"warning: the file system of {folder} does not support file locks "
             f"({errno.errorcode.get(exc.errno, exc.errno)}): `sweeps {command}` runs WITHOUT "
             "the one-owner check, so do not start a second command on this folder")
    try:
        _write_marker(folder, command)
        _write_owner(folder, command)
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    return fd


@contextmanager
def claim(folder: Path, command: str, *,
          warn: Callable[[str], None] = echo_stderr) -> Iterator[Path]:
    """Hold ``folder`` for ``command`` (re-entrant within a process); raise
    :class:`FolderInUse` or :class:`ForeignFolder` at once if it cannot be had."""
    folder = Path(folder)
    key = _key(folder)
    with _GUARD:
        held = _HELD.get(key)
        if held is not None:
            held.depth += 1
        else:
            _HELD[key] = _Held(_lock(folder, command, warn), 1, command)
    try:
        yield folder
    finally:
        _release(key)


def _release(key: str) -> None:
    with _GUARD:
        held = _HELD.get(key)
        if held is None:
            return
        held.depth -= 1
        if held.depth <= 0:
            del _HELD[key]
            if held.fd is not None:
                os.close(held.fd)  # closing the only descriptor drops the flock


def holds(folder: Path) -> bool:
    """This process holds ``folder``."""
    return _key(Path(folder)) in _HELD


def move_aside(folder: Path, target: Path, command: str = "run",
               warn: Callable[[str], None] = echo_stderr) -> Path:
    """Rename the results folder ``folder`` (which this process holds) to ``target`` and
    hold a fresh, empty ``folder`` in its place. Nobody else can have ``folder`` while it
    is renamed; the lock moves with the old folder and is dropped once the new one is held."""
    key = _key(folder)
    with _GUARD:
        held = _HELD.get(key)
        if held is None:
            raise RuntimeError(f"{folder} must be claimed before it is moved aside")
        os.rename(folder, target)
        old = held.fd
        try:
            held.fd = _lock(folder, held.command or command, warn)
        except FolderInUse as exc:  # another command took the new folder in the instant
            del _HELD[key]
            if old is not None:
                os.close(old)
            raise FolderInUse(exc.key, exc.problem + f" (the previous results were moved to "
                              f"{target} first)", exc.fix) from None
        if old is not None:
            os.close(old)
    return target
