"""Which results folders ``sweeps resume`` may load Ray Tune's pickled state from.

``resume`` restores Ray Tune's experiment state, which Ray keeps as pickles
(``ray/tuner.pkl``, the searcher's state): loading one runs whatever code it names.
So a results folder is trusted like code. ``sweeps run`` seals each folder it
creates: ``.sweeps-seal`` (mode 0600) holds a random id and its HMAC under a key
only this account can read (``~/.config/sweeps/state.key``, 0600). ``resume`` loads
the state only when the seal verifies under this account's key and neither the
folder nor its Ray state can be written by another user; a folder someone handed
you, or one another user could have changed, exits 2 unless you pass
``--trust-state``. A seal moves with ``mv`` and ``cp -a``, so a moved or copied
folder of your own resumes as before.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path

from sweeps.errors import SpecError
from sweeps.state.atomic import write_text

SEAL_FILE = ".sweeps-seal"
#: What ``resume`` loads as code, under the results folder
#: (Ray's state in ray/ and confirm*/; the trainer that sweep.yaml and sweep_state.json name.)
PICKLED_STATE = ("ray", "confirm*", "sweep.yaml", "sweep_state.json")


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


def _mac(key: bytes, folder_id: str) -> str:
    return hmac.new(key, folder_id.encode(), hashlib.sha256).hexdigest()


def seal(folder: Path) -> str | None:
    """Mark ``folder`` as written by sweeps under this account (see the module doc).

    Returns why it could not (a home folder that cannot be written, say): the sweep runs
    all the same, and ``resume`` of the folder then needs ``--trust-state``."""
    try:
        key = _key(create=True)
    except OSError as exc:
        key, why = None, f"{key_path()}: {exc.strerror or exc}"
    else:
        why = f"{key_path()} is unreadable or empty"
    if key is None:
        return why
    folder_id = secrets.token_hex(16)
    write_text(folder / SEAL_FILE, json.dumps({"id": folder_id, "mac": _mac(key, folder_id)}))
    os.chmod(folder / SEAL_FILE, 0o600)
    return None


def _sealed_here(folder: Path) -> bool:
    key = _key(create=False)
    try:
        data = json.loads((folder / SEAL_FILE).read_text())
        return key is not None and hmac.compare_digest(_mac(key, str(data["id"])),
                                                       str(data["mac"]))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _open_to_others(folder: Path) -> Path | None:
    """The first path of the state (or the folder) another user could write, if any."""
    me = os.getuid()
    paths = [folder]
    for pattern in PICKLED_STATE:
        for top in folder.glob(pattern):
            paths += [top, *top.rglob("*")] if top.is_dir() else [top]
    for path in paths:
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        if info.st_uid != me or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return path
    return None


def check(folder: Path, trust: bool = False) -> None:
    """Refuse (exit 2) to load the pickled state of a folder this account's sweeps did not
    write, or that another user could have changed; ``trust`` skips the check."""
    if trust:
        return
    fix = ("resume only results folders your own sweeps wrote; if you trust this one as you "
           f"would its code, run `sweeps resume {folder} --trust-state`")
    if not _sealed_here(folder):
        raise SpecError("DIR", f"{folder} was not written by sweeps under this account (no "
                        f"valid {SEAL_FILE}); resume loads Ray Tune's pickled state from it, "
                        "which runs code", fix)
    other = _open_to_others(folder)
    if other is not None:
        raise SpecError("DIR", f"{other} is not yours alone (another user owns it or may "
                        "write it); resume loads Ray Tune's pickled state, which runs code",
                        "make it yours (chown, chmod go-w) and resume again, or " + fix[0].lower()
                        + fix[1:])
