"""What a preflight check found, and where it is saved."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from sweeps.state.atomic import write_text


@dataclass(frozen=True)
class Finding:
    """One preflight result: which check, how bad, what was seen and what to do."""

    check: Literal["compile", "schedule", "inputs", "hooks"]
    level: Literal["error", "warning", "info"]
    message: str
    fix: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        text = f"[{self.level}] {self.check}: {self.message}"
        return text + (f"\n    fix: {self.fix}" if self.fix else "")


def write_findings(folder: Path, findings: list[Finding]) -> None:
    """``preflight.json`` and ``preflight.md`` in the results folder."""
    write_text(folder / "preflight.json",
               json.dumps([asdict(f) for f in findings], indent=2, default=str))
    lines = ["# Preflight", ""]
    lines += [f"- **{f.level}** `{f.check}`: {f.message}" + (f" Fix: {f.fix}" if f.fix else "")
              for f in findings] or ["- nothing to report"]
    write_text(folder / "preflight.md", "\n".join(lines) + "\n")
