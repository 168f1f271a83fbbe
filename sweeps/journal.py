"""Per-trial journal files, so nothing a trial reported is lost if the driver dies.

The driver appends one JSON line per event to ``trials/<trial_id>.jsonl``: a
``trial`` line when the trial is first seen (its knob values, seed, role), a
``metrics`` line per report, and an ``outcome`` line when it ends. ``sweeps
resume`` reads them back.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import IO, Any


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; "nan", "inf", "-inf" read back below
    return value


def _number(value: Any) -> Any:
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return value


class Journal:
    """Append-only JSON-lines files, one per trial, under ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._files: dict[str, IO[str]] = {}

    def write(self, trial_id: str, kind: str, payload: dict[str, Any]) -> None:
        fh = self._files.get(trial_id)
        if fh is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            fh = self._files[trial_id] = open(  # noqa: SIM115 - kept open while the trial runs
                self.folder / f"{trial_id}.jsonl", "a", buffering=1)
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
        """Every trial's events in order; a torn last line (driver killed mid-write) is skipped."""
        out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        if not self.folder.is_dir():
            return out
        for path in sorted(self.folder.glob("*.jsonl")):
            events = []
            for line in path.read_text().splitlines():
                try:
                    (kind, payload), = json.loads(line).items()
                except (ValueError, AttributeError):
                    continue
                events.append((kind, {k: _number(v) for k, v in payload.items()}))
            out[path.stem] = events
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "_files": {}}
