"""Which results folders ``sweeps resume`` may load Ray Tune's pickled state from.

``resume`` restores Ray Tune's experiment state, which Ray keeps as pickles
(``ray/tuner.pkl``, the searcher's state): loading one runs whatever code it names.
So a results folder is trusted like code. ``sweeps run`` seals each folder it
creates: ``.sweeps-seal`` (mode 0600) holds a random id and an HMAC, under a key only
this account can read (``~/.config/sweeps/state.key``, 0600), of that id bound to
what the seal vouches for: the folder itself (its device and inode) and the digests of
``sweep.yaml`` and ``sweep_state.json`` (which name the trainer ``resume`` and
``audit`` import, and where from). ``resume`` and ``audit`` check it before anything
in the folder is read or written, and go on only when it verifies under this
account's key for this very folder and neither the folder nor its Ray state can be
written by another user. A seal copied into another folder (a tarball sent back, a
``cp`` of the seal) does not verify there, nor after ``sweep.yaml`` was changed by
hand. ``mv`` on one file system keeps the folder's inode, so a moved folder resumes as
before; a copy is another folder: ``--trust-state`` once vouches for it (and seals it
for this account, so it resumes without the flag afterwards).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

from sweeps.errors import SpecError
from sweeps.state import layout
from sweeps.state.atomic import write_text
from sweeps.state.folder_lock import writable_by_others
from sweeps.terminal import shell_word

SEAL_FILE = layout.SEAL_FILE
#: What ``resume`` loads as code, under the results folder
#: (Ray's state in ray/ and confirm*/; the trainer that sweep.yaml and sweep_state.json name.)
PICKLED_STATE = ("ray", "confirm*", "sweep.yaml", "sweep_state.json")
#: What ``resume`` rebuilds ``stable/`` and the study from: no code, but the hand-over.
READ_BACK = (layout.TRIALS_DIR, layout.STUDY_FILE)


def key_path() -> Path:
    """This account's sealing key: ``$XDG_CONFIG_HOME/sweeps/state.key``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sweeps" / "state.key"


def _key(create: bool) -> bytes | None:
    path = key_path()
    if not path.exists() and create:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another sweep made it a moment ago
            pass
        else:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32))
    try:
        return path.read_text().strip().encode() or None
    except OSError:
        return None


#: The files whose digests the seal covers: they name the trainer and where it is imported.
SEALED_FILES = (layout.SWEEP_FILE, layout.STATE_FILE)


def _digests(folder: Path) -> dict[str, str]:
    """The sealed files' digests (``-`` for a missing one)."""
    out = {}
    for name in SEALED_FILES:
        try:
            out[name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        except FileNotFoundError:
            out[name] = "-"
    return out


def _binding(folder: Path, folder_id: str, digests: dict[str, str] | None = None) -> str:
    """What the MAC covers: the id, the folder's device and inode, the sealed files (their
    digests now, or ``digests``)."""
    info = folder.stat()
    digests = digests if digests is not None else _digests(folder)
    return "|".join([folder_id, f"{info.st_dev}:{info.st_ino}",
                     *(digests.get(name, "-") for name in SEALED_FILES)])


def edited_files(folder: Path) -> list[str]:
    """The sealed files changed since the seal, when the seal is otherwise this account's
    for this folder (it verifies over the digests it recorded); else []."""
    key = _key(create=False)
    try:
        data = json.loads((folder / SEAL_FILE).read_text())
        recorded = {str(k): str(v) for k, v in dict(data["files"]).items()}
        valid = key is not None and hmac.compare_digest(
            _mac(key, _binding(folder, str(data["id"]), recorded)), str(data["mac"]))
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if not valid:
        return []
    now = _digests(folder)
    return [name for name in SEALED_FILES if recorded.get(name) != now[name]]


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def seal(folder: Path) -> str | None:
    """Mark ``folder`` as written by sweeps under this account (see the module doc).

    Call it again whenever sweeps rewrites a sealed file. Returns why it could not (a home
    folder that cannot be written, say): the sweep runs all the same, and ``resume`` of the
    folder then needs ``--trust-state``."""
    try:
        key = _key(create=True)
    except OSError as exc:
        key, why = None, f"{key_path()}: {exc.strerror or exc}"
    else:
        why = f"{key_path()} is unreadable or empty"
    if key is None:
        return why
    folder_id, digests = secrets.token_hex(16), _digests(folder)
    write_text(folder / SEAL_FILE, json.dumps(
        {"id": folder_id, "mac": _mac(key, _binding(folder, folder_id, digests)),
         "files": digests}), private=True)
    return None


def _sealed_here(folder: Path) -> bool:
    key = _key(create=False)
    try:
        path = folder / SEAL_FILE
        if path.is_symlink():
            return False
        data = json.loads(path.read_text())
        return key is not None and hmac.compare_digest(
            _mac(key, _binding(folder, str(data["id"]))), str(data["mac"]))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _open_to_others(folder: Path) -> Path | None:
    """The first path of the state (or the folder) another user owns or could write, if
    any (group-writable is fine when the group is this user's alone, as ``umask 002``
    accounts write: :func:`sweeps.state.folder_lock.writable_by_others`)."""
    me = os.getuid()
    paths = [folder]
    for pattern in (*PICKLED_STATE, *READ_BACK):
        for top in folder.glob(pattern):
            paths += [top, *top.rglob("*")] if top.is_dir() else [top]
    for path in paths:
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        if info.st_uid != me or writable_by_others(info):
            return path
    return None


def check(folder: Path, trust: bool = False, command: str = "resume") -> None:
    """Refuse (exit 2) to load the pickled state of a folder this account's sweeps did not
    write, or that another user could have changed; ``trust`` skips the check. Reads
    only: call it before anything in the folder is written."""
    if trust:
        return
    fix = (f"{command} only results folders your own sweeps wrote; if you trust this one as "
           f"you would its code, run `sweeps {command} {shell_word(folder)} --trust-state`")
    sealed = _sealed_here(folder)
    edited = [] if sealed else edited_files(folder)
    if edited:
        raise SpecError("DIR", f"{', '.join(edited)} in {folder} changed since the sweep ran; "
                        f"{command} runs the sweep as it was saved (a search space edited "
                        "there or in your sweep file is not applied to a sweep under way)",
                        f"put it back as it was for `sweeps {command}`, or run a new sweep "
                        f"seeded from this one: sweeps run FILE --warm-start {shell_word(folder)}")
    if not sealed:
        raise SpecError("DIR", f"{folder} was not written by sweeps under this account, or "
                        f"not in this folder (no {SEAL_FILE} that verifies here: a seal binds "
                        "to its folder and to sweep.yaml); "
                        f"{command} loads code from it (Ray Tune's pickled state, the trainer "
                        "its sweep.yaml names)", fix)
    other = _open_to_others(folder)
    if other is not None:
        raise SpecError("DIR", f"{other} is not yours alone (another user owns it or may "
                        f"write it); {command} loads code from the folder and hands "
                        "over what its journals say",
                        "make it yours (chown, chmod go-w) and resume again, or " + fix[0].lower()
                        + fix[1:])
