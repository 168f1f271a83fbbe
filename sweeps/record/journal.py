"""Per-trial journal files, so nothing a trial reported is lost if the driver dies.

The driver appends one JSON line per event to ``trials/<trial_id>.jsonl``: a
``trial`` line when the trial is first seen (its knob values, seed, role), a
``metrics`` line per report, and an ``outcome`` line when it ends. ``sweeps
resume`` reads them back.

Every line is written whole and ends with a newline, so the only damage a killed
driver leaves is a torn *last* line (no newline): :func:`parse_lines` reports it
and :func:`drop_torn_tail` cuts it off. A line that is not an event anywhere else,
or bytes that are not UTF-8, are damage of another kind: :class:`JournalDamaged`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sweeps.errors import SpecError


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; "nan", "inf", "-inf" read back below
    return value


def _number(value: Any) -> Any:
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return value


class JournalDamaged(SpecError):
    """A journal line that is neither a complete event nor a torn last line (exit 2)."""

    def __init__(self, path: Path, line: int, why: str) -> None:
        self.path, self.line, self.why = path, line, why
        super().__init__(f"{path} line {line}", f"is damaged: {why}",
                         "restore the file from a backup; `sweeps resume` on the results "
                         "folder checks every state file and says what else can be done")


@dataclass
class Parsed:
    """The complete lines of an append-only JSON-lines file."""

    lines: list[Any]  # the decoded JSON value of every complete line, in order
    good_bytes: int  # length of the complete lines (where a torn tail starts)
    torn_bytes: int  # bytes after the last newline: a torn last line (0 if none)
    needs_newline: bool = False  # the last line is complete but lost its newline


def parse_lines(path: Path, check: Any = None) -> Parsed:
    """Read an append-only JSON-lines file. A last line without its newline that is not
    complete JSON is torn (counted, not returned); every other line must be JSON (and pass
    ``check(value)``, which returns a complaint or None), or :class:`JournalDamaged` names
    it. The file is opened without following a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read()
    body_end = data.rfind(b"\n") + 1
    tail = data[body_end:]
    lines: list[Any] = []
    raw_lines = data[:body_end].split(b"\n")[:-1] if body_end else []
    complete_tail = False
    if tail:
        value = _decode(path, len(raw_lines) + 1, tail, check, torn_ok=True)
        if value is not _TORN:  # complete but for its newline: keep it
            raw_lines.append(tail)
            body_end, tail, complete_tail = len(data), b"", True
    for number, raw in enumerate(raw_lines, start=1):
        lines.append(_decode(path, number, raw, check, torn_ok=False))
    return Parsed(lines, body_end, len(tail), complete_tail)


_TORN = object()


def _decode(path: Path, number: int, raw: bytes, check: Any, torn_ok: bool) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if torn_ok:
            return _TORN
        raise JournalDamaged(path, number, f"bytes that are not UTF-8 text (at byte "
                             f"{exc.start} of the line)") from None
    try:
        value = json.loads(text)
    except ValueError as exc:
        if torn_ok:
            return _TORN
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise JournalDamaged(path, number, f"not a complete JSON line ({exc.msg}): "
                             f"{shown!r}") from None
    problem = check(value) if check is not None else None
    if problem:
        if torn_ok:
            return _TORN
        raise JournalDamaged(path, number, problem)
    return value


def event_problem(value: Any) -> str | None:
    """Why a decoded line of a trial journal is not an event (None if it is one)."""
    if not isinstance(value, dict) or len(value) != 1:
        return "not a journal event (one {kind: {...}} object per line)"
    (kind, payload), = value.items()
    if not isinstance(payload, dict):
        return f"the {kind!r} event holds no mapping"
    if kind == "outcome" and "status" not in payload:
        return "an 'outcome' event without a status"
    return None


def drop_torn_tail(path: Path, parsed: Parsed) -> int:
    """Cut a torn last line off ``path`` (or end a complete last line that lost its
    newline with one), so the next append starts a line of its own; returns the bytes
    dropped."""
    if parsed.torn_bytes or parsed.needs_newline:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if parsed.torn_bytes:
                os.ftruncate(fd, parsed.good_bytes)
            else:
                os.lseek(fd, 0, os.SEEK_END)
                os.write(fd, b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
    return parsed.torn_bytes


class Journal:
    """Append-only JSON-lines files, one per trial, under ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._files: dict[str, IO[str]] = {}

    def write(self, trial_id: str, kind: str, payload: dict[str, Any]) -> None:
        fh = self._files.get(trial_id)
        if fh is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.folder / f"{trial_id}.jsonl",  # never through a symlink
                         os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o666)
            fh = self._files[trial_id] = os.fdopen(fd, "a", buffering=1, encoding="utf-8")
        fh.write(json.dumps({kind: {k: _plain(v) for k, v in payload.items()}},
                            default=str) + "\n")

    def close(self, trial_id: str) -> None:
        fh = self._files.pop(trial_id, None)
        if fh is not None:
            fh.close()

    def close_all(self) -> None:
        for trial_id in list(self._files):
            self.close(trial_id)

    def read(self) -> dict[str, list[tuple[str, dict[str, Any]]]]:
        """Every trial's events in order; a torn last line (driver killed mid-write) is
        skipped, any other damage raises :class:`JournalDamaged`."""
        out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        if not self.folder.is_dir():
            return out
        for path in sorted(self.folder.glob("*.jsonl")):
            out[path.stem] = _events(path)
        return out

    def read_set_aside(self, trial_id: str) -> list[tuple[str, dict[str, Any]]]:
        """The events of ``<trial_id>.jsonl.interrupted`` (a trial that was running when
        the driver died), or [] without one; a torn last line is skipped."""
        path = self.folder / f"{trial_id}.jsonl.interrupted"
        return _events(path) if path.is_file() else []

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "_files": {}}


def _events(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """A journal file's events in order (a torn last line skipped, other damage raises)."""
    events = []
    for value in parse_lines(path, event_problem).lines:
        (kind, payload), = value.items()
        events.append((kind, {k: _number(v) for k, v in payload.items()}))
    return events
